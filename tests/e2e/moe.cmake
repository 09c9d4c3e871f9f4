# The mixture-of-experts family end to end (--arch moe: the llama block with 4 SwiGLU experts of
# 64, top 2, a sequence-wise load-balancing loss of coefficient 0.01): tiny's sizes with 4 blocks,
# 8 query heads on 4 K/V heads, against its own 1-rank reference at 1, 2 and 4 ranks: data
# parallel, ZeRO-3 and FSDP (with full and selective recompute), the pipelines and dp=fsdp x pp;
# 1F1B with its stages' experts split over ep;
# expert parallelism (ep: the experts over an ep group carved out of dp) at 1, 2 and 4 ranks, the
# finer experts also replicated over two ep groups (dp=4, ep=2), under every dp mode (alone and
# under 1F1B and ZB-H1); each on the reference's
# trajectory within 1e-5 with memory and bytes = predict(). A capacity
# of 1 (choices over it dropped, per sequence) has its own reference, which ZeRO-3 over 4 ranks of
# one sequence each follows: a sequence's drops do not depend on the sequences beside it; finer
# experts with shared ones (DeepSeekMoE's) have their own. Then bf16 runs on their bf16 reference
# (bf16.cmake's tolerances) and the CUDA backend on the emulator against the CPU (cuda.cmake's;
# bf16 with a capacity and a shared expert; ep's exchanges and cp's through the NCCL stand-in).
# tp is refused for moe (its experts are not tensor-parallel; cli.bad_input checks the line).
set(MOE --arch moe --layers 4 --heads 8 --kv-heads 4 --ffn 64 --experts 4 --top-k 2)

# strata_e2e_moe(<id> <reference> <ranks> <runner args...>): the run of the model in MOE_MODEL
# and its checks.
set(MOE_MODEL ${MOE})
function(strata_e2e_moe id ref ranks)
  strata_e2e_run(${id} ${ranks} ${MOE_MODEL} ${ARGN})
  strata_e2e_checks_against(${id} ${ranks} ${ref} ${E2E_LOSS_TOL})
endfunction()

strata_e2e_moe(moe.reference moe.reference 1 --plugin dp --micro-batch 8)
strata_e2e_moe(moe.ddp.np2 moe.reference 2 --plugin ddp --micro-batch 2)
strata_e2e_moe(moe.zero3.np4 moe.reference 4 --plugin zero3 --micro-batch 2 --nodes 2)
strata_e2e_moe(moe.fsdp.np2.full moe.reference 2 --plugin fsdp --micro-batch 2 --recompute full)
strata_e2e_moe(moe.zero2.np2.selective moe.reference 2 --plugin zero2 --micro-batch 2
               --recompute selective)
strata_e2e_moe(moe.1f1b.pp2 moe.reference 2 --plugin 1f1b --mesh pp=2 --micro-batch 2)
strata_e2e_moe(moe.zb-h1.pp2 moe.reference 2 --plugin zb-h1 --mesh pp=2 --micro-batch 2)
strata_e2e_moe(moe.gpipe.pp4 moe.reference 4 --plugin gpipe --mesh pp=4 --micro-batch 1)
strata_e2e_moe(moe.1f1b.dp2.pp2.fsdp moe.reference 4 --plugin 1f1b --mesh dp=2,pp=2 --nodes 2
               --micro-batch 1 --plugin-opt dp=fsdp)
# Expert parallelism (ep): the experts split over the ep group, each block's rows exchanged with
# all_to_allv; its per-rank all_to_all bytes follow the routing, their sum over the ranks is
# predicted (check_run predicted).
strata_e2e_moe(moe.ep.np1 moe.reference 1 --plugin ep --micro-batch 8)
strata_e2e_moe(moe.ep.np2 moe.reference 2 --plugin ep --mesh dp=2,ep=2 --micro-batch 2)
strata_e2e_moe(moe.ep.np4.full moe.reference 4 --plugin ep --mesh dp=4,ep=4 --micro-batch 1
               --nodes 2 --recompute full)
# ep inside a pipeline's stages (Megatron-Core's EP x PP): each stage's 2 dp ranks split its
# blocks' experts, the exchanges inside the passes between the stages' sends.
strata_e2e_moe(moe.1f1b.dp2.pp2.ep2 moe.reference 4 --plugin 1f1b --mesh dp=2,pp=2,ep=2 --nodes 2
               --micro-batch 1)
# ep with dp=zero1 (Megatron-Core's distributed optimizer with EP): the dense gradients
# reduce-scattered over dp, the experts' over ep_dp (none at ep = dp), each rank's optimizer state
# for its shard of each; under a pipeline with the optimizer in host memory.
strata_e2e_moe(moe.ep.zero1.np2 moe.reference 2 --plugin ep --mesh dp=2,ep=2 --micro-batch 2
               --plugin-opt dp=zero1)
