# What `cmake --install` and `make package` ship beyond the binaries: the CMake package (exported
# targets strata::sdk and strata::engines, strataConfig.cmake with strata_add_plugin()), strata.pc,
# the archive tools (results/) and the Slurm scripts (slurm/), and the Debian package (CPack DEB).
# Every installed path is relative to the install prefix, so an unpacked package works from any root.
include(CMakePackageConfigHelpers)

# The plugin ABI version the SDK headers declare, for the package's users (strataConfig, strata.pc).
file(STRINGS "${PROJECT_SOURCE_DIR}/core/include/strata/plugin.hpp" _abi_line
     REGEX "kPluginAbiVersion = [0-9]+;")
string(REGEX REPLACE ".*kPluginAbiVersion = ([0-9]+);.*" "\\1" STRATA_PLUGIN_ABI "${_abi_line}")

set(STRATA_CMAKE_INSTALL_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/strata")
install(EXPORT strataTargets NAMESPACE strata:: DESTINATION "${STRATA_CMAKE_INSTALL_DIR}"
        FILE strataTargets.cmake)
configure_package_config_file(cmake/strataConfig.cmake.in
  "${CMAKE_BINARY_DIR}/package/strataConfig.cmake"
  INSTALL_DESTINATION "${STRATA_CMAKE_INSTALL_DIR}"
  PATH_VARS CMAKE_INSTALL_BINDIR STRATA_PLUGIN_RELDIR)
# Before 1.0 a minor release may change the SDK's ABI (as the SONAME says, STRATA_SOVERSION): a
# plugin built for 0.1 asks for 0.1.x.
write_basic_package_version_file("${CMAKE_BINARY_DIR}/package/strataConfigVersion.cmake"
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_BINARY_DIR}/package/strataConfig.cmake"
              "${CMAKE_BINARY_DIR}/package/strataConfigVersion.cmake"
              "${PROJECT_SOURCE_DIR}/cmake/StrataPlugin.cmake"
        DESTINATION "${STRATA_CMAKE_INSTALL_DIR}")

set(_pc_dir "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
file(RELATIVE_PATH STRATA_PC_PREFIX_FROM_PCDIR "/root/${_pc_dir}" "/root")
configure_file(cmake/strata.pc.in "${CMAKE_BINARY_DIR}/package/strata.pc" @ONLY)
install(FILES "${CMAKE_BINARY_DIR}/package/strata.pc" DESTINATION "${_pc_dir}")

# The archive tools and the Slurm scripts, in <prefix>/share/strata/{results,slurm}: scale.sbatch
# finds results/ beside its own directory, as in a checkout. Of results/ only its own files: the
# tools, their Python modules and web/ (package.json, its lock, report.js); its other directories
# are studies (make run writes results/local), which a package must not ship. Of
# results/web/node_modules only the charting libraries report.html inlines (cmake/ReportWeb.cmake).
install(DIRECTORY slurm DESTINATION "${CMAKE_INSTALL_DATADIR}/strata" USE_SOURCE_PERMISSIONS
        PATTERN "__pycache__" EXCLUDE PATTERN "*.pyc" EXCLUDE)
file(GLOB _results_tools LIST_DIRECTORIES false CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/results/*")
list(FILTER _results_tools EXCLUDE REGEX "[.](sqlite.*|tmp|pyc)$")
set(_results_modules ${_results_tools})
list(FILTER _results_modules INCLUDE REGEX "[.]py$")
list(FILTER _results_tools EXCLUDE REGEX "[.]py$")
install(PROGRAMS ${_results_tools} DESTINATION "${CMAKE_INSTALL_DATADIR}/strata/results")
install(FILES ${_results_modules} DESTINATION "${CMAKE_INSTALL_DATADIR}/strata/results")
install(DIRECTORY results/web DESTINATION "${CMAKE_INSTALL_DATADIR}/strata/results"
        PATTERN "node_modules" EXCLUDE)

# `make package` (cpack -G DEB in the build directory): strata_<version>_<arch>.deb, installing
# under /usr. Depends: what dpkg-shlibdeps derives from the libraries the binaries link, nothing
# else (tests/package checks both ways). What only the scripts and plugin builds use is
# recommended or suggested.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME strata)
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "benchmark harness for distributed-training parallelism strategies (runner, plugins, SDK)")
set(CPACK_PACKAGE_CONTACT "strata maintainers <strata@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS
    "openmpi-bin, python3-h5py, python3-numpy, python3-matplotlib")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS
    "libboost-dev, cmake, g++, pkgconf, slurm-client, slurmctld, slurmd, munge")
include(CPack)
