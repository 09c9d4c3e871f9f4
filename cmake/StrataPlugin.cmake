# strata_add_plugin(<family> SOURCES <files...> [LIBS <libraries...>])
# Builds one strategy plugin: a MODULE library named strata_<family> in the plugin directory, linked
# against the SDK (strata::core, and LIBS such as strata::engines), installed next to the other
# plugins. Symbols are hidden but for the entry points STRATA_PLUGIN exports (Boost.DLL aliases
# carry default visibility): two plugins loaded into one runner can never bind to each other's
# internals, and the loader sees only what the ABI names.
function(strata_add_plugin family)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  set(target strata_${family})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE strata::core ${ARG_LIBS})
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    LIBRARY_OUTPUT_DIRECTORY "${STRATA_PLUGIN_OUTPUT_DIR}"
    INSTALL_RPATH "$ORIGIN/../.."
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  install(TARGETS ${target} LIBRARY DESTINATION "${STRATA_PLUGIN_RELDIR}")
endfunction()
