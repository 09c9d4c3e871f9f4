# STRATA_BUILD_FUZZ: the libFuzzer targets of tests/fuzz (fuzz_config, fuzz_run_file). libFuzzer
# comes with clang, so this needs CC=clang CXX=clang++ (clang's runtime: libclang-rt-14-dev on
# Debian). Every target of the build is compiled with coverage instrumentation for the fuzzer and
# with ASan + UBSan (any UBSan finding is fatal, so the fuzzer sees it as a crash); only the fuzz
# targets link libFuzzer's main. `make fuzz` configures build-fuzz with it and runs tests/fuzz/run.sh.
option(STRATA_BUILD_FUZZ "Build the libFuzzer targets of tests/fuzz (clang only)" OFF)
if(STRATA_BUILD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang" OR NOT CMAKE_C_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "STRATA_BUILD_FUZZ needs clang (libFuzzer): configure with "
                        "-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ (or `make fuzz`)")
  endif()
  if(STRATA_WITH_CUDA)
    message(FATAL_ERROR "STRATA_BUILD_FUZZ needs STRATA_WITH_CUDA=OFF (host code only)")
  endif()
  # clang before 15 has no __builtin_source_location, so libstdc++'s std::source_location (used by
  # the UCX transport) does not compile: such a fuzz build leaves UCX out. The fuzz targets need no
  # transport; the parser then refuses --transport ucx like any build without UCX.
  if(STRATA_WITH_UCX AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 15)
    message(STATUS "strata: fuzz build with clang ${CMAKE_CXX_COMPILER_VERSION}: UCX transport off")
    set(STRATA_WITH_UCX OFF CACHE BOOL "Build the UCX transport" FORCE)
  endif()
  # Frame pointers: whole stacks in the reports, also through the HDF5/Boost frames we call into.
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
                      -fno-omit-frame-pointer
                      -Wno-pass-failed)  # "loop not vectorized" under instrumentation
  add_link_options(-fsanitize=address,undefined)
endif()
