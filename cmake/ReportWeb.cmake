# The charting libraries that results/plot inlines into report.html (Vega-Lite with vega-embed):
# `npm ci` in results/web, at the versions its package-lock.json pins, into results/web/node_modules
# (git-ignored), where results/plot looks beside itself; again only when package.json or the lock
# file changes. npm needs the npm registry: a build without it (a cluster offline) sets
# -DSTRATA_REPORT_CHARTS=OFF, and results/plot then writes report.html with its static figures,
# saying so in one line. scripts/install-deps.sh installs npm; make install ships the three
# minified files under the same relative paths, so the installed results/plot finds them too.
set(STRATA_WEB_DIR "${PROJECT_SOURCE_DIR}/results/web")
set(STRATA_WEB_MODULES "${STRATA_WEB_DIR}/node_modules")
# results/plot's WEB_SCRIPTS, each with its package's licence
set(STRATA_WEB_PACKAGES vega vega-lite vega-embed)
find_program(STRATA_NPM npm)
if(STRATA_NPM)
  set(_charts_default ON)
else()
  set(_charts_default OFF)
endif()
option(STRATA_REPORT_CHARTS "npm ci the charting libraries of report.html (results/web)"
       ${_charts_default})
if(STRATA_REPORT_CHARTS)
  if(NOT STRATA_NPM)
    message(FATAL_ERROR "STRATA_REPORT_CHARTS needs npm: scripts/install-deps.sh installs it")
  endif()
  set(_stamp "${STRATA_WEB_MODULES}/.strata-npm-ci")
  add_custom_command(OUTPUT "${_stamp}"
    COMMAND "${STRATA_NPM}" ci --no-audit --no-fund --loglevel=error
    COMMAND "${CMAKE_COMMAND}" -E touch "${_stamp}"
    DEPENDS "${STRATA_WEB_DIR}/package.json" "${STRATA_WEB_DIR}/package-lock.json"
    WORKING_DIRECTORY "${STRATA_WEB_DIR}"
    COMMENT "npm ci in results/web: the charting libraries of report.html" VERBATIM)
  add_custom_target(report_charts ALL DEPENDS "${_stamp}")
  foreach(package ${STRATA_WEB_PACKAGES})
    set(_dir "${CMAKE_INSTALL_DATADIR}/strata/results/web/node_modules/${package}")
    install(FILES "${STRATA_WEB_MODULES}/${package}/build/${package}.min.js"
            DESTINATION "${_dir}/build")
    install(FILES "${STRATA_WEB_MODULES}/${package}/LICENSE" DESTINATION "${_dir}")
  endforeach()
else()
  message(STATUS "strata: report.html without interactive charts (STRATA_REPORT_CHARTS=OFF: "
                 "no npm, or turned off)")
endif()
