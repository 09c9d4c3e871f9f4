# --device cuda --transport nccl end to end, on any machine: runner_emu (the runner with the CUDA
# backend on the CUDA emulator and the NCCL transport on the NCCL stand-in) against the CPU runner
# on the same arguments. dp, ddp, zero3 and 1f1b at 1 and 2 ranks, fsdp, tp (sp), interleaved and
# zero3 with offload=optimizer at 2, 1f1b with dp=fsdp at dp 2 x pp 2, in fp32, and five bf16 runs
# (ddp, zero3, tp, 1f1b and cp with ring attention): each follows the CPU run's loss trajectory,
# keeps the memory and bytes predict() gives, and records a device peak. Short runs (6 steps,
# micro-batch 2): the emulator runs every CUDA thread of every kernel on the host, as fibers on one
# host thread (its default), about 0.3 s per step here.
#
# Tolerances: fp32 1e-5 as every e2e trajectory (measured: at most 2e-7 over 6 steps; the CUDA
# path differs by summation order: fused attention, cuBLAS's GEMMs, its reductions); bf16 the bf16
# issue's 2e-3 (measured 2e-4).
set(E2E_CUDA_STEPS 6)
set(E2E_CUDA_ENV ${E2E_ENV} STRATA_CUDA_EMU_DEVICES=2)

# strata_e2e_cuda(<id> <ranks> <tolerance> <runner args...>): cuda.<id>.cpu and cuda.<id>.gpu
# (E2E_CUDA_GPU_ARGS: arguments of the GPU side only).
function(strata_e2e_cuda id ranks tol)
  foreach(side cpu gpu)
    if(side STREQUAL "cpu")
      set(exe $<TARGET_FILE:runner>)
      set(extra)
    else()
      set(exe $<TARGET_FILE:runner_emu>)
      # The emulator is in no peak table: a peak given keeps MFU defined (and --peak-tflops used).
      set(extra --device cuda --transport nccl --peak-tflops 0.01 ${E2E_CUDA_GPU_ARGS})
    endif()
    set(cmd ${exe})
    if(ranks GREATER 1)
      set(cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${MPI_FLAGS} ${exe})
    endif()
    set(run cuda.${id}.${side})
    add_test(NAME e2e.run.${run}
             COMMAND ${cmd} --model tiny --steps ${E2E_CUDA_STEPS} --global-batch 8 --out ${E2E_DIR}
                     --quiet --overwrite --watchdog 120 --run-id ${run} ${extra} ${ARGN})
    set_tests_properties(e2e.run.${run} PROPERTIES FIXTURES_SETUP run.${run} LABELS e2e
                         ENVIRONMENT "${E2E_CUDA_ENV}" TIMEOUT 300)
    strata_e2e_lock_cores(e2e.run.${run} ${ranks})
  endforeach()
  set(gpu ${E2E_DIR}/cuda.${id}.gpu.h5)
  # --attention auto: the own tensor-core kernel in a bf16 run (tiny's head size 16 is one it
  # takes), the fp32 reference otherwise; cudnn where the GPU side asks for it.
  set(attention reference)
  if("cudnn" IN_LIST E2E_CUDA_GPU_ARGS)
    set(attention cudnn)
  elseif("bf16" IN_LIST ARGN)
    set(attention own)
  endif()
  add_test(NAME e2e.layout.cuda.${id} COMMAND check_run layout ${gpu} ${ranks} ${E2E_CUDA_STEPS})
  add_test(NAME e2e.predicted.cuda.${id} COMMAND check_run predicted ${gpu})
  add_test(NAME e2e.device.cuda.${id} COMMAND check_run device ${gpu} cuda ${attention})
  set_tests_properties(e2e.layout.cuda.${id} e2e.predicted.cuda.${id} e2e.device.cuda.${id}
                       PROPERTIES FIXTURES_REQUIRED run.cuda.${id}.gpu LABELS e2e)
  add_test(NAME e2e.cuda-follows-cpu.${id}
           COMMAND check_run trajectory ${E2E_DIR}/cuda.${id}.cpu.h5 ${gpu} ${tol})
  set_tests_properties(e2e.cuda-follows-cpu.${id} PROPERTIES LABELS e2e
                       FIXTURES_REQUIRED "run.cuda.${id}.cpu;run.cuda.${id}.gpu")
endfunction()

