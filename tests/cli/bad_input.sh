#!/usr/bin/env bash
# Every bad input gets exactly one line on stderr, a non-zero exit, and no run file.
# usage: bad_input.sh RUNNER OUTDIR
set -u
runner=$1 out=$2
rm -rf "$out" && mkdir -p "$out"
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
fails=0
cases=1  # the no-file check at the end
check() {  # check "<expected text>" [VAR=value...] args...
  local want=$1; shift
  cases=$((cases + 1))
  local err code
  local envs=(env)
  while [[ $1 == *=* && $1 != -* ]]; do envs+=("$1"); shift; done
  err=$(timeout 20 "${envs[@]}" "$runner" --out "$out" "$@" 2>&1 >/dev/null); code=$?
  local lines; lines=$(printf '%s\n' "$err" | grep -c .)
  if [[ $code -ne 2 || $lines -ne 1 || $err != *"$want"* ]]; then
    echo "FAIL: runner $* -> exit $code, $lines stderr line(s): $err (wanted: $want)"; fails=$((fails+1))
  else
    echo "ok: runner $* -> $err"
  fi
}
check "--plugin nosuch: no such strategy (found: " --plugin nosuch
check "--plugin: required" --model tiny
check "--plugin-opt nosuch: strategy ddp has no such option (it has: bucket_mb)" --plugin ddp --plugin-opt nosuch=1
check "--plugin-opt bucket_mb=abc: must be a finite number" --plugin ddp --plugin-opt bucket_mb=abc
# Numbers checked as numbers, each quoted as given: no overflow into a size or an int, no negative
# advice, no absurd MFU, no key given twice.
check "--plugin-opt bucket_mb=inf: must be a finite number" --plugin zero2 --plugin-opt bucket_mb=inf
check "--plugin-opt bucket_mb=1e20: must be a number of MiB in (0, 1048576]" --plugin ddp --plugin-opt bucket_mb=1e20
check "--plugin-opt bucket_mb=1e20: must be a number of MiB in (0, 1048576]" --plugin zero2 --plugin-opt bucket_mb=1e20
check "--plugin-opt prefetch=9223372036854775807: must be a whole number in -2147483648..2147483647" \
  --plugin zero3 --plugin-opt prefetch=9223372036854775807
check "--plugin-opt virtual_stages=2147483648: must be a whole number in" --plugin interleaved \
  --plugin-opt virtual_stages=2147483648
check "no --global-batch gives that many (at most 2147483647)" --plugin 1f1b --plugin-opt microbatches=1000000000
check "STRATA_MPIRUN_ARGS=-x \"a: an unbalanced \" (split as a shell would)" 'STRATA_MPIRUN_ARGS=-x "a' \
  --plugin ddp --nodes 1 --ranks-per-node 2 --steps 2
check "--peak-tflops 1e-300: must be 0 (the node's measured peak) or at least 1e-06" --plugin ddp --peak-tflops 1e-300
check "--plugin-opt bucket_mb=2: bucket_mb is given twice (first bucket_mb=1)" --plugin ddp \
  --plugin-opt bucket_mb=1 --plugin-opt bucket_mb=2
check "--plugin-opt bucket_mb=" --plugin ddp --plugin-opt bucket_mb=-1
check "dp x cp x tp x pp must equal the world size" --plugin ddp --nodes 3 --mesh dp=2
# As if mpirun had started 4 ranks (checked before MPI starts, so no MPI is needed here).
check "--nodes 3: must divide the world size 4" OMPI_COMM_WORLD_SIZE=4 --plugin ddp --nodes 3
check "--heads 5: must divide --hidden 64" --plugin ddp --hidden 64 --heads 5
check "--steps 0: must be a whole number in 1..1000000000" --plugin ddp --steps 0
check "--model huge: must be one of tiny, small, gpt2-124m" --plugin ddp --model huge
check "--global-batch 12: must be a multiple of --micro-batch x dp = 8" --plugin ddp --global-batch 12
check "--transport infiniband: must be one of mpi" --plugin ddp --transport infiniband
check "--attention own: a GPU kernel; needs --device cuda" --plugin ddp --attention own
if "$runner" --list-transports | cut -f1 | grep -qx gloo; then  # built with gloo
  check "STRATA_GLOO_IFNAME='nosuch0': not one network interface of this host (it has: lo" \
    STRATA_GLOO_IFNAME=nosuch0 --plugin ddp --transport gloo
  check "GLOO_SOCKET_IFNAME='lo,eth0': not one network interface" GLOO_SOCKET_IFNAME=lo,eth0 \
    --plugin ddp --transport gloo
