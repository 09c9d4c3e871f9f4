# Sanitizer builds (STRATA_SANITIZE, see cmake/Sanitize.cmake). Included at the top of
# tests/CMakeLists.txt; strata_sanitize_tests() runs at its end, once every test exists. Every test
# gets the sanitizer's runtime options and the suppressions of this directory, longer time limits,
# and the label `sanitize` when this build runs it (`make sanitize` / `make tsan`: ctest -L sanitize).
#
# A finding fails its test: ASan and TSan end the process at the first report (halt_on_error), UBSan
# through -fno-sanitize-recover, and the report's text fails the test too (SANITIZE_REPORT). The suppression files cover only libraries that are not built
# with sanitizers (Open MPI, libevent, UCX); strata's own code is never suppressed.
if(NOT STRATA_SANITIZE)
  return()
endif()
set(SANITIZE_DIR ${CMAKE_CURRENT_LIST_DIR})

# UCX's switches that every process of a sanitizer build needs (cmake/Sanitize.cmake), then the
# sanitizer's runtime options.
set(SANITIZE_ENV ${STRATA_SANITIZE_RUN_ENV})
if(STRATA_SANITIZE MATCHES "address")
  # Allocation stacks from frame pointers (fast_unwind_on_malloc=1, ASan's default): the slow
  #   unwinder (=0) made the set about twice as long (the advisor's 175B search in cli.advise:
  #   121-127 s against 16-25 s). Open MPI and PMIx have no frame pointers, so their stacks end at
  #   the allocating component, which libkeep_modules.so keeps mapped so that lsan.supp can match
  #   its module (see both files). verify_asan_link_order=0: the preloaded library comes before
  #   ASan's runtime in the list of libraries (it intercepts nothing ASan does).
  add_library(sanitize_keep_modules SHARED ${SANITIZE_DIR}/keep_modules.cpp)
  set_target_properties(sanitize_keep_modules PROPERTIES COMPILE_OPTIONS "" LINK_OPTIONS ""
                        OUTPUT_NAME keep_modules
                        LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/sanitize)
  set(SANITIZE_PRELOAD ${CMAKE_BINARY_DIR}/sanitize/libkeep_modules.so)
  # intercept_tls_get_addr=0: GCC 12's LeakSanitizer misreads a dynamic TLS block that glibc
  #   malloc()ed at a page offset of 16 as glibc 2.19's header layout and its leak check crashes
  #   ("Tracer caught signal 11", "DTLS 15 at 0x3f56-0x400005058": the block of an Open MPI or UCX
  #   module loaded with dlopen, in e2e.run.interleaved.tp2.pp2). Off, dynamic TLS is not a root of the leak check:
  #   nothing of strata's lives there (its thread_locals are in libstrata_core's static TLS).
  list(APPEND SANITIZE_ENV
       "LD_PRELOAD=${SANITIZE_PRELOAD}"
       "ASAN_OPTIONS=verify_asan_link_order=0:intercept_tls_get_addr=0:allocator_may_return_null=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"
       "LSAN_OPTIONS=suppressions=${SANITIZE_DIR}/lsan.supp:print_suppressions=0")
  # OPENBLAS_THREAD_TIMEOUT=4 (2^4 cycles, OpenBLAS's least; 2^28 by default): an idle BLAS
  #   thread sleeps at once instead of spinning on sched_yield for about 0.1 s. Every strata
  #   process loads OpenBLAS, which starts its threads at load; an ASan process lives long enough
  #   to spin the whole 0.1 s, on the core the other test of `ctest -j 2` needs (a one-test ASan
  #   process: 330 -> 190 ms of CPU). The threads stay, so the threaded BLAS paths still run.
  list(APPEND SANITIZE_ENV OPENBLAS_THREAD_TIMEOUT=4)
  set(SANITIZE_TIMEOUT_SCALE 3)
  # Which tests (391, 502 s on 2 cores on 2026-11-28): every unit and CLI test but the UCX and gloo
  # collectives on 4 and 5 ranks, and these e2e runs with every check that needs only them: each
  # strategy family at 2 and 4 ranks, the pipelines with tp and --trace, the failure paths (throw,
  # oom, watchdog), a token file, calibration, and UCX under two strategies. The collectives' np2
  # and np3 already take strata's paths: UCX's power-of-two and folding algorithms; for gloo, whose
  # rings are its own library's (not instrumented), a world of odd size and the split groups' sizes
  # 1 and 2 (a group of one messages itself). np4 and np5 oversubscribe 2 cores for a minute each
  # (gloo's 48 s of the set's 620 in the CI of 2026-12-07) and stay in the main set.
  set(SANITIZE_UNIT_SKIP ucx.collectives.np4 ucx.collectives.np5 gloo.collectives.np4
                         gloo.collectives.np5)
  # Nor the runner started once per invalid value of every option (420 starts, 82 s under ASan
  # and 23 s in Release on 2026-12-07): the same values go through the parser under ASan in
  # process (Options.CommandLineRefusesEveryInvalidValue and the config file and environment
  # cases), fuzz_config drives it with any text, and cli.bad_input takes the runner's exit on bad
  # input under ASan.
  set(SANITIZE_ALSO_NEVER "|^Options[.]RunnerExitsTwoWithOneLineAndNoFile$")
  # And the runner's own relaunch ended by a signal (about 3 s each): its supervisor passing the
  # signal on, then ending mpirun on the job-end note and removing the job's folder.
  set(SANITIZE_ALSO_TESTS faults.sigint-relaunch faults.sigpipe-relaunch)
  set(SANITIZE_FIXTURES
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
       "TSAN_OPTIONS=suppressions=${SANITIZE_DIR}/tsan.supp:halt_on_error=1:second_deadlock_stack=1:allocator_may_return_null=1")
  set(SANITIZE_TIMEOUT_SCALE 5)
  # The threads: comm streams and the ledger (test_comm), the UCX transport's worker shared by
  # threads (2 and 3 ranks), and short e2e runs whose collectives run on comm streams: ddp's
  # buckets, zero3's prefetched gathers over MPI and UCX, gpipe's sends with --trace, and the
  # failure runs (the watchdog thread beside a run that throws, runs out of memory or hangs).
  # The CUDA emulator's block runner (every CUDA thread a host thread: its only mode under TSan)
  # with the kernels whose threads share memory through barriers: LayerNorm backward (dynamic
  # shared memory), softmax + cross-entropy (block reductions in static shared memory) and the
  # matmul bias gradient (a shared-memory column sum), and the tensor-core attention (warps that
  # exchange WMMA tiles through shared memory: its causality test, 3 tiles forward and backward,
  # about 30 s). A missing __syncthreads or __syncwarp there is a race TSan reports.
  set(SANITIZE_UNIT_EXECUTABLES test_comm test_cuda_layers_emu)
  set(SANITIZE_EMU_TESTS
      "^emu[.](.*(CudaLayerNorm|CudaCrossEntropy|CudaMatmul)[.]|CudaLayers[.]TcAttentionIsCausal)")
  set(SANITIZE_UNIT_TESTS ucx.collectives.np2 ucx.collectives.np3)
  set(SANITIZE_FIXTURES run.reference run.reference.l8 run.ddp.np4 run.zero3.np2 run.zero3.np4
                        run.zero3.np4.ucx run.gpipe.pp4 fail.throw fail.oom fail.hang)