# One GPU per rank: two ranks on a node with one (emulated) GPU are refused before either starts.
add_test(NAME cli.cuda_gpu_per_rank
         COMMAND runner_emu --plugin ddp --device cuda --transport nccl --nodes 1
                 --ranks-per-node 2 --out ${E2E_DIR})
set_tests_properties(cli.cuda_gpu_per_rank PROPERTIES LABELS cli ENVIRONMENT "${E2E_ENV}"
                     PASS_REGULAR_EXPRESSION
                     "runner: error: --device cuda: 2 ranks on this node but 1 GPU\\(s\\): one GPU per rank")

# Under mpirun (or srun) each rank may see only its own GPU, so the count is not checked before
# the ranks start: two ranks that end up on one GPU (the same UUID) end the job with a run file
# that names them.
add_test(NAME e2e.fail.cuda.shared-gpu
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPI_FLAGS} $<TARGET_FILE:runner_emu>
                 --model tiny --steps 2 --global-batch 8 --out ${E2E_DIR} --quiet --plugin ddp
                 --micro-batch 4 --device cuda --transport nccl --overwrite --run-id fail.cuda.shared-gpu)
set_tests_properties(e2e.fail.cuda.shared-gpu PROPERTIES WILL_FAIL TRUE LABELS e2e
                     FIXTURES_SETUP fail.cuda.shared-gpu ENVIRONMENT "${E2E_ENV}" TIMEOUT 120
                     RESOURCE_LOCK cores)
add_test(NAME e2e.failfile.cuda.shared-gpu
         COMMAND check_run status ${E2E_DIR}/fail.cuda.shared-gpu.h5 failed
                 "--device cuda: ranks 0 and 1 share one GPU")
set_tests_properties(e2e.failfile.cuda.shared-gpu PROPERTIES LABELS e2e
                     FIXTURES_REQUIRED fail.cuda.shared-gpu)

foreach(n 1 2)
  strata_e2e_cuda(dp.np${n} ${n} ${E2E_LOSS_TOL} --plugin dp --micro-batch 2)
  strata_e2e_cuda(ddp.np${n} ${n} ${E2E_LOSS_TOL} --plugin ddp --micro-batch 2
                  --plugin-opt bucket_mb=0.1)
  strata_e2e_cuda(zero3.np${n} ${n} ${E2E_LOSS_TOL} --plugin zero3 --micro-batch 2)
  strata_e2e_cuda(1f1b.pp${n} ${n} ${E2E_LOSS_TOL} --plugin 1f1b --mesh pp=${n} --micro-batch 2)
endforeach()
# The other families at 2 ranks: fsdp, tensor parallel with sequence parallel (the model's
# collectives inside a block), and the interleaved pipeline (activations and gradients both ways
# between the two ranks, on two comm streams: tags received out of their sending order).
strata_e2e_cuda(fsdp.np2 2 ${E2E_LOSS_TOL} --plugin fsdp --micro-batch 2)
strata_e2e_cuda(tp.np2 2 ${E2E_LOSS_TOL} --plugin tp --mesh tp=2 --micro-batch 2 --plugin-opt sp=on)
strata_e2e_cuda(interleaved.pp2 2 ${E2E_LOSS_TOL} --plugin interleaved --mesh pp=2 --micro-batch 2
                --layers 4)
# zb-h1: the blocks' deferred d(output)s copied in device memory, their weight GEMMs later.
strata_e2e_cuda(zb-h1.pp2 2 ${E2E_LOSS_TOL} --plugin zb-h1 --mesh pp=2 --micro-batch 2 --layers 4)
# zb-v: the V's sends in both directions through the NCCL stand-in, its turn a device copy.
strata_e2e_cuda(zb-v.pp2 2 ${E2E_LOSS_TOL} --plugin zb-v --mesh pp=2 --micro-batch 2 --layers 4)
# cp: Ulysses' row permutations as the device's gather kernel, its all-to-alls on device memory
# through the NCCL stand-in, the attention over whole sequences on 2 of tiny's 4 heads.
strata_e2e_cuda(cp.np2 2 ${E2E_LOSS_TOL} --plugin cp --mesh cp=2 --micro-batch 2)
# Ring attention: the blocks' kernels, the key-value passes on a comm stream through the NCCL
# stand-in's send and recv.
strata_e2e_cuda(cp.ring.np2 2 ${E2E_LOSS_TOL} --plugin cp --mesh cp=2 --micro-batch 2
                --plugin-opt attention=ring)