strata_e2e_moe(moe.ep.zero1.dp4.ep2 moe.reference 4 --plugin ep --mesh dp=4,ep=2 --micro-batch 2
               --nodes 2 --plugin-opt dp=zero1 --recompute full)
strata_e2e_moe(moe.1f1b.dp2.pp2.ep2.zero1 moe.reference 4 --plugin 1f1b --mesh dp=2,pp=2,ep=2
               --nodes 2 --micro-batch 1 --plugin-opt dp=zero1 --plugin-opt offload=optimizer)
# zero2 and fsdp with ep (torchtitan's FSDP2 with EP): each unit's runs of dense and expert tensors
# reduce-scattered (fsdp: gathered) over dp and over ep_dp into one buffer per unit, on the
# sharded engine; under zb-h1 after the chunk's last weight pass.
strata_e2e_moe(moe.ep.zero2.np2 moe.reference 2 --plugin ep --mesh dp=2,ep=2 --micro-batch 1
               --plugin-opt dp=zero2)
strata_e2e_moe(moe.ep.fsdp.dp4.ep2 moe.reference 4 --plugin ep --mesh dp=4,ep=2 --micro-batch 1
               --nodes 2 --plugin-opt dp=fsdp --plugin-opt prefetch=2)
strata_e2e_moe(moe.zb-h1.dp2.pp2.ep2.fsdp moe.reference 4 --plugin zb-h1 --mesh dp=2,pp=2,ep=2
               --nodes 2 --micro-batch 1 --plugin-opt dp=fsdp)
strata_e2e_moe(moe.zb-v.dp2.pp2.ep2 moe.reference 4 --plugin zb-v --mesh dp=2,pp=2,ep=2
               --micro-batch 1)
strata_e2e_moe(moe.capacity.reference moe.capacity.reference 1 --plugin dp --micro-batch 8
               --capacity-factor 1)
strata_e2e_moe(moe.capacity.zero3.np4 moe.capacity.reference 4 --plugin zero3 --micro-batch 1
               --nodes 2 --capacity-factor 1)
# Context parallelism: each rank routes its two zig-zag chunks of every sequence; the chunks'
# routing counts, gathered over cp, give each chunk the choices ahead of it (the capacity's drops)
# and each rank the whole sequences' counts (the load-balancing loss, its share of which is its
# tokens'). Ulysses dropless and with a capacity (over dp x cp under zero1), ring with a capacity
# and full recompute (the counts gathered again), and a pipeline's stages with ep x cp.
strata_e2e_moe(moe.cp.np2 moe.reference 2 --plugin cp --mesh cp=2 --micro-batch 2)
strata_e2e_moe(moe.capacity.cp.dp2.cp2.zero1 moe.capacity.reference 4 --plugin cp
               --mesh dp=2,cp=2 --nodes 2 --micro-batch 2 --capacity-factor 1 --plugin-opt dp=zero1)
strata_e2e_moe(moe.capacity.cp.ring.np4.full moe.capacity.reference 4 --plugin cp --mesh cp=4
               --nodes 2 --micro-batch 2 --capacity-factor 1 --plugin-opt attention=ring
               --recompute full)
strata_e2e_moe(moe.1f1b.dp2.cp2.ep2 moe.reference 4 --plugin 1f1b --mesh dp=2,cp=2,ep=2 --nodes 2
               --micro-batch 1)
# DeepSeekMoE's shape: 8 finer experts of 32, top 3, and 2 shared experts beside them.
set(MOE_MODEL --arch moe --layers 4 --heads 8 --kv-heads 4 --ffn 32 --experts 8 --top-k 3
              --shared-experts 2)
strata_e2e_moe(moe.fine.reference moe.fine.reference 1 --plugin dp --micro-batch 8)
strata_e2e_moe(moe.fine.fsdp.np2 moe.fine.reference 2 --plugin fsdp --micro-batch 2)
strata_e2e_moe(moe.fine.1f1b.pp2 moe.fine.reference 2 --plugin 1f1b --mesh pp=2 --micro-batch 2
               --recompute full)
# Two ep groups of 2 (Megatron's expert data parallelism): each rank holds 4 of the 8 experts, its
# peer in the other group the same 4; their gradients all-reduced over ep_dp.
strata_e2e_moe(moe.fine.ep2.dp4 moe.fine.reference 4 --plugin ep --mesh dp=4,ep=2 --micro-batch 2
               --nodes 2 --recompute selective)
