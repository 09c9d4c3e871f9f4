# strata_add_plugin(<family> SOURCES <files...>)
# Builds one strategy plugin: a MODULE library named strata_<family> in the plugin directory, linked
# against the SDK (strata::core), installed next to the other plugins.
function(strata_add_plugin family)
  cmake_parse_arguments(ARG "" "" "SOURCES" ${ARGN})
  set(target strata_${family})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE strata::core)
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    LIBRARY_OUTPUT_DIRECTORY "${STRATA_PLUGIN_OUTPUT_DIR}"
    INSTALL_RPATH "$ORIGIN/../..")
  install(TARGETS ${target} LIBRARY DESTINATION "${STRATA_PLUGIN_RELDIR}")
endfunction()
