# Model parallelism end to end: tensor parallel (with sp), the pipelines (gpipe, 1f1b, interleaved)
# and their meshes with dp, dp=zero1/zero2/fsdp on the data-parallel axis, padded shards, and
# recompute under tp and the pipelines.

# Model parallelism. Tensor parallel on tiny (4 heads, hidden 64, vocab 256) against the reference;
# pipelines on an 8-layer tiny against its own 1-rank reference (pp=4 interleaved needs 8 chunks).
foreach(n 2 4)
  strata_e2e_run(tp.np${n} ${n} --plugin tp --mesh tp=${n} --micro-batch 2)
  strata_e2e_run(tp.sp.np${n} ${n} --plugin tp --mesh tp=${n} --micro-batch 2 --plugin-opt sp=on)
  strata_e2e_checks(tp.np${n} ${n})
  strata_e2e_checks(tp.sp.np${n} ${n})
endforeach()
strata_e2e_run(tp.dp2.np4 4 --plugin tp --mesh dp=2,tp=2 --nodes 2 --micro-batch 2 --plugin-opt sp=on)
strata_e2e_checks(tp.dp2.np4 4)

strata_e2e_run(reference.l8 1 --plugin dp --micro-batch 8 ${L8})
# micro-batch 2: 4 micro-batches per step; micro-batch 1 at pp=4: 8, so that 1f1b's bound (pp)
# is below gpipe's (m). zb-h1 (its weight passes deferred) on the same trajectory, its slots'
# deferred d(output)s in its predicted activations; zb-v too, its two chunks in a V (the first and
# the last on rank 0, whose tied wte gradients add up locally; the turn at the last rank a copy).
foreach(s gpipe 1f1b interleaved zb-h1 zb-v)
  strata_e2e_run(${s}.pp2 2 --plugin ${s} --mesh pp=2 --micro-batch 2 ${L8})
  strata_e2e_checks_l8(${s}.pp2 2)
endforeach()
strata_e2e_run(gpipe.pp4 4 --plugin gpipe --mesh pp=4 --micro-batch 1 ${L8} --trace)
strata_e2e_run(1f1b.pp4 4 --plugin 1f1b --mesh pp=4 --micro-batch 1 ${L8})
strata_e2e_run(zb-h1.pp4 4 --plugin zb-h1 --mesh pp=4 --micro-batch 1 ${L8})
strata_e2e_run(zb-v.pp4 4 --plugin zb-v --mesh pp=4 --micro-batch 1 ${L8})
strata_e2e_run(zb-v.tp2.pp2 4 --plugin zb-v --mesh tp=2,pp=2 --micro-batch 2 --plugin-opt sp=on
               ${L8})
strata_e2e_run(interleaved.pp4 4 --plugin interleaved --mesh pp=4 --micro-batch 2 ${L8})
strata_e2e_run(1f1b.dp2.pp2 4 --plugin 1f1b --mesh dp=2,pp=2 --nodes 2 --micro-batch 1 ${L8})
strata_e2e_run(1f1b.3d.np8 8 --plugin 1f1b --mesh dp=2,tp=2,pp=2 --nodes 2 --micro-batch 2
               --plugin-opt sp=on ${L8})
strata_e2e_run(interleaved.tp2.pp2 4 --plugin interleaved --mesh tp=2,pp=2 --micro-batch 2
               --plugin-opt stage_layers=3,1,2,2 ${L8})
foreach(id gpipe.pp4 1f1b.pp4 zb-h1.pp4 zb-v.pp4 interleaved.pp4 1f1b.dp2.pp2 interleaved.tp2.pp2
        zb-v.tp2.pp2)
  strata_e2e_checks_l8(${id} 4)
endforeach()
strata_e2e_checks_l8(1f1b.3d.np8 8)

