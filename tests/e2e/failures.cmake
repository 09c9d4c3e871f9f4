# Failures end to end: the faulty test plugin throwing, running out of memory or hanging a
# collective (the watchdog) on one rank; the job ends and the run file says why.

# Failures after start-up end the whole job and still leave a run file saying why.
function(strata_e2e_failure id status text)
  add_test(NAME e2e.fail.${id}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPI_FLAGS} $<TARGET_FILE:runner>
                   ${E2E_COMMON} --plugin-path ${TEST_PLUGIN_DIR} --plugin faulty --micro-batch 4
                   --run-id fail.${id} ${ARGN})
  set_tests_properties(e2e.fail.${id} PROPERTIES WILL_FAIL TRUE FIXTURES_SETUP fail.${id}
                       ENVIRONMENT "${E2E_ENV}" LABELS e2e TIMEOUT 120 RESOURCE_LOCK cores)
  add_test(NAME e2e.failfile.${id} COMMAND check_run status ${E2E_DIR}/fail.${id}.h5 ${status} ${text})
  set_tests_properties(e2e.failfile.${id} PROPERTIES FIXTURES_REQUIRED fail.${id} LABELS e2e)
endfunction()
strata_e2e_failure(throw failed "rank 1: faulty plugin: failing on purpose at step 1"
                   --plugin-opt mode=throw --plugin-opt rank=1)
strata_e2e_failure(oom oom "rank 0:" --plugin-opt mode=oom --plugin-opt rank=0)
strata_e2e_failure(hang timeout "all_reduce on group dp" --plugin-opt mode=hang --plugin-opt rank=1
                   --watchdog 3)
add_dependencies(check_run strata_faulty)
