# The llama family end to end (--arch llama: RMSNorm, SwiGLU, rotary positions, grouped-query
# attention, an untied LM head): tiny's sizes with 4 blocks, 8 query heads sharing 4 K/V heads
# (head size 8, so that tp = 2 and 4 split both) and an MLP of 192, against its own 1-rank
# reference at 1, 2 and 4 ranks: data parallel, ZeRO-3 and FSDP, tensor parallel (with sp), the
# pipelines (an untied head: no embedding exchange between the first and the last stage) and
# their meshes; each on the reference's trajectory within 1e-5 with memory and bytes = predict().
# Then bf16 runs on their bf16 reference (bf16.cmake's tolerances) and the CUDA backend on the
# emulator against the CPU (cuda.cmake's), with head size 16 there (the own tensor-core
# attention's tile) and GQA of 4 heads on 2.
set(LLAMA --arch llama --layers 4 --heads 8 --kv-heads 4 --ffn 192)

# strata_e2e_llama(<id> <ranks> <runner args...>): the run and its checks against the reference.
function(strata_e2e_llama id ranks)
  strata_e2e_run(${id} ${ranks} ${LLAMA} ${ARGN})
  strata_e2e_checks_against(${id} ${ranks} llama.reference ${E2E_LOSS_TOL})
endfunction()

strata_e2e_llama(llama.reference 1 --plugin dp --micro-batch 8)
strata_e2e_llama(llama.ddp.np1 1 --plugin ddp --micro-batch 2)
strata_e2e_llama(llama.ddp.np2 2 --plugin ddp --micro-batch 2)
strata_e2e_llama(llama.zero3.np4 4 --plugin zero3 --micro-batch 2 --nodes 2)
strata_e2e_llama(llama.fsdp.np2 2 --plugin fsdp --micro-batch 2)
strata_e2e_llama(llama.tp.np2 2 --plugin tp --mesh tp=2 --micro-batch 2)
strata_e2e_llama(llama.tp.sp.np4 4 --plugin tp --mesh tp=4 --micro-batch 2 --plugin-opt sp=on)
strata_e2e_llama(llama.1f1b.pp2 2 --plugin 1f1b --mesh pp=2 --micro-batch 2)
strata_e2e_llama(llama.zb-h1.pp2 2 --plugin zb-h1 --mesh pp=2 --micro-batch 2)
strata_e2e_llama(llama.zb-v.pp2 2 --plugin zb-v --mesh pp=2 --micro-batch 2)  # untied: no sum
strata_e2e_llama(llama.gpipe.pp4 4 --plugin gpipe --mesh pp=4 --micro-batch 1)
strata_e2e_llama(llama.1f1b.tp2.pp2 4 --plugin 1f1b --mesh tp=2,pp=2 --micro-batch 2)
strata_e2e_llama(llama.1f1b.dp2.pp2.fsdp 4 --plugin 1f1b --mesh dp=2,pp=2 --nodes 2
                 --micro-batch 1 --plugin-opt dp=fsdp)
# Context parallelism: the rotary positions of each rank's slice, grouped-query attention's K/V
# repeated before the all-to-all; cp 4 with selective recompute (the attention rerun on the kept,
# exchanged q | k | v) and zb-h1 over cp 2 x pp 2 (the split backward's weight passes).
strata_e2e_llama(llama.cp.np2 2 --plugin cp --mesh cp=2 --micro-batch 2)
strata_e2e_llama(llama.cp.np4.selective 4 --plugin cp --mesh cp=4 --micro-batch 2
                 --recompute selective)
strata_e2e_llama(llama.zb-h1.cp2.pp2 4 --plugin zb-h1 --mesh cp=2,pp=2 --micro-batch 1)
# Ring attention on the llama: the K/V heads passed once (not repeated), selective recompute's
# ring forward again in the backward.
strata_e2e_llama(llama.cp.ring.np4.selective 4 --plugin cp --mesh cp=4 --micro-batch 2
                 --recompute selective --plugin-opt attention=ring)
# Not the GPT-2 model: the same sizes as gpt2 train to another trajectory (a llama run that fell
# back to the GPT-2 block would pass every check above).
add_test(NAME e2e.llama-is-not-gpt2
         COMMAND check_run trajectory ${E2E_DIR}/llama.reference.h5 ${E2E_DIR}/llama.as-gpt2.h5 1e-3)
strata_e2e_run(llama.as-gpt2 1 --plugin dp --micro-batch 8 --layers 4 --heads 8 --ffn 192)
set_tests_properties(e2e.llama-is-not-gpt2 PROPERTIES LABELS e2e
                     PASS_REGULAR_EXPRESSION "step [0-9]+ loss [0-9.]+ vs reference"
                     FIXTURES_REQUIRED "run.llama.reference;run.llama.as-gpt2")

if(STRATA_WITH_ONEDNN)
  strata_e2e_bf16(llama.bf16.reference 1 llama.bf16.reference ${LLAMA} --plugin dp --micro-batch 8)
  strata_e2e_bf16(llama.bf16.zero3.np2 2 llama.bf16.reference ${LLAMA} --plugin zero3
                  --micro-batch 2)
  strata_e2e_bf16(llama.bf16.tp.sp.np2 2 llama.bf16.reference ${LLAMA} --plugin tp --mesh tp=2
                  --micro-batch 2 --plugin-opt sp=on)
  strata_e2e_bf16(llama.bf16.1f1b.pp2 2 llama.bf16.reference ${LLAMA} --plugin 1f1b --mesh pp=2
                  --micro-batch 2)
endif()

set(LLAMA_CUDA --arch llama --heads 4 --kv-heads 2 --ffn 192)
strata_e2e_cuda(llama.ddp.np2 2 ${E2E_LOSS_TOL} --plugin ddp --micro-batch 2 ${LLAMA_CUDA})
# Ulysses at cp 4 on 2 K/V heads: each sent to the 2 ranks whose query heads use it, its
# gradient's copies summed by the device's gather on the way back (4 emulated GPUs).
set(_devices_of_two ${E2E_CUDA_ENV})
set(E2E_CUDA_ENV ${E2E_ENV} STRATA_CUDA_EMU_DEVICES=4)
strata_e2e_cuda(llama.cp.np4 4 ${E2E_LOSS_TOL} --plugin cp --mesh cp=4 --micro-batch 2
                ${LLAMA_CUDA})
set(E2E_CUDA_ENV ${_devices_of_two})
strata_e2e_cuda(llama.tp.np2.bf16 2 2e-3 --plugin tp --mesh tp=2 --micro-batch 2 --precision bf16
                ${LLAMA_CUDA})
# The same under cuDNN's attention on the cuDNN stand-in: a rank's 2 query heads, the K/V heads
# repeated for them before the attention, rotary positions already applied.
if(TARGET cudnn_standin)
  set(E2E_CUDA_GPU_ARGS --attention cudnn)
  strata_e2e_cuda(llama.tp.np2.bf16.cudnn 2 2e-3 --plugin tp --mesh tp=2 --micro-batch 2
                  --precision bf16 ${LLAMA_CUDA})
  unset(E2E_CUDA_GPU_ARGS)
endif()
