# Communication calibration end to end (--calibrate-comm): /calibration rows, the training ledger
# unchanged.

# --calibrate-comm: busbw rows for every mesh group of more than one rank, and the calibration's
# traffic kept out of the training ledger (bytes still equal predict(), loss on the trajectory).
strata_e2e_run(ddp.calibrate.np4 4 --plugin ddp --micro-batch 2 --nodes 2 --calibrate-comm)
strata_e2e_checks(ddp.calibrate.np4 4)
add_test(NAME e2e.calibration.ddp.np4
         COMMAND check_run calibration ${E2E_DIR}/ddp.calibrate.np4.h5 dp,dp_intra_node,dp_inter_node)
set_tests_properties(e2e.calibration.ddp.np4 PROPERTIES FIXTURES_REQUIRED run.ddp.calibrate.np4 LABELS e2e)