# dp=zero1 (Megatron's distributed optimizer) on the data-parallel axis of tp and of a pipeline:
# the same trajectory and predicted bytes, and optimizer state per rank half the allreduce run's
# (the same mesh) within the padding: at most half an element of 8 bytes of m and v at dp 2.
strata_e2e_run(tp.dp2.zero1.np4 4 --plugin tp --mesh dp=2,tp=2 --nodes 2 --micro-batch 2
               --plugin-opt sp=on --plugin-opt dp=zero1)
strata_e2e_checks(tp.dp2.zero1.np4 4)
strata_e2e_run(1f1b.dp2.pp2.zero1 4 --plugin 1f1b --mesh dp=2,pp=2 --nodes 2 --micro-batch 1
               --plugin-opt dp=zero1 ${L8})
strata_e2e_checks_l8(1f1b.dp2.pp2.zero1 4)
strata_e2e_run(zb-h1.dp2.pp2.zero1 4 --plugin zb-h1 --mesh dp=2,pp=2 --nodes 2 --micro-batch 1
               --plugin-opt dp=zero1 ${L8})
strata_e2e_checks_l8(zb-h1.dp2.pp2.zero1 4)
strata_e2e_run(1f1b.3d.zero1.np8 8 --plugin 1f1b --mesh dp=2,tp=2,pp=2 --nodes 2 --micro-batch 2
               --plugin-opt sp=on --plugin-opt dp=zero1 ${L8})
strata_e2e_checks_l8(1f1b.3d.zero1.np8 8)
# The other pipelines and tp at 4 and 8 ranks with zero1 on dp (issue 15: every combination at 4
# and 8 ranks): dp=2 x pp=2, dp=2 x tp=2 x pp=2, and tp at dp=4 x tp=2.
foreach(s gpipe interleaved)
  strata_e2e_run(${s}.dp2.pp2.zero1 4 --plugin ${s} --mesh dp=2,pp=2 --nodes 2 --micro-batch 1
                 --plugin-opt dp=zero1 ${L8})
  strata_e2e_checks_l8(${s}.dp2.pp2.zero1 4)
  strata_e2e_run(${s}.3d.zero1.np8 8 --plugin ${s} --mesh dp=2,tp=2,pp=2 --nodes 2 --micro-batch 2
                 --plugin-opt sp=on --plugin-opt dp=zero1 ${L8})
  strata_e2e_checks_l8(${s}.3d.zero1.np8 8)
endforeach()
strata_e2e_run(tp.dp4.zero1.np8 8 --plugin tp --mesh dp=4,tp=2 --nodes 2 --micro-batch 1
               --plugin-opt sp=on --plugin-opt dp=zero1)
strata_e2e_checks(tp.dp4.zero1.np8 8)
# dp=zero2 and dp=fsdp on tp (pp=1, the sharded engine's own schedule): gradients
# reduce-scattered per unit every micro-batch (micro-batch 2 at dp 2: two per step), fsdp's
# parameters all-gathered per unit; the same trajectory, memory and bytes = predict(). 8 ranks:
# dp=4 x tp=2, two micro-batches of 1.
foreach(mode zero2 fsdp)
  strata_e2e_run(tp.dp2.${mode}.np4 4 --plugin tp --mesh dp=2,tp=2 --nodes 2 --micro-batch 2
                 --plugin-opt sp=on --plugin-opt dp=${mode})
  strata_e2e_checks(tp.dp2.${mode}.np4 4)
  strata_e2e_run(tp.dp4.${mode}.np8 8 --plugin tp --mesh dp=4,tp=2 --nodes 2 --micro-batch 1
                 --plugin-opt sp=on --plugin-opt dp=${mode})
  strata_e2e_checks(tp.dp4.${mode}.np8 8)
