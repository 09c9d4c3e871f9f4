# MFU end to end: the node's GEMM peak measured once, then read from the cache.

# MFU against the node's peak: 4 ranks sharing this machine's cores each get a quarter of the node's
# GEMM peak, measured once (STRATA_PEAK_REMEASURE) and then reused from the cache; MFU <= 1 on every
# rank and the peak's source in /provenance.
strata_e2e_run(mfu.measured.np4 4 --plugin zero3 --micro-batch 2)
strata_e2e_run(mfu.cached.np4 4 --plugin zero3 --micro-batch 2)
set(_mfu_env "${E2E_MPI_ENV};STRATA_PEAK_CACHE=${E2E_DIR}/mfu/peak_flops.tsv")
set_tests_properties(e2e.run.mfu.measured.np4 PROPERTIES
                     ENVIRONMENT "${_mfu_env};STRATA_PEAK_REMEASURE=1")
set_tests_properties(e2e.run.mfu.cached.np4 PROPERTIES ENVIRONMENT "${_mfu_env};STRATA_PEAK_REMEASURE=0"
                     FIXTURES_REQUIRED run.mfu.measured.np4)
add_test(NAME e2e.mfu.measured COMMAND check_run mfu ${E2E_DIR}/mfu.measured.np4.h5 measured 4)
add_test(NAME e2e.mfu.cached COMMAND check_run mfu ${E2E_DIR}/mfu.cached.np4.h5 cache 4)
set_tests_properties(e2e.mfu.measured PROPERTIES FIXTURES_REQUIRED run.mfu.measured.np4 LABELS e2e)
set_tests_properties(e2e.mfu.cached PROPERTIES FIXTURES_REQUIRED run.mfu.cached.np4 LABELS e2e)
