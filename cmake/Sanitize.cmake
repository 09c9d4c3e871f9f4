# STRATA_SANITIZE: build every target of the project (core, runner, plugins, tests) with the
# compiler's sanitizers. `address,undefined` (ASan + UBSan; any UBSan finding is fatal, so a test
# cannot pass over one) or `thread` (TSan). Empty: a normal build. `make sanitize` / `make tsan`
# configure build-asan / build-tsan with it; tests/CMakeLists.txt adds the runtime options and the
# suppressions of tests/sanitize/ to every test's environment (STRATA_SANITIZE_ENV).
set(STRATA_SANITIZE "" CACHE STRING "Sanitizers: address,undefined or thread (empty = none)")
if(STRATA_SANITIZE)
  if(STRATA_SANITIZE MATCHES "thread" AND STRATA_SANITIZE MATCHES "address")
    message(FATAL_ERROR "STRATA_SANITIZE=${STRATA_SANITIZE}: thread cannot be combined with address")
  endif()
  if(STRATA_WITH_CUDA)
    message(FATAL_ERROR "STRATA_SANITIZE needs STRATA_WITH_CUDA=OFF (host sanitizers only)")
  endif()
  # Frame pointers: whole stacks in the reports, also through the BLAS/MPI frames we call into.
  # -O1 after the build type's -O2 (the last -O wins), as the sanitizers' documentation advises:
  # GCC 12 compiled the ASan + UBSan build in about 0.6 of the time at -O2 (test_stage_model.cpp
  # 24 s against 40 s, twice each, 2026-12-04), and the build was a fifth of `make test`.
  # -g1 after the build type's -g (the last level wins): line tables and function names, all a
  # report's frames need (file:line), without the types and variables: test_stage_model.cpp
  # compiled in 15.0-16.3 s against 22.6-24.5 s, its object 6.0 MB against 13.1 (2026-12-05).
  set(_strata_sanitize_flags -O1 -g1 -fsanitize=${STRATA_SANITIZE} -fno-omit-frame-pointer)
  if(STRATA_SANITIZE MATCHES "undefined")
    list(APPEND _strata_sanitize_flags -fno-sanitize-recover=undefined)
  endif()
  if(STRATA_SANITIZE MATCHES "address")
    # libstdc++'s bounds checks (vector/span/string operator[], front, back...): an index past
    # size() but inside the allocation is invisible to ASan. No ABI change, unlike _GLIBCXX_DEBUG.
    add_compile_definitions(_GLIBCXX_ASSERTIONS)
    # Executables linked at a fixed address (-no-pie; TSan needs PIE, ASan does not). UBSan keeps
    # a source location per check site, each a pointer the loader relocates and so a written page
    # in a position-independent binary: the PIE runner had 330,000 such relocations in 9.4 MB, and
    # its start, run hundreds of times by the CLI tests, a fifth more page faults for them.
    add_link_options("$<$<STREQUAL:$<TARGET_PROPERTY:TYPE>,EXECUTABLE>:-no-pie>")
  endif()
  # UCX's libucm (loaded with libstrata_core by every binary) patches mmap/munmap/madvise to keep
  # its memory registration cache right, and the sanitizers intercept the same functions: under
  # TSan every thread's exit crashed in ucm_madvise -> TSan's pthread_rwlock_rdlock (the runner
  # that makes the published profiles at build time too). UCX's documented switches turn its
  # memory events and hooks off (this host's transports, shared memory, tcp and cma, register no
  # memory, so nothing depends on them here): the environment of every binary a sanitizer build
  # runs, its tests (tests/sanitize/sanitize.cmake) and its build steps.
  set(STRATA_SANITIZE_RUN_ENV UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no
                              UCX_MEM_MMAP_HOOK_MODE=none)
  add_compile_options(${_strata_sanitize_flags})
  add_link_options(-fsanitize=${STRATA_SANITIZE})
endif()