endforeach()
# dp=zero2 and dp=fsdp under the pipelines, as torchtitan runs FSDP2 with PP (mp::dp_schedule):
# fsdp's parameters all-gathered per unit in each chunk's first forward of the step and kept to its
# last backward, gradients reduce-scattered per unit in the chunk's last backward (the tied
# embedding's units after the stages' exchange). The 1-rank trajectory, memory and bytes =
# predict(); fsdp's parameters (shards) below zero1's replica. tp alone at dp 1 runs the same
# schedule (its zero2 had no gradient buffers before it).
foreach(mode zero2 fsdp)
  strata_e2e_run(1f1b.dp2.pp2.${mode} 4 --plugin 1f1b --mesh dp=2,pp=2 --nodes 2 --micro-batch 1
                 --plugin-opt dp=${mode} ${L8})
  strata_e2e_checks_l8(1f1b.dp2.pp2.${mode} 4)
endforeach()
# zb-h1 under zero2 and fsdp: the same, each unit's gradients reduce-scattered after its chunk's
# last weight pass (where its GEMMs' weight gradients are complete), fsdp's parameters freed after
# the last backward (a weight pass reads none); selective recompute, 4 micro-batches of 1. zb-v
# under fsdp: each chunk of the V gathered and reduced once per step as well.
foreach(mode zero2 fsdp)
  strata_e2e_run(zb-h1.dp2.pp2.${mode} 4 --plugin zb-h1 --mesh dp=2,pp=2 --nodes 2
                 --micro-batch 1 --plugin-opt dp=${mode} --recompute selective ${L8})
  strata_e2e_checks_l8(zb-h1.dp2.pp2.${mode} 4)
endforeach()
strata_e2e_run(zb-v.dp2.pp2.fsdp 4 --plugin zb-v --mesh dp=2,pp=2 --nodes 2 --micro-batch 1
               --plugin-opt dp=fsdp --recompute selective ${L8})
strata_e2e_checks_l8(zb-v.dp2.pp2.fsdp 4)
strata_e2e_run(interleaved.3d.fsdp.np8 8 --plugin interleaved --mesh dp=2,tp=2,pp=2 --nodes 2
               --micro-batch 2 --plugin-opt sp=on --plugin-opt dp=fsdp ${L8})
strata_e2e_checks_l8(interleaved.3d.fsdp.np8 8)
strata_e2e_run(tp.zero2.np2 2 --plugin tp --mesh tp=2 --micro-batch 2 --plugin-opt dp=zero2)
strata_e2e_checks(tp.zero2.np2 2)
add_test(NAME e2e.params-over-dp.1f1b.dp2.pp2.fsdp
         COMMAND check_run less-memory ${E2E_DIR}/1f1b.dp2.pp2.fsdp.h5
                 ${E2E_DIR}/1f1b.dp2.pp2.zero1.h5 params)
set_tests_properties(e2e.params-over-dp.1f1b.dp2.pp2.fsdp PROPERTIES
                     FIXTURES_REQUIRED "run.1f1b.dp2.pp2.fsdp;run.1f1b.dp2.pp2.zero1" LABELS e2e)
# offload=optimizer on every data-parallel axis that shards the optimizer: under tp (dp=zero1,
# zero2, fsdp; fsdp's gathers two units ahead) and under a pipeline (1f1b, dp=zero1: Megatron's
# distributed optimizer with its CPU offload; dp=fsdp, two units ahead), one update path for all (sharded::HostUpdate). The
# 1-rank trajectory, memory per tag (offload included) and bytes (d2h and h2d included) = predict.
strata_e2e_run(tp.dp2.zero1.offload.np4 4 --plugin tp --mesh dp=2,tp=2 --nodes 2 --micro-batch 2
               --plugin-opt sp=on --plugin-opt dp=zero1 --plugin-opt offload=optimizer)
strata_e2e_checks(tp.dp2.zero1.offload.np4 4)
strata_e2e_run(1f1b.dp2.pp2.zero1.offload 4 --plugin 1f1b --mesh dp=2,pp=2 --nodes 2
               --micro-batch 1 --plugin-opt dp=zero1 --plugin-opt offload=optimizer ${L8})