fi
if "$runner" --list-transports | cut -f1 | grep -qx nccl; then  # built with NCCL
  check "--transport nccl: moves device memory; needs --device cuda" --plugin ddp --transport nccl
else
  check "--transport nccl: must be one of mpi" --plugin ddp --transport nccl
fi
if ! "$runner" --plugin ddp --device cuda --out "$out" 2>&1 | grep -q "must be one of cpu"; then
  check "--device cuda: needs --transport nccl" --plugin ddp --device cuda  # a CUDA build
  if ! nvidia-smi -L >/dev/null 2>&1 && "$runner" --list-transports | cut -f1 | grep -qx nccl; then
    check "--device cuda: no CUDA device on this machine" --plugin ddp --device cuda --transport nccl
  fi
  if "$runner" --list-transports | cut -f1 | grep -qx nccl; then  # ring blocks on the flash tiles
    check "--plugin-opt attention=ring on --device cuda: head size 256 (--hidden / --heads) must be at most 128" \
      --plugin cp --mesh cp=2 --nodes 1 --ranks-per-node 2 --plugin-opt attention=ring --hidden 512 \
      --heads 2 --device cuda --transport nccl
  fi
else
  check "--device cuda: must be one of cpu" --plugin ddp --device cuda
fi
check "--mesh: ddp is data parallel only" --plugin ddp --mesh dp=1,tp=2 --nodes 1 --ranks-per-node 2
check "unrecognised option '--bogus'" --plugin ddp --bogus
check "--data /nonexistent: cannot open the file" --plugin ddp --data /nonexistent
check "--recompute some: must be one of none, full, selective" --plugin ddp --recompute some
check "--tp-comm-dtype bf16: needs --precision bf16 (an fp32 run moves fp32 activations); allowed with --precision fp32: fp32" \
  --plugin tp --tp-comm-dtype bf16 --precision fp32
check "--tp-comm-dtype bf16: needs --precision bf16" --plugin 1f1b --tp-comm-dtype bf16
check "--tp-comm-dtype fp16: must be one of fp32, bf16" --plugin tp --tp-comm-dtype fp16
check "--memory-limit lots: must be a size such as 80GiB" --plugin ddp --dry-run --memory-limit lots
check "--peak-tflops -1: must be a number in [0, 1e+06]" --plugin ddp --peak-tflops -1
check "--log-interval 0: must be a whole number in 1..1000000000" --plugin ddp --log-interval 0
check "--log-interval 2.5: must be a whole number in 1..1000000000" --plugin ddp --log-interval 2.5
check "STRATA_LOG_INTERVAL=x: must be a whole number" STRATA_LOG_INTERVAL=x --plugin ddp
check "option '--version' does not take any arguments" --version=yes
# Model-parallel meshes (checked by the strategy before any rank starts).
check "--mesh tp=3: must divide the model's heads (4)" --plugin tp --mesh tp=3 --nodes 1 --ranks-per-node 3
check "--mesh tp=2: must divide the model's vocabulary" --plugin tp --mesh tp=2 --nodes 1 --ranks-per-node 2 --vocab 255
check "--mesh pp=2: tp has no pipeline" --plugin tp --mesh tp=2,pp=2 --nodes 1 --ranks-per-node 4
# The mixture of experts: its options validated once, tp refused (its experts are not
# tensor-parallel), CUDA graphs refused (its dispatch plan is read back to the host each step).
check "--mesh tp=2: --arch moe's experts are not tensor-parallel" --plugin tp --mesh tp=2 \
  --nodes 1 --ranks-per-node 2 --model tiny-moe
check "--top-k 5: must be in [1, --experts 4]" --plugin ddp --model tiny-moe --top-k 5
check "--shared-experts: a mixture of experts needs --arch moe" --plugin ddp \
  --model tiny-llama --experts 4
check "--cuda-graphs: --arch moe reads its routing back to the host" --plugin ddp --model tiny-moe \
  --cuda-graphs
