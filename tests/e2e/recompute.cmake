# Activation recomputation end to end on ddp and zero3 (--recompute full and selective); recompute
# under tp and the pipelines is in model_parallel.cmake.

# Activation recomputation: the same losses as without it, less activation memory (full keeps
# only each block's input; selective drops the attention probabilities).
foreach(mode full selective)
  strata_e2e_run(ddp.recompute-${mode}.np2 2 --plugin ddp --micro-batch 4 --nodes 2 --recompute ${mode})
  strata_e2e_run(zero3.recompute-${mode}.np2 2 --plugin zero3 --micro-batch 2 --recompute ${mode})
  strata_e2e_checks(ddp.recompute-${mode}.np2 2)
  strata_e2e_checks(zero3.recompute-${mode}.np2 2)
  add_test(NAME e2e.activations.recompute-${mode}
           COMMAND check_run less-memory ${E2E_DIR}/ddp.recompute-${mode}.np2.h5 ${E2E_DIR}/ddp.np2.h5 activations)
  set_tests_properties(e2e.activations.recompute-${mode} PROPERTIES
                       FIXTURES_REQUIRED "run.ddp.recompute-${mode}.np2;run.ddp.np2" LABELS e2e)
endforeach()
add_test(NAME e2e.activations.full-vs-selective
         COMMAND check_run less-memory ${E2E_DIR}/ddp.recompute-full.np2.h5
                 ${E2E_DIR}/ddp.recompute-selective.np2.h5 activations)
set_tests_properties(e2e.activations.full-vs-selective PROPERTIES
                     FIXTURES_REQUIRED "run.ddp.recompute-full.np2;run.ddp.recompute-selective.np2" LABELS e2e)