endif()
# Never in a sanitizer build: tests of the process's resident memory and of glibc's allocator
# (ProcessMemory.*, e2e.untracked.*). ASan and TSan replace the allocator (mallopt does nothing),
# hold freed blocks in a quarantine and add shadow memory, so RSS measures the sanitizer there.
# Nor the bound on a prediction's accuracy against measured step times (cli.predict_shape): the
# sanitizers slow the BLAS's GEMMs and strata's own kernels by different factors (+18.9% there
# under ASan + UBSan on 2026-11-27, -3.3% to -7.3% in Release), so it would bound the sanitizer.
# Its code, the sweep and the carried entry, runs under them in cli.predict and test_gemm_model.
# A build's own exclusions (SANITIZE_ALSO_NEVER, ASan's above) join these.
set(SANITIZE_NEVER "^(ProcessMemory[.]|e2e[.]untracked[.]|cli[.]predict_shape$)${SANITIZE_ALSO_NEVER}")
# GoogleTest executables run through this, also when gtest_discover_tests lists their tests at build
# time (the UCX switches are needed before main).
set(SANITIZE_LAUNCHER ${CMAKE_COMMAND} -E env ${SANITIZE_ENV})

# A report fails its test even when the exit code does not say so: a run expected to fail
# (WILL_FAIL would pass it) or a rank whose exit status the launcher drops.
set(SANITIZE_REPORT "ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error: |WARNING: ThreadSanitizer")

