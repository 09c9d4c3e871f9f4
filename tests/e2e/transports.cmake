# The strategies end to end over the UCX and gloo transports, each against its MPI twin.

# Every strategy over UCX and over gloo follows the same run over MPI (same arguments, --transport
# ucx|gloo): the loss trajectory within the e2e tolerance (reduction order differs), the same bytes
# (= predict()) and memory.
# strata_e2e_twin(<transport> <mpi id> <ranks> <args>): <mpi id>.<transport> against <mpi id>.
function(strata_e2e_twin t id ranks)
  strata_e2e_run(${id}.${t} ${ranks} --transport ${t} ${ARGN})
  add_test(NAME e2e.layout.${id}.${t} COMMAND check_run layout ${E2E_DIR}/${id}.${t}.h5 ${ranks} ${E2E_STEPS})
  add_test(NAME e2e.predicted.${id}.${t} COMMAND check_run predicted ${E2E_DIR}/${id}.${t}.h5)
  add_test(NAME e2e.${t}-equals-mpi.${id}
           COMMAND check_run trajectory ${E2E_DIR}/${id}.h5 ${E2E_DIR}/${id}.${t}.h5 ${E2E_LOSS_TOL})
  set_tests_properties(e2e.layout.${id}.${t} e2e.predicted.${id}.${t} PROPERTIES
                       FIXTURES_REQUIRED run.${id}.${t} LABELS e2e)
  set_tests_properties(e2e.${t}-equals-mpi.${id} PROPERTIES
                       FIXTURES_REQUIRED "run.${id}.${t};run.${id}" LABELS e2e)
endfunction()
foreach(t IN LISTS TEST_HOST_TRANSPORTS)
  strata_e2e_twin(${t} dp.np4 4 --plugin dp --micro-batch 2 --nodes 2)
  strata_e2e_twin(${t} ddp.np4 4 --plugin ddp --micro-batch 2 --nodes 2 --plugin-opt bucket_mb=0.1)
  strata_e2e_twin(${t} allreduce.np2 2 --plugin allreduce --micro-batch 2)
  foreach(s zero1 zero2 zero3)
    strata_e2e_twin(${t} ${s}.np4 4 --plugin ${s} --micro-batch 2 --nodes 2 --plugin-opt bucket_mb=0.1)
  endforeach()
  foreach(s fsdp fsdp-grad-op fsdp-hybrid)
    strata_e2e_twin(${t} ${s}.np4 4 --plugin ${s} --micro-batch 2 --nodes 2)
  endforeach()
  strata_e2e_twin(${t} tp.dp2.np4 4 --plugin tp --mesh dp=2,tp=2 --nodes 2 --micro-batch 2 --plugin-opt sp=on)
  foreach(s gpipe 1f1b interleaved)
    strata_e2e_twin(${t} ${s}.pp2 2 --plugin ${s} --mesh pp=2 --micro-batch 2 ${L8})
  endforeach()
  strata_e2e_twin(${t} 1f1b.dp2.pp2 4 --plugin 1f1b --mesh dp=2,pp=2 --nodes 2 --micro-batch 1 ${L8})
  strata_e2e_twin(${t} ddp.calibrate.np4 4 --plugin ddp --micro-batch 2 --nodes 2 --calibrate-comm)
  strata_e2e_twin(${t} moe.ep.np2 2 ${MOE} --plugin ep --mesh dp=2,ep=2 --micro-batch 2)
endforeach()