# FSDP under a pipeline (dp 2 x pp 2, 4 ranks on this one machine, so 4 emulated GPUs): the
# units gathered on the comm stream behind the compute event, two ahead, and reduce-scattered in
# the last micro-batch's backward, in device memory with the NCCL stand-in.
set(_devices_of_two ${E2E_CUDA_ENV})
set(E2E_CUDA_ENV ${E2E_ENV} STRATA_CUDA_EMU_DEVICES=4)
strata_e2e_cuda(1f1b.dp2.pp2.fsdp 4 ${E2E_LOSS_TOL} --plugin 1f1b --mesh dp=2,pp=2 --nodes 2
                --micro-batch 1 --layers 8 --plugin-opt dp=fsdp --plugin-opt prefetch=2)
set(E2E_CUDA_ENV ${_devices_of_two})
# Optimizer offload with the parameters and gradients in (emulated) device memory: the gradient
# shard copied device->host, AdamW on the host, the parameter shard copied host->device. On the
# CPU run's trajectory and predict(), and no optimizer state on the device.
strata_e2e_cuda(zero3.offload.np2 2 ${E2E_LOSS_TOL} --plugin zero3 --micro-batch 2
                --plugin-opt offload=optimizer)
add_test(NAME e2e.offload.no-device-optimizer.cuda.zero3.offload.np2
         COMMAND check_run memory-ratio ${E2E_DIR}/cuda.zero3.offload.np2.gpu.h5
                 ${E2E_DIR}/cuda.zero3.np2.gpu.h5 optimizer 0 0)
add_test(NAME e2e.offload.host-optimizer.cuda.zero3.offload.np2
         COMMAND check_run memory-plus ${E2E_DIR}/cuda.zero3.offload.np2.gpu.h5
                 ${E2E_DIR}/cuda.zero3.np2.gpu.h5 offload optimizer 482304)
# The copies in /comm (d2h, h2d through the device backend's copies) as on the CPU: = predict(),
# 8 and 4 bytes per parameter of tiny (120576) per step over the ranks.
add_test(NAME e2e.offload.transfers.cuda.zero3.offload.np2
         COMMAND check_run transfers ${E2E_DIR}/cuda.zero3.offload.np2.gpu.h5 964608 482304)
set_tests_properties(e2e.offload.no-device-optimizer.cuda.zero3.offload.np2
                     e2e.offload.host-optimizer.cuda.zero3.offload.np2
                     e2e.offload.transfers.cuda.zero3.offload.np2 PROPERTIES LABELS e2e
                     FIXTURES_REQUIRED "run.cuda.zero3.offload.np2.gpu;run.cuda.zero3.np2.gpu")
if(STRATA_WITH_ONEDNN)  # the CPU side's bf16 GEMMs
  strata_e2e_cuda(ddp.np2.bf16 2 2e-3 --plugin ddp --micro-batch 2 --precision bf16)
  strata_e2e_cuda(zero3.np2.bf16 2 2e-3 --plugin zero3 --micro-batch 2 --precision bf16
                  --reduce-dtype bf16)
  # Activations in bf16 across the tp collectives (sp: all-gathers, reduce-scatters) and the
  # pipeline's sends, rounded and widened by the device's kernels (--tp-comm-dtype's default).
  strata_e2e_cuda(tp.np2.bf16 2 2e-3 --plugin tp --mesh tp=2 --micro-batch 2 --plugin-opt sp=on
                  --precision bf16 --trace)
  # Its phases timed by compute-stream events: each rank's trace intervals add up to /steps.
  add_test(NAME e2e.trace.cuda.tp.np2.bf16 COMMAND check_run trace ${E2E_DIR}/cuda.tp.np2.bf16.gpu.h5)
  set_tests_properties(e2e.trace.cuda.tp.np2.bf16 PROPERTIES LABELS e2e
                       FIXTURES_REQUIRED run.cuda.tp.np2.bf16.gpu)
  strata_e2e_cuda(1f1b.pp2.bf16 2 2e-3 --plugin 1f1b --mesh pp=2 --micro-batch 2 --precision bf16)
  # Ring attention in bf16: its blocks on the own tensor-core kernels (bf16 q | k | v, the fp32
  # out and lse merged block by block), the key-value passes in bf16.
  strata_e2e_cuda(cp.ring.np2.bf16 2 2e-3 --plugin cp --mesh cp=2 --micro-batch 2
                  --plugin-opt attention=ring --precision bf16)
  # cuDNN's attention (cuda/cudnn_attention.cpp) on the cuDNN stand-in (tests/cudnn_standin): its
  # graphs as backend descriptors, planned, executed on the stream with the variant packs' bf16
  # q | k | v, out, dout and gradients, the zeroed dQ accumulator and the workspace, the gradients
  # added into the fp32 dqkv.
  if(TARGET cudnn_standin)
    set(E2E_CUDA_GPU_ARGS --attention cudnn)
    strata_e2e_cuda(ddp.np2.bf16.cudnn 2 2e-3 --plugin ddp --micro-batch 2 --precision bf16)
    unset(E2E_CUDA_GPU_ARGS)
  endif()