# The same under zero1: each block's groups are its dense tensors, its routed experts' (sharded
# over ep_dp) and its shared experts' after them (over dp).
strata_e2e_moe(moe.fine.ep2.dp4.zero1 moe.fine.reference 4 --plugin ep --mesh dp=4,ep=2
               --micro-batch 2 --nodes 2 --recompute selective --plugin-opt dp=zero1)
strata_e2e_moe(moe.fine.ep2.dp4.fsdp moe.fine.reference 4 --plugin ep --mesh dp=4,ep=2
               --micro-batch 1 --nodes 2 --recompute full --plugin-opt dp=fsdp)
set(MOE_MODEL ${MOE})

# Dropless drops nothing: the run file's moe_dropped_fraction is 0.
add_test(NAME e2e.moe.dropless-drops-nothing
         COMMAND check_run summary ${E2E_DIR}/moe.reference.h5 moe_dropped_fraction 0)
set_tests_properties(e2e.moe.dropless-drops-nothing PROPERTIES LABELS e2e
                     FIXTURES_REQUIRED run.moe.reference)
# A capacity drops choices: its trajectory is not the dropless one.
add_test(NAME e2e.moe.capacity-drops
         COMMAND check_run trajectory ${E2E_DIR}/moe.reference.h5
                 ${E2E_DIR}/moe.capacity.reference.h5 1e-3)
set_tests_properties(e2e.moe.capacity-drops PROPERTIES LABELS e2e
                     PASS_REGULAR_EXPRESSION "step [0-9]+ loss [0-9.]+ vs reference"
                     FIXTURES_REQUIRED "run.moe.reference;run.moe.capacity.reference")
# Not a llama: the same sizes with one dense MLP of 64 train to another trajectory (a moe run that
# fell back to the llama block would pass every check above).
strata_e2e_run(moe.as-llama 1 --plugin dp --micro-batch 8 --arch llama --layers 4 --heads 8
               --kv-heads 4 --ffn 64)
add_test(NAME e2e.moe-is-not-llama
         COMMAND check_run trajectory ${E2E_DIR}/moe.reference.h5 ${E2E_DIR}/moe.as-llama.h5 1e-3)
set_tests_properties(e2e.moe-is-not-llama PROPERTIES LABELS e2e
                     PASS_REGULAR_EXPRESSION "step [0-9]+ loss [0-9.]+ vs reference"
                     FIXTURES_REQUIRED "run.moe.reference;run.moe.as-llama")

if(STRATA_WITH_ONEDNN)
  strata_e2e_bf16(moe.bf16.reference 1 moe.bf16.reference ${MOE} --plugin dp --micro-batch 8)
  strata_e2e_bf16(moe.bf16.fsdp.np2 2 moe.bf16.reference ${MOE} --plugin fsdp --micro-batch 2
                  --recompute selective)
  strata_e2e_bf16(moe.bf16.1f1b.pp2 2 moe.bf16.reference ${MOE} --plugin 1f1b --mesh pp=2
                  --micro-batch 2)
  strata_e2e_bf16(moe.bf16.ep.zero1.np2 2 moe.bf16.reference ${MOE} --plugin ep --mesh dp=2,ep=2
                  --micro-batch 2 --plugin-opt dp=zero1)
  strata_e2e_bf16(moe.bf16.ep.fsdp.np2 2 moe.bf16.reference ${MOE} --plugin ep --mesh dp=2,ep=2
                  --micro-batch 1 --plugin-opt dp=fsdp)
endif()

set(MOE_CUDA --arch moe --heads 4 --kv-heads 2 --ffn 64 --experts 4 --top-k 2)
strata_e2e_cuda(moe.ddp.np2 2 ${E2E_LOSS_TOL} --plugin ddp --micro-batch 2 ${MOE_CUDA})
strata_e2e_cuda(moe.ep.np2 2 ${E2E_LOSS_TOL} --plugin ep --mesh dp=2,ep=2 --micro-batch 2
                ${MOE_CUDA})
strata_e2e_cuda(moe.ep.zero1.np2 2 ${E2E_LOSS_TOL} --plugin ep --mesh dp=2,ep=2 --micro-batch 2
                --plugin-opt dp=zero1 ${MOE_CUDA})
strata_e2e_cuda(moe.ep.fsdp.np2 2 ${E2E_LOSS_TOL} --plugin ep --mesh dp=2,ep=2 --micro-batch 1
                --plugin-opt dp=fsdp ${MOE_CUDA})
strata_e2e_cuda(moe.cp.np2 2 ${E2E_LOSS_TOL} --plugin cp --mesh cp=2 --micro-batch 2
                --capacity-factor 1 ${MOE_CUDA})
strata_e2e_cuda(moe.zero3.np2.bf16 2 2e-3 --plugin zero3 --micro-batch 2 --precision bf16
                --capacity-factor 1 --shared-experts 1 ${MOE_CUDA})
