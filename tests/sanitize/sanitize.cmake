# Sanitizer builds (STRATA_SANITIZE, see cmake/Sanitize.cmake), included at the end of
# tests/CMakeLists.txt once every test exists. It gives every test the sanitizer's runtime options
# and the suppressions of this directory, scales the time limits, and labels `sanitize` the tests
# this build runs (`make sanitize` / `make tsan`: ctest -L sanitize).
#
# A finding fails its test: ASan and TSan stop at the first report with exit code 1 (halt_on_error),
# UBSan through -fno-sanitize-recover. The suppression files cover only libraries that are not built
# with sanitizers (Open MPI, PMIx, libevent, UCX); strata's own code is never suppressed.
set(SANITIZE_DIR ${CMAKE_CURRENT_SOURCE_DIR}/sanitize)
# UCX (ours and Open MPI's pml_ucx) can patch malloc/mmap to keep its memory registration cache
# right, and ASan/TSan replace the same functions: UCX's documented switches turn its memory
# events, malloc hooks and mmap hooks off. They matter where UCX registers memory (RDMA
# transports); on this host's transports (shared memory, tcp, cma) it installs no hook at all
# (UCX_LOG_LEVEL=debug reports none).
set(SANITIZE_ENV UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none)
if(STRATA_SANITIZE MATCHES "address")
  # fast_unwind_on_malloc=0: Open MPI, UCX and OpenBLAS are built without frame pointers; only the
  #   slow unwinder gives whole allocation stacks, which the leak suppressions match against.
  # intercept_tls_get_addr=0: GCC 12's LeakSanitizer misreads a dynamic TLS block that glibc
  #   malloc()ed at a page offset of 16 as glibc 2.19's header layout and its leak check crashes
  #   ("Tracer caught signal 11", "DTLS 15 at 0x3f56-0x400005058", seen on a dlopen()ed Open MPI
  #   module in e2e.run.interleaved.tp2.pp2). Off, dynamic TLS is not a root of the leak check:
  #   nothing of strata's lives there (its thread_locals are in libstrata_core's static TLS).
  list(APPEND SANITIZE_ENV
       "ASAN_OPTIONS=fast_unwind_on_malloc=0:intercept_tls_get_addr=0:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"
       "LSAN_OPTIONS=suppressions=${SANITIZE_DIR}/lsan.supp:print_suppressions=0")
  set(timeout_scale 3)
  # Which tests (about 4 minutes on 2 cores): every unit and CLI test but the UCX collectives on 4
  # and 5 ranks (np2 and np3 already take the power-of-two and the folding paths; np4/np5
  # oversubscribe 2 cores for a minute), and these e2e runs with every check that needs only them: each strategy
  # family at 2 and 4 ranks, the pipelines with tp and --trace, the failure paths (throw, oom,
  # watchdog), a token file, calibration, and UCX under two strategies.
  set(sanitize_unit_skip ucx.collectives.np4 ucx.collectives.np5)
  set(sanitize_fixtures
      run.reference run.reference.l8
      run.dp.np2 run.dp.np4 run.ddp.np2 run.ddp.np4
      run.zero2.np2 run.zero3.np4 run.fsdp.np2 run.fsdp-hybrid.np4
      run.tp.sp.np2 run.tp.dp2.np4
      run.1f1b.pp2 run.gpipe.pp4 run.interleaved.tp2.pp2
      fail.throw fail.oom fail.hang
      tokens run.ddp.data.np2 run.ddp.calibrate.np4
      run.ddp.np4.ucx run.zero3.np4.ucx)
endif()
if(STRATA_SANITIZE MATCHES "undefined")
  list(APPEND SANITIZE_ENV "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
endif()
if(STRATA_SANITIZE MATCHES "thread")
  list(APPEND SANITIZE_ENV
       "TSAN_OPTIONS=suppressions=${SANITIZE_DIR}/tsan.supp:halt_on_error=1:second_deadlock_stack=1")
  set(timeout_scale 5)
  # The threads: comm streams and the ledger (test_comm), the UCX transport's worker shared by
  # threads (2 and 3 ranks), and short e2e runs whose collectives run on comm streams (ddp's
  # buckets, zero3's prefetched gathers) over MPI and UCX.
  set(sanitize_unit_executables test_comm)
  set(sanitize_unit_tests ucx.collectives.np2 ucx.collectives.np3)
  set(sanitize_fixtures run.reference run.ddp.np4 run.zero3.np2 run.zero3.np4 run.zero3.np4.ucx)
endif()

# Tests added with add_test (all but GoogleTest's): environment, time limit, label.
get_property(tests DIRECTORY PROPERTY TESTS)
foreach(t ${tests})
  set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT ${SANITIZE_ENV})
  get_property(timeout TEST ${t} PROPERTY TIMEOUT)
  if(timeout)
    math(EXPR timeout "${timeout} * ${timeout_scale}")
    set_property(TEST ${t} PROPERTY TIMEOUT ${timeout})
  endif()
  get_property(labels TEST ${t} PROPERTY LABELS)
  get_property(setup TEST ${t} PROPERTY FIXTURES_SETUP)
  get_property(required TEST ${t} PROPERTY FIXTURES_REQUIRED)
  set(chosen FALSE)
  if(DEFINED sanitize_unit_tests)
    if(t IN_LIST sanitize_unit_tests)
      set(chosen TRUE)
    endif()
  elseif(("unit" IN_LIST labels OR "cli" IN_LIST labels) AND NOT t IN_LIST sanitize_unit_skip)
    set(chosen TRUE)
  endif()
  # An e2e test is chosen when every run it sets up or needs is.
  if("e2e" IN_LIST labels AND (setup OR required))
    set(chosen TRUE)
    foreach(f ${setup} ${required})
      if(NOT f IN_LIST sanitize_fixtures)
        set(chosen FALSE)
      endif()
    endforeach()
  endif()
  if(chosen)
    set_property(TEST ${t} APPEND PROPERTY LABELS sanitize)
  endif()
endforeach()

# GoogleTest's tests exist only once ctest has read the lists gtest_discover_tests wrote
# (<executable>_TESTS, in the TEST_INCLUDE_FILES before this one): a script ctest reads after them
# gives them the same environment and label.
if(NOT DEFINED sanitize_unit_executables)
  set(sanitize_unit_executables ${UNIT_TEST_EXECUTABLES})
endif()
set(lists)
foreach(e ${UNIT_TEST_EXECUTABLES})
  string(APPEND lists " ${e}_TESTS")
endforeach()
set(chosen_lists)
foreach(e ${sanitize_unit_executables})
  string(APPEND chosen_lists " ${e}_TESTS")
endforeach()
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/sanitize_tests.cmake
     "foreach(t IN LISTS${lists})\n"
     "  set_tests_properties(\"\${t}\" PROPERTIES ENVIRONMENT \"${SANITIZE_ENV}\")\n"
     "endforeach()\n"
     "foreach(t IN LISTS${chosen_lists})\n"
     "  set_tests_properties(\"\${t}\" PROPERTIES LABELS \"unit;sanitize\")\n"
     "endforeach()\n")
set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${CMAKE_CURRENT_BINARY_DIR}/sanitize_tests.cmake)
