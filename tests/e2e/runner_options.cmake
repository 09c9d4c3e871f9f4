# The runner's options end to end on ddp: gradient buckets (bucket_mb), --data token files,
# --peak-tflops, and the runner re-launching itself under mpirun.

# ddp with bucket_mb=0.1 cuts the tiny model's 482,304 gradient bytes into 5 buckets: one
# all-reduce each, per step.
add_test(NAME e2e.buckets.ddp.np4 COMMAND check_run calls ${E2E_DIR}/ddp.np4.h5 all_reduce 5)
set_tests_properties(e2e.buckets.ddp.np4 PROPERTIES FIXTURES_REQUIRED run.ddp.np4 LABELS e2e)

# --data: a flat uint16 token file, read with pread; the loss must fall on it too. The same
# tokens in llm.c's format with uint32 tokens (version 2) train to the same losses, bit for bit;
# and a vocabulary beyond uint16 (70000, as Llama 3's 128256 needs) trains from uint32 tokens.
add_test(NAME e2e.tokens.make COMMAND check_run make-tokens ${E2E_DIR}/tokens.bin 100000 256)
add_test(NAME e2e.tokens.make.llmc2
         COMMAND check_run make-tokens ${E2E_DIR}/tokens.llmc2.bin 100000 256 llmc-v2)
add_test(NAME e2e.tokens.make.wide
         COMMAND check_run make-tokens ${E2E_DIR}/tokens.wide.bin 100000 70000 llmc-v2)
set_tests_properties(e2e.tokens.make e2e.tokens.make.llmc2 e2e.tokens.make.wide
                     PROPERTIES FIXTURES_SETUP tokens LABELS e2e)
strata_e2e_run(ddp.data.np2 2 --plugin ddp --micro-batch 4 --data ${E2E_DIR}/tokens.bin)
strata_e2e_run(ddp.data.llmc2.np2 2 --plugin ddp --micro-batch 4 --data ${E2E_DIR}/tokens.llmc2.bin)
strata_e2e_run(ddp.data.wide.np1 1 --plugin ddp --micro-batch 8 --vocab 70000
               --data ${E2E_DIR}/tokens.wide.bin)
set_tests_properties(e2e.run.ddp.data.np2 e2e.run.ddp.data.llmc2.np2 e2e.run.ddp.data.wide.np1
                     PROPERTIES FIXTURES_REQUIRED tokens)
add_test(NAME e2e.layout.ddp.data.np2 COMMAND check_run layout ${E2E_DIR}/ddp.data.np2.h5 2 ${E2E_STEPS})
add_test(NAME e2e.layout.ddp.data.wide.np1
         COMMAND check_run layout ${E2E_DIR}/ddp.data.wide.np1.h5 1 ${E2E_STEPS})
add_test(NAME e2e.data.llmc2-equals-flat
         COMMAND check_run trajectory ${E2E_DIR}/ddp.data.np2.h5 ${E2E_DIR}/ddp.data.llmc2.np2.h5 0)
set_tests_properties(e2e.layout.ddp.data.np2 PROPERTIES FIXTURES_REQUIRED run.ddp.data.np2 LABELS e2e)
set_tests_properties(e2e.layout.ddp.data.wide.np1 PROPERTIES FIXTURES_REQUIRED run.ddp.data.wide.np1
                     LABELS e2e)
set_tests_properties(e2e.data.llmc2-equals-flat PROPERTIES
                     FIXTURES_REQUIRED "run.ddp.data.np2;run.ddp.data.llmc2.np2" LABELS e2e)

# --peak-tflops replaces the calibrated peak in MFU and is recorded as such.
strata_e2e_run(ddp.peak.np1 1 --plugin ddp --micro-batch 8 --peak-tflops 0.5)
add_test(NAME e2e.peak.ddp.np1 COMMAND check_run summary ${E2E_DIR}/ddp.peak.np1.h5 peak_flops_per_rank 5e11)
set_tests_properties(e2e.peak.ddp.np1 PROPERTIES FIXTURES_REQUIRED run.ddp.peak.np1 LABELS e2e)

# The issue's command: runner started alone re-launches itself on 2 virtual nodes x 2 ranks.
add_test(NAME e2e.run.ddp.relaunch
         COMMAND runner --plugin ddp --nodes 2 --ranks-per-node 2 --micro-batch 2 ${E2E_COMMON}
                 --run-id ddp.relaunch)
set_tests_properties(e2e.run.ddp.relaunch PROPERTIES FIXTURES_SETUP run.ddp.relaunch
                     LABELS e2e TIMEOUT 300 RESOURCE_LOCK cores
                     PASS_REGULAR_EXPRESSION "launching .*mpirun -np 4.*summary  ddp, 4 rank")
strata_e2e_checks(ddp.relaunch 4)