strata_e2e_checks_l8(1f1b.dp2.pp2.zero1.offload 4)
strata_e2e_run(1f1b.dp2.pp2.fsdp.offload 4 --plugin 1f1b --mesh dp=2,pp=2 --nodes 2
               --micro-batch 1 --plugin-opt dp=fsdp --plugin-opt offload=optimizer
               --plugin-opt prefetch=2 ${L8})
strata_e2e_checks_l8(1f1b.dp2.pp2.fsdp.offload 4)
foreach(mode zero2 fsdp)
  strata_e2e_run(tp.dp2.${mode}.offload.np4 4 --plugin tp --mesh dp=2,tp=2 --nodes 2
                 --micro-batch 2 --plugin-opt sp=on --plugin-opt dp=${mode}
                 --plugin-opt offload=optimizer --plugin-opt prefetch=2)
  strata_e2e_checks(tp.dp2.${mode}.offload.np4 4)
endforeach()
# Gradients: zero2 holds the owned shards plus the embedding unit's and one other unit's padded
# buffer, less than zero1's whole padded buffer plus its shard (the exact bytes: the predicted
# checks above); fsdp holds parameter shards only, less than zero2's replica.
add_test(NAME e2e.grads-over-dp.tp.dp2.zero2.np4
         COMMAND check_run less-memory ${E2E_DIR}/tp.dp2.zero2.np4.h5 ${E2E_DIR}/tp.dp2.zero1.np4.h5 grads)
add_test(NAME e2e.params-over-dp.tp.dp2.fsdp.np4
         COMMAND check_run less-memory ${E2E_DIR}/tp.dp2.fsdp.np4.h5 ${E2E_DIR}/tp.dp2.zero2.np4.h5 params)
set_tests_properties(e2e.grads-over-dp.tp.dp2.zero2.np4 PROPERTIES
                     FIXTURES_REQUIRED "run.tp.dp2.zero2.np4;run.tp.dp2.zero1.np4" LABELS e2e)
set_tests_properties(e2e.params-over-dp.tp.dp2.fsdp.np4 PROPERTIES
                     FIXTURES_REQUIRED "run.tp.dp2.fsdp.np4;run.tp.dp2.zero2.np4" LABELS e2e)
foreach(pair "tp.dp2.zero1.np4;tp.dp2.np4" "1f1b.dp2.pp2.zero1;1f1b.dp2.pp2"
        "1f1b.3d.zero1.np8;1f1b.3d.np8" "tp.dp2.zero2.np4;tp.dp2.np4" "tp.dp2.fsdp.np4;tp.dp2.np4")
  list(GET pair 0 zero1)
  list(GET pair 1 allreduce)
  add_test(NAME e2e.optimizer-over-dp.${zero1}
           COMMAND check_run memory-ratio ${E2E_DIR}/${zero1}.h5 ${E2E_DIR}/${allreduce}.h5
                   optimizer 0.5 4)
  set_tests_properties(e2e.optimizer-over-dp.${zero1} PROPERTIES
                       FIXTURES_REQUIRED "run.${zero1};run.${allreduce}" LABELS e2e)
endforeach()
# Padding: dp=4 over 64215 local parameters (hidden 45, vocab 255) gives shards of 16054 real
# elements and a last one of 16053. zero1 follows the allreduce run, matches predict(), and holds a
# quarter of its optimizer state within the padding (under one element of 8 bytes).
set(PADDED --plugin tp --mesh dp=4 --nodes 2 --micro-batch 2 --hidden 45 --heads 5 --vocab 255)
strata_e2e_run(tp.dp4.padded.np4 4 ${PADDED})
strata_e2e_run(tp.dp4.padded.zero1.np4 4 ${PADDED} --plugin-opt dp=zero1)
add_test(NAME e2e.trajectory.tp.dp4.padded.zero1.np4
         COMMAND check_run trajectory ${E2E_DIR}/tp.dp4.padded.np4.h5
                 ${E2E_DIR}/tp.dp4.padded.zero1.np4.h5 ${E2E_LOSS_TOL})