endif()

# runner --calibrate on --device cuda (the emulator): a cuda profile entry and comm fits over nccl,
# used by --dry-run --profile and stored beside a run's measurement.
add_test(NAME cli.calibrate_cuda COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/calibrate_cuda.sh
                                         $<TARGET_FILE:runner_emu> ${E2E_DIR}/calibrate_cuda)
# The longest `cores`-locked test under ASan (117 s in the CI of 2026-12-04, 32 s in Release): a
# COST starts it first in a fresh clone (no timings of its own yet), not last beside nothing.
set_tests_properties(cli.calibrate_cuda PROPERTIES LABELS cli ENVIRONMENT "${E2E_CUDA_ENV}"
                     TIMEOUT 300 RESOURCE_LOCK cores COST 500)

# The run's profiler ranges (NVTX on a GPU; the emulator logs them): steps, micro-batches, phases
# and comm calls named as in --trace, on every rank, each closed.
add_test(NAME cli.nvtx_ranges COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/nvtx_ranges.sh
                                      $<TARGET_FILE:runner_emu> ${E2E_DIR}/nvtx_ranges)
set_tests_properties(cli.nvtx_ranges PROPERTIES LABELS cli ENVIRONMENT "${E2E_CUDA_ENV}"
                     TIMEOUT 300 RESOURCE_LOCK cores)

# --attention own refused before any work where the tensor-core kernel cannot run: an fp32 run,
# and a head size that is no multiple of 16 (72 / 3 = 24).
add_test(NAME cli.attention_own_fp32
         COMMAND runner_emu --plugin ddp --device cuda --transport nccl --attention own
                 --out ${E2E_DIR})
add_test(NAME cli.attention_own_head_size
         COMMAND runner_emu --plugin ddp --device cuda --transport nccl --attention own
                 --precision bf16 --hidden 72 --heads 3 --out ${E2E_DIR})
set_tests_properties(cli.attention_own_fp32 PROPERTIES LABELS cli ENVIRONMENT "${E2E_ENV}"
                     PASS_REGULAR_EXPRESSION "runner: error: --attention own: bf16 tensor cores; needs --precision bf16")
set_tests_properties(cli.attention_own_head_size PROPERTIES LABELS cli ENVIRONMENT "${E2E_ENV}"
                     PASS_REGULAR_EXPRESSION "--attention own: head size 24 \\(--hidden / --heads\\) must be a multiple of 16")
# --attention cudnn: the same refusals; and the emulated backend, which has no cuDNN, says so
# before the run starts.
add_test(NAME cli.attention_cudnn_head_size
         COMMAND runner_emu --plugin ddp --device cuda --transport nccl --attention cudnn
                 --precision bf16 --hidden 60 --heads 3 --out ${E2E_DIR})
set_tests_properties(cli.attention_cudnn_head_size PROPERTIES LABELS cli ENVIRONMENT "${E2E_ENV}"
                     PASS_REGULAR_EXPRESSION "--attention cudnn: head size 20 \\(--hidden / --heads\\) must be a multiple of 8 up to 128")
if(NOT TARGET cudnn_standin)  # else the emulated backend has cuDNN's attention on the stand-in
  add_test(NAME cli.attention_cudnn_not_built
           COMMAND runner_emu --plugin ddp --device cuda --transport nccl --attention cudnn
                   --precision bf16 --out ${E2E_DIR})
  set_tests_properties(cli.attention_cudnn_not_built PROPERTIES LABELS cli ENVIRONMENT "${E2E_ENV}"
                       PASS_REGULAR_EXPRESSION "runner: error: --device cuda: this build's CUDA backend has no cuDNN for --attention cudnn")