check "--capacity-factor -1: must be" --plugin ddp --model tiny-moe --capacity-factor -1
# Expert parallelism: a moe whose experts the dp ranks divide, on the CPU.
check "--plugin ep: expert parallelism needs a mixture of experts (--arch moe)" --plugin ep
check "--plugin ep: --mesh ep=3 must divide the experts (4)" --plugin ep --model tiny-moe \
  --mesh dp=3,ep=3 --nodes 1 --ranks-per-node 3
check "--mesh ep=3: must divide dp=4" --plugin ep --model tiny-moe --mesh dp=4,ep=3 --nodes 1 \
  --ranks-per-node 4
check "--mesh ep=2: --plugin zero1 does not split the experts" --plugin zero1 --model tiny-moe \
  --mesh dp=2,ep=2 --nodes 1 --ranks-per-node 2
check "--plugin 1f1b: expert parallelism needs a mixture of experts (--arch moe)" --plugin 1f1b \
  --mesh dp=2,pp=2,ep=2 --nodes 1 --ranks-per-node 4
check "--plugin-opt dp=zero3: must be one of allreduce zero1 zero2 fsdp" --plugin ep \
  --model tiny-moe --plugin-opt dp=zero3
check "--plugin-opt sp: strategy ep has no such option" --plugin ep --model tiny-moe --plugin-opt sp=on
check "--mesh pp=2: ep has no pipeline" --plugin ep --model tiny-moe --mesh pp=2 --nodes 1 \
  --ranks-per-node 2