add_test(NAME e2e.predicted.tp.dp4.padded.zero1.np4
         COMMAND check_run predicted ${E2E_DIR}/tp.dp4.padded.zero1.np4.h5)
add_test(NAME e2e.optimizer-over-dp.tp.dp4.padded.zero1.np4
         COMMAND check_run memory-ratio ${E2E_DIR}/tp.dp4.padded.zero1.np4.h5
                 ${E2E_DIR}/tp.dp4.padded.np4.h5 optimizer 0.25 8)
set_tests_properties(e2e.trajectory.tp.dp4.padded.zero1.np4
                     e2e.optimizer-over-dp.tp.dp4.padded.zero1.np4 PROPERTIES
                     FIXTURES_REQUIRED "run.tp.dp4.padded.np4;run.tp.dp4.padded.zero1.np4" LABELS e2e)
set_tests_properties(e2e.predicted.tp.dp4.padded.zero1.np4 PROPERTIES
                     FIXTURES_REQUIRED run.tp.dp4.padded.zero1.np4 LABELS e2e)
# zero2 and fsdp on the same padded shards (every unit padded to a multiple of 4).
foreach(mode zero2 fsdp)
  strata_e2e_run(tp.dp4.padded.${mode}.np4 4 ${PADDED} --plugin-opt dp=${mode})
  add_test(NAME e2e.trajectory.tp.dp4.padded.${mode}.np4
           COMMAND check_run trajectory ${E2E_DIR}/tp.dp4.padded.np4.h5
                   ${E2E_DIR}/tp.dp4.padded.${mode}.np4.h5 ${E2E_LOSS_TOL})
  add_test(NAME e2e.predicted.tp.dp4.padded.${mode}.np4
           COMMAND check_run predicted ${E2E_DIR}/tp.dp4.padded.${mode}.np4.h5)
  set_tests_properties(e2e.trajectory.tp.dp4.padded.${mode}.np4 PROPERTIES
                       FIXTURES_REQUIRED "run.tp.dp4.padded.np4;run.tp.dp4.padded.${mode}.np4" LABELS e2e)
  set_tests_properties(e2e.predicted.tp.dp4.padded.${mode}.np4 PROPERTIES
                       FIXTURES_REQUIRED run.tp.dp4.padded.${mode}.np4 LABELS e2e)
endforeach()

add_test(NAME e2e.trace.gpipe.pp4 COMMAND check_run trace ${E2E_DIR}/gpipe.pp4.h5)
set_tests_properties(e2e.trace.gpipe.pp4 PROPERTIES FIXTURES_REQUIRED run.gpipe.pp4 LABELS e2e)
# 1F1B holds at most pp micro-batches of activations, GPipe all m = 8.
add_test(NAME e2e.activations.1f1b-vs-gpipe
         COMMAND check_run less-memory ${E2E_DIR}/1f1b.pp4.h5 ${E2E_DIR}/gpipe.pp4.h5 activations)
set_tests_properties(e2e.activations.1f1b-vs-gpipe PROPERTIES
                     FIXTURES_REQUIRED "run.1f1b.pp4;run.gpipe.pp4" LABELS e2e)

# Recompute under model parallelism: tp (with and without sp) and every pipeline schedule with
# --recompute full and selective, each on its 1-rank trajectory, with memory and collective bytes
# equal to predict() (a full recompute repeats a block's tp collectives in backward) and less
# activation memory than the same run without recompute.
# strata_e2e_recompute(<base id> <ranks> <checks function> <runner args...>)
function(strata_e2e_recompute base ranks checks)
  foreach(mode full selective)
    set(id ${base}.recompute-${mode})
    strata_e2e_run(${id} ${ranks} ${ARGN} --recompute ${mode})
    cmake_language(CALL ${checks} ${id} ${ranks})
    add_test(NAME e2e.activations.${id}
             COMMAND check_run less-memory ${E2E_DIR}/${id}.h5 ${E2E_DIR}/${base}.h5 activations)
    set_tests_properties(e2e.activations.${id} PROPERTIES
                         FIXTURES_REQUIRED "run.${id};run.${base}" LABELS e2e)
  endforeach()
