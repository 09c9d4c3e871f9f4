# bf16 mixed precision (--precision bf16): every strategy at 2 and 4 ranks on the 1-rank bf16
# trajectory, memory per tag and bytes per op equal to predict() (the checks of
# strata_e2e_checks), gradients reduced in bf16 moving half the bytes of fp32, and bf16 against
# fp32 on `small`.
#
# Tolerance: E2E_BF16_TOL = 2e-3 absolute on the per-step loss (the fp32 runs use 1e-5). bf16
# parameters carry 8 significant bits: the fp32 summation-order differences between a split run
# and the 1-rank reference (micro-batch size, reduction order, tensor-parallel partial sums), ~1e-7
# relative in fp32, flip the rounding of a few parameters by one bf16 ulp each step, and the flips
# compound. Measured over 20 steps of tiny (2026-11-29, with the residual stream and the GEMMs'
# inputs and outputs in bf16): 9.5e-5 to 1.0e-4 for the data-parallel strategies (5.3e-4 to
# 6.2e-4 with bf16 gradient reduction), 2.2e-4 to 3.7e-4 for tp 2 (its collectives in bf16 or
# fp32 alike) and 1.1e-3 for tp 4, 2.0e-4 for 1f1b at pp 2 with fp32 between stages; a wrong
# reduction or update moves the loss by more than 1e-2 within a few steps.
set(E2E_BF16_TOL 2e-3)
# E2E_BF16_PP_TOL = 5e-3 for pipelines that move bf16 between stages (--tp-comm-dtype's default
# in a bf16 run, as Megatron-LM sends them): the activations cross exactly (the residual stream is
# bf16 on both sides), but each boundary rounds the fp32 gradient of the residual stream to bf16
# (one ulp, 2^-9 relative) backward, which the 1-rank reference never does. Measured over 20
# steps (2026-11-29, bf16 residual stream): 2.0e-3 to 2.8e-3 at pp 2 and 4, 1.4e-3 for
# interleaved pp 4 (8 chunks, 7 boundaries) and 2.0e-3 for tp=2 x pp=2. Tensor parallelism's bf16
# all-reduces, all-gathers and reduce-scatters round only a sub-block's partial sums before the
# residual add: 3.7e-4 (sp) and 3.0e-4 (without) at tp 2, within E2E_BF16_TOL.
set(E2E_BF16_PP_TOL 5e-3)

# strata_e2e_bf16(<id> <ranks> <reference id> <runner args...>): the run (with --precision bf16
# added) and its checks against the given bf16 reference, within E2E_BF16_PP_TOL for a pipeline
# (--mesh with pp > 1) moving bf16 activations, else E2E_BF16_TOL.
function(strata_e2e_bf16 id ranks ref)
  set(tol ${E2E_BF16_TOL})
  if("${ARGN}" MATCHES "pp=[2-9]" AND NOT "${ARGN}" MATCHES "--tp-comm-dtype;fp32")
    set(tol ${E2E_BF16_PP_TOL})
  endif()
  strata_e2e_run(${id} ${ranks} ${ARGN} --precision bf16)
  strata_e2e_checks_against(${id} ${ranks} ${ref} ${tol})
endfunction()

# References: one rank, the whole batch in one micro-batch; gradients reduced in fp32 (the
# default) and in bf16; 8 layers for the pipelines.
strata_e2e_bf16(bf16.reference 1 bf16.reference --plugin dp --micro-batch 8)
strata_e2e_bf16(bf16.reference.rbf16 1 bf16.reference.rbf16 --plugin dp --micro-batch 8
                --reduce-dtype bf16)
strata_e2e_bf16(bf16.reference.l8 1 bf16.reference.l8 --plugin dp --micro-batch 8 ${L8})

foreach(n 2 4)
  set(nodes --nodes 2)
  if(n EQUAL 2)
    set(nodes)
  endif()
  foreach(s dp ddp zero1 zero2 zero3 fsdp)
    strata_e2e_bf16(bf16.${s}.np${n} ${n} bf16.reference --plugin ${s} --micro-batch 2 ${nodes})
  endforeach()
  strata_e2e_bf16(bf16.tp.np${n} ${n} bf16.reference --plugin tp --mesh tp=${n} --micro-batch 2
                  --plugin-opt sp=on)
  foreach(s gpipe 1f1b interleaved zb-h1 zb-v)
    strata_e2e_bf16(bf16.${s}.pp${n} ${n} bf16.reference.l8 --plugin ${s} --mesh pp=${n}
                    --micro-batch 2 ${L8})
  endforeach()
endforeach()
strata_e2e_bf16(bf16.1f1b.tp2.pp2 4 bf16.reference.l8 --plugin 1f1b --mesh tp=2,pp=2
                --micro-batch 2 ${L8})