check "--mesh pp=4: the model has 2 layers, fewer than the 4 pipeline chunks" --plugin 1f1b --mesh pp=4 --nodes 1 --ranks-per-node 4
check "interleaved: micro-batches per step (1 = --global-batch / (--micro-batch x dp)) must be a multiple of pp (2)" --plugin interleaved --mesh pp=2 --nodes 1 --ranks-per-node 2 --layers 4
check "--mesh pp=1: zb-v needs pp >= 2" --plugin zb-v --mesh pp=1 --nodes 1 --ranks-per-node 1
check "--mesh pp=2 x zb-v's 2 chunks: the model has 2 layers, fewer than the 4 pipeline chunks" --plugin zb-v --mesh pp=2 --nodes 1 --ranks-per-node 2
check "--plugin-opt stage_layers: needs 2 entries" --plugin gpipe --mesh pp=2 --nodes 1 --ranks-per-node 2 --plugin-opt stage_layers=1,2,3
# The sharded engine's options under tp and the pipelines.
check "--plugin-opt offload=optimizer: needs dp=zero1, zero2 or fsdp (got dp=allreduce)" --plugin 1f1b --mesh pp=2 --nodes 1 --ranks-per-node 2 --plugin-opt offload=optimizer
check "--recompute full: a split backward (zb-h1, zb-v) needs each block's activations kept" --plugin zb-h1 --mesh pp=2 --nodes 1 --ranks-per-node 2 --recompute full
# Context parallelism: the mesh's axis, the model's split, and the strategies that take it.
check "--mesh cp=2: --plugin zero3 does not split the sequences over a context-parallel group" --plugin zero3 --mesh cp=2 --nodes 1 --ranks-per-node 2
check "--mesh cp=4: tp x cp must divide the attention heads (4" --plugin cp --mesh tp=2,cp=4 --nodes 1 --ranks-per-node 8
check "--mesh cp=2: 2 x cp must divide the sequence length (--seq 63" --plugin cp --mesh cp=2 --nodes 1 --ranks-per-node 2 --seq 63
check "--plugin-opt attention=spiral: must be one of" --plugin cp --mesh cp=2 --nodes 1 --ranks-per-node 2 --plugin-opt attention=spiral
check "--calibrate: measures whole sequences; leave cp out of --mesh" --calibrate --profile p.h5 --mesh cp=2 --nodes 1 --ranks-per-node 2
check "--plugin-opt prefetch: must be >= 0" --plugin tp --mesh dp=1,tp=2 --nodes 1 --ranks-per-node 2 --plugin-opt dp=fsdp --plugin-opt prefetch=-1
check "--plugin-opt prefetch: must be >= 0" --plugin 1f1b --mesh dp=2,pp=2 --nodes 1 --ranks-per-node 4 --plugin-opt dp=fsdp --plugin-opt prefetch=-1
check "--plugin-opt microbatches=4: the batch gives 1" --plugin 1f1b --mesh pp=2 --nodes 1 --ranks-per-node 2 --plugin-opt microbatches=4
# Found by hand (issue 12): each was accepted before.
check "--lr nan: must be a number in (0, 10]" --plugin ddp --lr nan
check "--weight-decay nan: must be a number" --plugin ddp --weight-decay nan
check "--grad-clip nan: must be a number" --plugin ddp --grad-clip nan
check "--global-batch -8: must be a whole number" --plugin ddp --global-batch -8
check "--watchdog nan: must be a number in [1, 604800]" --plugin ddp --watchdog nan
check "--layers 0: must be a whole number in 1..4096" --plugin ddp --layers 0
check "--mesh dp=2abc: dp must be a whole number" --plugin ddp --mesh dp=2abc
check "--mesh dp=2,dp=2: dp given twice" --plugin ddp --mesh dp=2,dp=2
check "--mesh '': empty entry" --plugin ddp --mesh ""
check "--ranks-per-node 1000000: must be a whole number in 1..1024" --plugin ddp --ranks-per-node 1000000
check "more than 16 per core" --plugin ddp --nodes 64 --ranks-per-node 64
check "stray word 'foo': runner takes no positional arguments" --plugin ddp foo bar
check "--run-id ../../x: must be a name of letters" --plugin ddp --run-id ../../x
check "--run-id /abs/path: must be a name" --plugin ddp --run-id /abs/path
check "--config /: is a directory" --plugin ddp --config /
check "STRATA_CONFIG /nonexistent.ini: cannot open the file" STRATA_CONFIG=/nonexistent.ini --plugin ddp
check "STRATA_RUN_ID=../x: must be a name" STRATA_RUN_ID=../x --plugin ddp
check "STRATA_STEPS=-3: must be a whole number" STRATA_STEPS=-3 --plugin ddp
check "--plugin-path /nonexistent: not a directory" --plugin ddp --plugin-path /nonexistent
check "STRATA_PLUGIN_PATH=/nonexistent: not a directory" STRATA_PLUGIN_PATH=/nonexistent --plugin ddp
printf 'run-id = ../../escape\n' > "$tmp/escape.ini"
check "--config $tmp/escape.ini: run-id = ../../escape: must be a name" --plugin ddp --config "$tmp/escape.ini"
printf '\x00\x01\x02' > "$tmp/odd.bin"
check "--data $tmp/odd.bin: must be a flat file of uint16 tokens or an llm.c token file" --plugin ddp --data "$tmp/odd.bin"
head -c 4000 /dev/zero | tr '\0' '\377' > "$tmp/big-tokens.bin"
check "--data $tmp/big-tokens.bin: token 65535 at 0 is not below --vocab 256" --plugin ddp --data "$tmp/big-tokens.bin"
check "--steps 6: --steps is given twice" --plugin ddp --steps 5 --steps 6
check "--warmup 5: must be below --steps 5" --plugin ddp --steps 5 --warmup 5
# Found by fuzzing (tests/fuzz/regressions/fuzz_config): Boost's error text looped for ever.
check "'--x%canonical_option%': no such option" --plugin ddp '--x%canonical_option%'
check "--steps x%value%: must be a whole number" --plugin ddp --steps 'x%value%'
check "'--delist-transports': no such option" --plugin ddp '--delist-transports=scrivo%c-%canonical_option%i=sa'
check "'--dry-run': a flag takes no value" --plugin ddp '--dry-run=%canonical_option%'
# A directory where --trace's timeline goes: refused before the run (it used to end a finished run
# with exit 3 while its file said ok).
mkdir -p "$out/tdir.trace.json"
check "--trace: $out/tdir.trace.json is a directory (the timeline is written there)" --plugin ddp \
  --trace --run-id tdir
left=$(find "$out" -type f | wc -l)
if [[ $left -ne 0 ]]; then echo "FAIL: $left file(s) left in $out"; fails=$((fails+1)); fi
echo "$((cases - fails)) passed, $fails failed"
[[ $fails -eq 0 ]]