endfunction()
strata_e2e_recompute(tp.np2 2 strata_e2e_checks --plugin tp --mesh tp=2 --micro-batch 2)
strata_e2e_recompute(tp.sp.np2 2 strata_e2e_checks --plugin tp --mesh tp=2 --micro-batch 2
                     --plugin-opt sp=on)
foreach(s gpipe 1f1b interleaved)
  strata_e2e_recompute(${s}.pp2 2 strata_e2e_checks_l8 --plugin ${s} --mesh pp=2 --micro-batch 2 ${L8})
endforeach()

# Context parallelism (the cp plugin, Ulysses): tiny's sequences split over cp 2 and 4 (4 heads,
# so one or two heads per rank in the attention), with dp (the gradients reduced over dp x cp,
# zero1's state sharded over it, fsdp's parameters too), with tp and sequence parallelism (tp x cp
# = 4 divides the heads), and under a pipeline (1f1b's boundaries carry the rank's slice of each
# sequence); each on the 1-rank trajectory with memory and bytes (the all-to-alls) = predict().
foreach(n 2 4)
  strata_e2e_run(cp.np${n} ${n} --plugin cp --mesh cp=${n} --micro-batch 2)
  strata_e2e_checks(cp.np${n} ${n})
endforeach()
strata_e2e_run(cp.dp2.zero1.np4 4 --plugin cp --mesh dp=2,cp=2 --nodes 2 --micro-batch 2
               --plugin-opt dp=zero1)
strata_e2e_run(cp.dp2.fsdp.np4 4 --plugin cp --mesh dp=2,cp=2 --micro-batch 2 --plugin-opt dp=fsdp)
strata_e2e_run(cp.tp2.sp.np4 4 --plugin cp --mesh tp=2,cp=2 --micro-batch 2 --plugin-opt sp=on)
foreach(id cp.dp2.zero1.np4 cp.dp2.fsdp.np4 cp.tp2.sp.np4)
  strata_e2e_checks(${id} 4)
endforeach()
strata_e2e_run(1f1b.cp2.pp2 4 --plugin 1f1b --mesh cp=2,pp=2 --micro-batch 2 ${L8})
strata_e2e_checks_l8(1f1b.cp2.pp2 4)
# Ring attention: each rank's key-value blocks around cp 2 and 4 on a comm stream (their bytes
# the plan's sends and receives), with tp 2 beside it (ring needs no head split over cp), and
# under fsdp over dp 2 x cp 2 (its prefetches on comm streams of their own at the same time).
strata_e2e_run(cp.ring.np2 2 --plugin cp --mesh cp=2 --micro-batch 2 --plugin-opt attention=ring)
strata_e2e_run(cp.ring.np4 4 --plugin cp --mesh cp=4 --micro-batch 2 --plugin-opt attention=ring)
strata_e2e_run(cp.ring.tp2.np4 4 --plugin cp --mesh tp=2,cp=2 --micro-batch 2
               --plugin-opt attention=ring)
strata_e2e_run(cp.ring.dp2.fsdp.np4 4 --plugin cp --mesh dp=2,cp=2 --micro-batch 2
               --plugin-opt dp=fsdp --plugin-opt attention=ring)
strata_e2e_checks(cp.ring.np2 2)
foreach(id cp.ring.np4 cp.ring.tp2.np4 cp.ring.dp2.fsdp.np4)
  strata_e2e_checks(${id} 4)
endforeach()