endif()

# --cuda-graphs: each run of unit passes with no comm inside captured once as a CUDA graph (on the
# emulator's stream capture, with CUDA's rules of capture) and replayed from its third call on.
# Each run on the CPU run's trajectory without graphs, memory and bytes = predict(), and its line
# counting graphs and launches exact: dp at 1 rank (a forward and a backward graph, 24 calls each
# over 6 steps x 4 micro-batches: 2 x 23 launches); zero1 at 2 (2 x 11); ddp at 2, whose last
# micro-batch's backward issues its bucket all-reduces and runs as it is (forward 11, backward 5);
# 1f1b at pp 2 in bf16, each stage's chunk passes in its two activation slots (4 graphs, 48 - 4
# launches), the sends between them.
set(E2E_CUDA_GPU_ARGS --cuda-graphs)
strata_e2e_cuda(dp.graphs.np1 1 ${E2E_LOSS_TOL} --plugin dp --micro-batch 2)
strata_e2e_cuda(zero1.graphs.np2 2 ${E2E_LOSS_TOL} --plugin zero1 --micro-batch 2)
strata_e2e_cuda(ddp.graphs.np2 2 ${E2E_LOSS_TOL} --plugin ddp --micro-batch 2
                --plugin-opt bucket_mb=0.1)
set(graph_cases "dp.graphs.np1=2 captured, 46" "zero1.graphs.np2=2 captured, 22"
                "ddp.graphs.np2=2 captured, 16")
if(STRATA_WITH_ONEDNN)  # the CPU side's bf16 GEMMs
  strata_e2e_cuda(1f1b.graphs.pp2 2 2e-3 --plugin 1f1b --mesh pp=2 --micro-batch 2
                  --precision bf16)
  list(APPEND graph_cases "1f1b.graphs.pp2=4 captured, 44")
  if(TARGET cudnn_standin)  # cuDNN's executions (the stand-in's) and accumulator zeroing captured
    set(E2E_CUDA_GPU_ARGS --cuda-graphs --attention cudnn)
    strata_e2e_cuda(1f1b.graphs.cudnn.pp2 2 2e-3 --plugin 1f1b --mesh pp=2 --micro-batch 2
                    --precision bf16)
    list(APPEND graph_cases "1f1b.graphs.cudnn.pp2=4 captured, 44")
  endif()
endif()
unset(E2E_CUDA_GPU_ARGS)
foreach(case ${graph_cases})
  string(REPLACE "=" ";" case "${case}")
  list(GET case 0 id)
  list(GET case 1 counts)
  set_tests_properties(e2e.run.cuda.${id}.gpu PROPERTIES PASS_REGULAR_EXPRESSION
                       "strata: CUDA graphs: ${counts} launches on rank 0")
endforeach()
# Refused before any work, in one line: without --device cuda; where comm runs between the unit
# passes of every micro-batch (zero3) or inside them (tp).
add_test(NAME cli.cuda_graphs.needs_cuda
         COMMAND runner --plugin dp --model tiny --cuda-graphs --out ${E2E_DIR})
add_test(NAME cli.cuda_graphs.zero3
         COMMAND runner_emu --plugin zero3 --model tiny --device cuda --transport nccl
                 --cuda-graphs --out ${E2E_DIR})
add_test(NAME cli.cuda_graphs.tp
         COMMAND runner_emu --plugin tp --mesh tp=2 --model tiny --device cuda --transport nccl
                 --cuda-graphs --out ${E2E_DIR})
set_tests_properties(cli.cuda_graphs.needs_cuda PROPERTIES PASS_REGULAR_EXPRESSION
                     "runner: error: --cuda-graphs: CUDA graphs need --device cuda")
set_tests_properties(cli.cuda_graphs.zero3 PROPERTIES PASS_REGULAR_EXPRESSION
                     "runner: error: --cuda-graphs: zero3 cannot be captured: every micro-batch has a wait between its unit passes")
set_tests_properties(cli.cuda_graphs.tp PROPERTIES PASS_REGULAR_EXPRESSION
                     "runner: error: --cuda-graphs: tp cannot be captured: tensor parallelism has collectives inside the passes")
set_tests_properties(cli.cuda_graphs.needs_cuda cli.cuda_graphs.zero3 cli.cuda_graphs.tp
                     PROPERTIES LABELS cli ENVIRONMENT "${E2E_CUDA_ENV}")
