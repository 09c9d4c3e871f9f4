# strata_add_plugin(<name> SOURCES <files...> [LIBS <libraries...>] [OUTPUT_DIRECTORY <dir>]
#                   [INSTALL_DESTINATION <dir> | NO_INSTALL])
# One strategy plugin, in the strata tree and out of it alike (find_package(strata) includes this
# file from the installed package): a MODULE library libstrata_<name>.so linked against the SDK
# (strata::sdk, and LIBS such as strata::engines). It carries the rules the runner's loader and the
# plugin ABI rely on, so a plugin author does not have to know them:
#   - MODULE, prefix "lib", suffix ".so": the loader opens only lib*.so files of a plugin directory;
#   - C++20 without extensions (the SDK headers' language; strata::sdk also requires it);
#   - hidden visibility but for the entry points STRATA_PLUGIN exports (Boost.DLL aliases carry
#     default visibility): two plugins loaded into one runner can never bind to each other's
#     internals, and the loader sees only what the ABI names;
#   - the Boost headers plugin.hpp includes (Boost.DLL), through strata::sdk;
#   - every symbol resolved at link time (--no-undefined) from the SDK and LIBS.
# OUTPUT_DIRECTORY: where the library is built (in the strata tree: the build tree's plugin
# directory; elsewhere CMAKE_LIBRARY_OUTPUT_DIRECTORY, else the current binary directory: pass it
# to `runner --plugin-path`). INSTALL_DESTINATION: default strata's plugin directory relative to its
# prefix (STRATA_PLUGIN_RELDIR, lib/strata/plugins), which an installed runner of the same prefix
# reads with no flags.
include_guard(GLOBAL)
include(GNUInstallDirs)

function(strata_add_plugin name)
  cmake_parse_arguments(ARG "NO_INSTALL" "OUTPUT_DIRECTORY;INSTALL_DESTINATION" "SOURCES;LIBS"
                        ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "strata_add_plugin(${name}): SOURCES is required (the plugin's .cpp files)")
  endif()
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "strata_add_plugin(${name}): unknown arguments '${ARG_UNPARSED_ARGUMENTS}' "
                        "(allowed: SOURCES, LIBS, OUTPUT_DIRECTORY, INSTALL_DESTINATION, NO_INSTALL)")
  endif()
  if(NOT ARG_OUTPUT_DIRECTORY)
    if(STRATA_PLUGIN_OUTPUT_DIR)  # the strata tree (top-level CMakeLists.txt)
      set(ARG_OUTPUT_DIRECTORY "${STRATA_PLUGIN_OUTPUT_DIR}")
    elseif(CMAKE_LIBRARY_OUTPUT_DIRECTORY)
      set(ARG_OUTPUT_DIRECTORY "${CMAKE_LIBRARY_OUTPUT_DIRECTORY}")
    else()
      set(ARG_OUTPUT_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}")
    endif()
  endif()
  if(NOT ARG_INSTALL_DESTINATION)
    if(STRATA_PLUGIN_RELDIR)  # strata's own layout (the tree, or strataConfig.cmake)
      set(ARG_INSTALL_DESTINATION "${STRATA_PLUGIN_RELDIR}")
    else()
      set(ARG_INSTALL_DESTINATION "${CMAKE_INSTALL_LIBDIR}/strata/plugins")
    endif()
  endif()
  set(target strata_${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  set_property(GLOBAL APPEND PROPERTY STRATA_PLUGIN_TARGETS ${target})
  target_link_libraries(${target} PRIVATE strata::sdk ${ARG_LIBS})
  # Every symbol resolved at link time, from the SDK and LIBS alone: a plugin that needs anything
  # else (the runner's own code is in no library a plugin links) fails its build, not its loading.
  target_link_options(${target} PRIVATE -Wl,--no-undefined)
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    SUFFIX ".so"
    CXX_STANDARD 20
    CXX_STANDARD_REQUIRED ON
    CXX_EXTENSIONS OFF
    LIBRARY_OUTPUT_DIRECTORY "${ARG_OUTPUT_DIRECTORY}"
    INSTALL_RPATH "$ORIGIN/../.."  # <libdir>/strata/plugins -> <libdir>, where the SDK lives
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(NOT ARG_NO_INSTALL)
    install(TARGETS ${target} LIBRARY DESTINATION "${ARG_INSTALL_DESTINATION}")
  endif()
endfunction()