# dp=zero1 on a pipeline with two chunks per rank: each rank's fp32 master covers its dp shard,
# which here starts inside one chunk and ends in the other.
strata_e2e_bf16(bf16.interleaved.dp2.pp2.zero1 4 bf16.reference.l8 --plugin interleaved
                --mesh dp=2,pp=2 --nodes 2 --micro-batch 1 --plugin-opt dp=zero1 ${L8})
# FSDP there (torchtitan's FSDP2 x PP): the bf16 parameters gathered per unit once a step from
# the fp32 masters of the dp shards, the gradients reduce-scattered once a step.
strata_e2e_bf16(bf16.interleaved.dp2.pp2.fsdp 4 bf16.reference.l8 --plugin interleaved
                --mesh dp=2,pp=2 --nodes 2 --micro-batch 1 --plugin-opt dp=fsdp ${L8})
# ZeRO-1, ZeRO-2 and FSDP on the dp axis of tp (dp=2 x tp=2, sequence parallel): the fp32
# masters of the dp shards (per unit for zero2 and fsdp), the bf16 parameters gathered from them.
foreach(mode zero1 zero2 fsdp)
  strata_e2e_bf16(bf16.tp.dp2.${mode}.np4 4 bf16.reference --plugin tp --mesh dp=2,tp=2 --nodes 2
                  --micro-batch 2 --plugin-opt sp=on --plugin-opt dp=${mode})
endforeach()

# Gradients reduced in bf16: on their own 1-rank reference, and every gradient collective moves
# exactly half the bytes of the same run reducing in fp32 (predict() agrees: e2e.predicted).
foreach(case "ddp;all_reduce" "zero2;reduce_scatter" "fsdp;reduce_scatter")
  list(GET case 0 s)
  list(GET case 1 op)
  strata_e2e_bf16(bf16.${s}.rbf16.np2 2 bf16.reference.rbf16 --plugin ${s} --micro-batch 2
                  --reduce-dtype bf16)
  add_test(NAME e2e.halved.${s}.np2
           COMMAND check_run comm-ratio ${E2E_DIR}/bf16.${s}.rbf16.np2.h5
                   ${E2E_DIR}/bf16.${s}.np2.h5 ${op} 0.5)
  set_tests_properties(e2e.halved.${s}.np2 PROPERTIES
                       FIXTURES_REQUIRED "run.bf16.${s}.rbf16.np2;run.bf16.${s}.np2" LABELS e2e)
endforeach()
# Activations cross tp collectives and pipeline stages in the run's precision (--tp-comm-dtype,
# default bf16 here): bf16.tp.np2, bf16.tp.nosp.np2 and bf16.1f1b.pp2 move bf16 activations. Their
# twins with --tp-comm-dtype fp32 follow the same reference, and the bf16 runs move exactly half
# their activation bytes: tp with sp, every all-gather and reduce-scatter; tp without sp, the
# all-reduces but what stays fp32, the cross-entropy's statistics (4 micro-batches x 3 x 128 rows
# x 4 B) and the gradient norm (8 B), 6152 B of which the ratio halves, so + 3076; 1f1b, the sends
# and receives but the tied wte's fp32 gradient (256 x 64 x 4 B, so + 32768). tp sp's bf16 comm
# buffer: [N, C] bf16 and an [N/2, C] reduce-scatter output, N = 128 rows, C = 64 (every run's
# comm_buffers equal predict(): e2e.predicted).
strata_e2e_bf16(bf16.tp.nosp.np2 2 bf16.reference --plugin tp --mesh tp=2 --micro-batch 2)
# Context parallelism in bf16: Ulysses' all-to-alls and ring attention's key-value passes in
# bf16, the ring's blocks merged in fp32 and its output rounded once (1.2e-4 and 3.6e-4 off the
# reference on 2026-12-01).
strata_e2e_bf16(bf16.cp.np2 2 bf16.reference --plugin cp --mesh cp=2 --micro-batch 2)
strata_e2e_bf16(bf16.cp.ring.np2 2 bf16.reference --plugin cp --mesh cp=2 --micro-batch 2
                --plugin-opt attention=ring)
strata_e2e_bf16(bf16.tp.np2.fp32comm 2 bf16.reference --plugin tp --mesh tp=2 --micro-batch 2
                --plugin-opt sp=on --tp-comm-dtype fp32)
strata_e2e_bf16(bf16.tp.nosp.np2.fp32comm 2 bf16.reference --plugin tp --mesh tp=2
                --micro-batch 2 --tp-comm-dtype fp32)
strata_e2e_bf16(bf16.1f1b.pp2.fp32comm 2 bf16.reference.l8 --plugin 1f1b --mesh pp=2
                --micro-batch 2 ${L8} --tp-comm-dtype fp32)
