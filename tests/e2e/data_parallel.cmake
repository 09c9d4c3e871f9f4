# Data parallelism end to end: the 1-rank reference every fp32 trajectory is checked against, and
# dp, ddp and allreduce at 1, 2 and 4 ranks.

# The reference: one rank, the whole global batch in one micro-batch.
strata_e2e_run(reference 1 --plugin dp --micro-batch 8)
strata_e2e_checks(reference 1)
# dp and ddp at 1, 2 and 4 ranks, same global batch of 8 (accumulation where micro x dp < 8).
strata_e2e_run(dp.np1 1 --plugin dp --micro-batch 2)
strata_e2e_run(dp.np2 2 --plugin dp --micro-batch 2)
strata_e2e_run(dp.np4 4 --plugin dp --micro-batch 2 --nodes 2)
strata_e2e_run(ddp.np1 1 --plugin ddp --micro-batch 2)
strata_e2e_run(ddp.np2 2 --plugin ddp --micro-batch 4 --nodes 2)
strata_e2e_run(ddp.np4 4 --plugin ddp --micro-batch 2 --nodes 2 --plugin-opt bucket_mb=0.1)
strata_e2e_run(allreduce.np2 2 --plugin allreduce --micro-batch 2)
foreach(id dp.np1 dp.np2 dp.np4 ddp.np1 ddp.np2 ddp.np4 allreduce.np2)
  string(REGEX REPLACE ".*np" "" ranks ${id})
  strata_e2e_checks(${id} ${ranks})
endforeach()