function(strata_sanitize_tests)
  # Tests added with add_test: environment, time limit, label.
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(t ${tests})
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT ${SANITIZE_ENV})
    set_property(TEST ${t} PROPERTY FAIL_REGULAR_EXPRESSION "${SANITIZE_REPORT}")
    # The failure runs: the runner's error line instead of WILL_FAIL, which would turn a sanitizer
    # report into a pass (their e2e.failfile check still reads the status from the run file).
    get_property(will_fail TEST ${t} PROPERTY WILL_FAIL)
    if(will_fail)
      set_property(TEST ${t} PROPERTY WILL_FAIL FALSE)
      set_property(TEST ${t} PROPERTY PASS_REGULAR_EXPRESSION "runner: error: ")
    endif()
    get_property(timeout TEST ${t} PROPERTY TIMEOUT)
    if(timeout)
      math(EXPR timeout "${timeout} * ${SANITIZE_TIMEOUT_SCALE}")
      set_property(TEST ${t} PROPERTY TIMEOUT ${timeout})
    endif()
    get_property(labels TEST ${t} PROPERTY LABELS)
    get_property(setup TEST ${t} PROPERTY FIXTURES_SETUP)
    get_property(required TEST ${t} PROPERTY FIXTURES_REQUIRED)
    set(chosen FALSE)
    if(DEFINED SANITIZE_UNIT_TESTS)
      if(t IN_LIST SANITIZE_UNIT_TESTS)
        set(chosen TRUE)
      endif()
    elseif(("unit" IN_LIST labels OR "cli" IN_LIST labels) AND NOT t IN_LIST SANITIZE_UNIT_SKIP)
      set(chosen TRUE)
    endif()
    if(t IN_LIST SANITIZE_ALSO_TESTS)
      set(chosen TRUE)
    endif()
    # An e2e test is chosen when every run it sets up or needs is.
    if("e2e" IN_LIST labels AND (setup OR required))
      set(chosen TRUE)
      foreach(f ${setup} ${required})
        if(NOT f IN_LIST SANITIZE_FIXTURES)
          set(chosen FALSE)
        endif()
      endforeach()
    endif()
    if(t MATCHES "${SANITIZE_NEVER}")
      set(chosen FALSE)
    endif()
    if(chosen)
      set_property(TEST ${t} APPEND PROPERTY LABELS sanitize)
    endif()
  endforeach()

  # GoogleTest's tests exist only once ctest has read the lists gtest_discover_tests wrote
  # (<executable>_TESTS, in TEST_INCLUDE_FILES before this one): a script ctest reads after them
  # labels the chosen executables' tests.
  if(DEFINED SANITIZE_UNIT_EXECUTABLES)
    set(executables ${SANITIZE_UNIT_EXECUTABLES})
  else()
    set(executables ${UNIT_TEST_EXECUTABLES})
  endif()
  set(lists)
  foreach(e ${executables})
    string(APPEND lists " ${e}_TESTS")
  endforeach()
  set(script ${CMAKE_CURRENT_BINARY_DIR}/sanitize_labels.cmake)
  # The emulated CUDA tests (emu.*): all of them, or those SANITIZE_EMU_TESTS matches.
  if(NOT DEFINED SANITIZE_EMU_TESTS)
    set(SANITIZE_EMU_TESTS "^emu[.]")
  endif()
  file(WRITE ${script} "foreach(t IN LISTS${lists})\n"
                       "  if(t MATCHES \"${SANITIZE_NEVER}\")\n"
                       "    continue()\n"
                       "  endif()\n"
                       "  if(t MATCHES \"^emu[.]\" AND NOT t MATCHES \"${SANITIZE_EMU_TESTS}\")\n"
                       "    continue()\n"
                       "  endif()\n"
                       "  set_tests_properties(\"\${t}\" PROPERTIES LABELS \"unit;sanitize\"\n"
                       "                       FAIL_REGULAR_EXPRESSION \"${SANITIZE_REPORT}\")\n"
                       "endforeach()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${script})
endfunction()