foreach(case "tp.np2;all_gather;0" "tp.np2;reduce_scatter;0" "tp.nosp.np2;all_reduce;3076"
        "1f1b.pp2;send;32768" "1f1b.pp2;recv;32768")
  list(GET case 0 run)
  list(GET case 1 op)
  list(GET case 2 kept)
  add_test(NAME e2e.halved.tpcomm.${run}.${op}
           COMMAND check_run comm-ratio ${E2E_DIR}/bf16.${run}.h5 ${E2E_DIR}/bf16.${run}.fp32comm.h5
                   ${op} 0.5 ${kept})
  set_tests_properties(e2e.halved.tpcomm.${run}.${op} PROPERTIES
                       FIXTURES_REQUIRED "run.bf16.${run};run.bf16.${run}.fp32comm" LABELS e2e)
endforeach()
add_test(NAME e2e.tpcomm.buffer.tp.np2
         COMMAND check_run memory-plus ${E2E_DIR}/bf16.tp.np2.h5 ${E2E_DIR}/bf16.tp.np2.fp32comm.h5
                 comm_buffers comm_buffers 24576)
set_tests_properties(e2e.tpcomm.buffer.tp.np2 PROPERTIES
                     FIXTURES_REQUIRED "run.bf16.tp.np2;run.bf16.tp.np2.fp32comm" LABELS e2e)

# bf16 parameters: zero3 / fsdp all-gather half the bytes of fp32 ones.
add_test(NAME e2e.halved.fsdp.all_gather.np2
         COMMAND check_run comm-ratio ${E2E_DIR}/bf16.fsdp.np2.h5 ${E2E_DIR}/fsdp.np2.h5 all_gather
                 0.5)
set_tests_properties(e2e.halved.fsdp.all_gather.np2 PROPERTIES
                     FIXTURES_REQUIRED "run.bf16.fsdp.np2;run.fsdp.np2" LABELS e2e)

# bf16 against fp32 on `small`, 1 rank, 50 steps (loss 8.36 -> 6.34): the per-step losses agree
# within 1e-2 absolute (measured: 1.9e-3 at most with 2 threads, 1.3e-3 with one; the gap grows
# slowly with the steps as the two trajectories drift apart by bf16 rounding, never by a different
# algorithm). One thread, as the other 1-rank runs (E2E_ENV), beside the `cores` chain: on 2 cores
# the fp32 run took 10.4 s on 2 threads (19.5 s of CPU) and 9.2 s on one (2026-12-06).
foreach(p fp32 bf16)
  add_test(NAME e2e.run.small50.${p}
           COMMAND runner --model small --steps 50 --plugin ddp --precision ${p} --out ${E2E_DIR}
                   --quiet --overwrite --run-id small50.${p})
  set_tests_properties(e2e.run.small50.${p} PROPERTIES FIXTURES_SETUP run.small50.${p}
                       ENVIRONMENT "${E2E_ENV}" LABELS e2e TIMEOUT 600)
endforeach()
add_test(NAME e2e.trajectory.small50.bf16-vs-fp32
         COMMAND check_run trajectory ${E2E_DIR}/small50.fp32.h5 ${E2E_DIR}/small50.bf16.h5 1e-2)
set_tests_properties(e2e.trajectory.small50.bf16-vs-fp32 PROPERTIES
                     FIXTURES_REQUIRED "run.small50.fp32;run.small50.bf16" LABELS e2e)

# Optimizer offload in bf16: the fp32 master, m and v in host memory, the bf16 parameters rounded
# there and copied to the device. The same losses as the run without offload bit for bit, no
# optimizer state on the device, and on the host its 12 bytes per element plus the host copies of
# the rank's shards (4-byte gradients + 2-byte parameters x its 60288 elements).
strata_e2e_bf16(bf16.zero3.offload.np2 2 bf16.reference --plugin zero3 --micro-batch 2
                --plugin-opt offload=optimizer)
set(base ${E2E_DIR}/bf16.zero3.np2.h5)
set(offloaded ${E2E_DIR}/bf16.zero3.offload.np2.h5)
add_test(NAME e2e.offload.same-losses.bf16.zero3.offload.np2
         COMMAND check_run trajectory ${base} ${offloaded} 0)
add_test(NAME e2e.offload.no-device-optimizer.bf16.zero3.offload.np2
         COMMAND check_run memory-ratio ${offloaded} ${base} optimizer 0 0)
add_test(NAME e2e.offload.host-optimizer.bf16.zero3.offload.np2
         COMMAND check_run memory-plus ${offloaded} ${base} offload optimizer 361728)
# The copies per step over both ranks: tiny's 120576 fp32 gradients down (the fp32 master stays on
# the host), its bf16 parameters back up.
add_test(NAME e2e.offload.transfers.bf16.zero3.offload.np2
         COMMAND check_run transfers ${offloaded} 482304 241152)
set_tests_properties(e2e.offload.same-losses.bf16.zero3.offload.np2
                     e2e.offload.no-device-optimizer.bf16.zero3.offload.np2
                     e2e.offload.host-optimizer.bf16.zero3.offload.np2
                     e2e.offload.transfers.bf16.zero3.offload.np2 PROPERTIES
                     FIXTURES_REQUIRED "run.bf16.zero3.offload.np2;run.bf16.zero3.np2" LABELS e2e)
