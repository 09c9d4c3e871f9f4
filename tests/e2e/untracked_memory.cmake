# Untracked memory end to end: process peak - runtime baseline - tracked peak within a bound on
# every rank (check_run untracked), fp32 and bf16.

# Memory the ledger does not see (check_run untracked, docs/measures.md "Memory: tracked, runtime,
# untracked"). The small model, whose tracked memory (65-205 MiB per rank) dwarfs the runtime's
# (~30 MiB), on 1 rank (2 BLAS threads) and 2 ranks (one each) of ddp, zero2, zero3, fsdp, tp and
# 1f1b: on every rank, process peak - runtime baseline - tracked peak lies within +-2 MiB, plus on
# 2 ranks the rank's largest reduction (Open MPI's scratch inside the call). Measured: 0.0-0.7
# MiB beyond that scratch in 3 repetitions of each run (1.0-1.4 MiB for the 4-rank calibration
# run), also under a load of 15 on the 2 cores; before the fixes 10 of these 13 checks failed:
# zero2 on 1 rank kept 32 MiB more per step, every 1-rank run 4-7 MiB of BLAS buffers.
set(UNTRACKED_MAX_BYTES 2097152)
function(strata_untracked id ranks)
  if(ranks EQUAL 1)
    set(cmd $<TARGET_FILE:runner>)
    set(env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;STRATA_PEAK_CACHE=${E2E_DIR}/peak_flops.tsv")
  else()
    set(cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${MPI_FLAGS} $<TARGET_FILE:runner>)
    set(env "${E2E_ENV}")
  endif()
  add_test(NAME e2e.run.${id}
           COMMAND ${cmd} --model small --steps 4 --warmup 1 --out ${E2E_DIR} --quiet --overwrite --run-id ${id}
                   ${ARGN})
  set_tests_properties(e2e.run.${id} PROPERTIES FIXTURES_SETUP run.${id} ENVIRONMENT "${env}"
                       LABELS e2e TIMEOUT 300 RESOURCE_LOCK cores)
  add_test(NAME e2e.untracked.${id} COMMAND check_run untracked ${E2E_DIR}/${id}.h5 ${UNTRACKED_MAX_BYTES})
  set_tests_properties(e2e.untracked.${id} PROPERTIES FIXTURES_REQUIRED run.${id} LABELS e2e)
endfunction()
foreach(n 1 2)
  foreach(s ddp zero2 zero3 fsdp)
    strata_untracked(memory.${s}.np${n} ${n} --plugin ${s})
  endforeach()
  strata_untracked(memory.tp.np${n} ${n} --plugin tp --mesh tp=${n})
  strata_untracked(memory.1f1b.np${n} ${n} --plugin 1f1b --mesh pp=${n} --micro-batch 2
                   --global-batch 8)
endforeach()
# bf16: oneDNN's GEMM scratchpads are in the ledger (activations, sized by oneDNN) and its kernels
# are compiled before the baseline (predict() sizes them), so the same bound holds.
if(STRATA_WITH_ONEDNN)
  strata_untracked(memory.bf16.ddp.np1 1 --plugin ddp --precision bf16)
  strata_untracked(memory.bf16.zero3.np2 2 --plugin zero3 --precision bf16 --reduce-dtype bf16)
  strata_untracked(memory.bf16.tp.np2 2 --plugin tp --mesh tp=2 --precision bf16)
endif()
# The other host transports under the same bound (UCX: its scratch inside the call; gloo: twice
# the largest reduction, check_run untracked), for the strategies that all-reduce, reduce-scatter
# and gather: 0.8-1.8 MiB over UCX, 2.3-20.2 over gloo (zero2's composed reduce-scatter) on
# 2026-12-07.
foreach(t IN LISTS TEST_HOST_TRANSPORTS)
  foreach(s ddp zero2 zero3)
    strata_untracked(memory.${s}.np2.${t} 2 --plugin ${s} --transport ${t})
  endforeach()
endforeach()
# --calibrate-comm's 16 MiB buffers stay out of the process peak (the tiny model tracks ~9 MiB).
add_test(NAME e2e.untracked.ddp.calibrate.np4
         COMMAND check_run untracked ${E2E_DIR}/ddp.calibrate.np4.h5 ${UNTRACKED_MAX_BYTES})
set_tests_properties(e2e.untracked.ddp.calibrate.np4 PROPERTIES FIXTURES_REQUIRED run.ddp.calibrate.np4
                     LABELS e2e)
