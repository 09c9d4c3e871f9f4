#!/usr/bin/env bash
# Every check that needs a real GPU, in one call of under 8 minutes on an H100, into one markdown
# file: the real-GPU tests (`make test-gpu`'s programs), a performance table of one-rank training
# runs, the GPU kernel benchmarks and a per-kernel breakdown of one bf16 step (CUPTI's activity
# records). It builds nothing: it runs the build it is given.
#
#   scripts/gpu-check.sh [BUILD_DIR] [REPORT.md]      (defaults: build, gpu-check.md)
#
# Environment: STRATA_GPU_DEBS, a folder of Debian packages of the libraries the build needs that
# the GPU machine lacks (scripts/gpu-bundle.sh packs a build made elsewhere with them): unpacked
# under a temporary prefix, not over /, and put ahead on LD_LIBRARY_PATH. STRATA_GPU_CUDNN, a
# folder holding libcudnn.so.9 (the bundle's cudnn.tar.xz unpacked): ahead of the machine's.
# GPU_CHECK_QUICK=1 runs one row of the table and a few benchmarks (a smoke test of the script).
# Each part has a time limit, so a hang in one still leaves the others' results in the report.
set -uo pipefail
build=$(cd "${1:-build}" && pwd) || { echo "gpu-check: no build folder ${1:-build}"; exit 2; }
report=${2:-gpu-check.md}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "${STRATA_GPU_DEBS:-}" ]; then
  for deb in "$STRATA_GPU_DEBS"/*.deb; do dpkg -x "$deb" "$work/prefix"; done
  multiarch=$work/prefix/usr/lib/x86_64-linux-gnu
  export OPAL_PREFIX=$work/prefix/usr  # Debian configures Open MPI with prefix /usr
  export LD_LIBRARY_PATH="$multiarch:$multiarch/openmpi/lib:$work/prefix/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
  # libgloo0 puts its library in /usr/lib; OpenBLAS's is found through an alternatives link here.
  export LD_LIBRARY_PATH="$work/prefix/usr/lib:$multiarch/openblas-pthread:$LD_LIBRARY_PATH"
fi
# CUPTI (the kernel-time library's) sits beside the toolkit's libraries or in extras/.
for d in /usr/local/cuda/extras/CUPTI/lib64 /usr/local/cuda/lib64; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$d"
done
# The folder of a library: on LD_LIBRARY_PATH, in the loader's cache, or in Python's NVIDIA wheels
# (a machine whose PyTorch brings cuDNN and NVRTC that way).
find_lib() {
  local d f
  for d in ${LD_LIBRARY_PATH//:/ }; do [ -e "$d/$1" ] && { echo "$d"; return; }; done
  f=$(ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n { print $NF; exit }')
  [ -n "$f" ] && { dirname "$f"; return; }
  for d in $(python3 -c 'import site; print(*site.getsitepackages())' 2>/dev/null); do
    for f in "$d"/nvidia/*/lib/"$1"; do [ -e "$f" ] && { dirname "$f"; return; }; done
  done
}
# A bundled build's binaries name the library folder of the machine that built them.
export LD_LIBRARY_PATH="$build/lib:${LD_LIBRARY_PATH:-}"
# cuDNN for --attention cudnn: the bundle's (STRATA_GPU_CUDNN, the version the build was tested
# with) ahead of the machine's.
[ -n "${STRATA_GPU_CUDNN:-}" ] && export LD_LIBRARY_PATH="$STRATA_GPU_CUDNN:$LD_LIBRARY_PATH"
# Every library the build links that the loader does not find (CUDA's, cuBLAS, NCCL where the
# machine has them only as Python wheels), and the two it opens at run time: cuDNN and the NVRTC
# its runtime-compiled engines need.
missing=$(ldd "$build"/bin/* "$build"/lib/*.so* 2>/dev/null | awk '/not found/ { print $1 }' | sort -u)
for lib in $missing libcudnn.so.9 libnvrtc.so.13; do
  dir=$(find_lib "$lib")
  [ -n "$dir" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$dir"
  found_libs="${found_libs:-}$lib in ${dir:-(not found)}; "
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
runner=$build/bin/runner
[ -x "$runner" ] || { echo "gpu-check: $runner is not built"; exit 2; }
t_start=$(date +%s)

say() { printf '%s\n' "$*" >>"$report"; }
elapsed() { echo $(($(date +%s) - t_start)); }

# --- The machine --------------------------------------------------------------------------------
: >"$report"
say "# strata GPU check, $(date -u +%Y-%m-%d\ %H:%M) UTC"
say ""
say "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
say "- runner: $("$runner" --version 2>&1 | head -1)"
say "- build: $build"
say "- libraries: $found_libs"
say ""

# --- The real-GPU tests -------------------------------------------------------------------------
say "## Real-GPU tests (ctest -L gpu)"
say '```'
if [ -f "$build/CTestTestfile.cmake" ]; then  # a build tree: make test-gpu's tests
  (cd "$build" && timeout 200 ctest -L '^gpu$' --output-on-failure -j 4 >"$work/ctest.txt" 2>&1)
  echo "ctest exit $?" >>"$work/ctest.txt"
  grep -E 'tests passed|tests failed|\(Failed\)|\(Timeout\)|\*\*\*|ctest exit' "$work/ctest.txt" \
    >>"$report"
else  # a bundle (gpu-bundle.sh): the same programs, run directly (not the emulator's)
  for t in "$build"/bin/test_cuda_* "$build"/bin/test_nccl; do
    [[ -x $t && $t != *emu* ]] || continue
    timeout 120 "$t" >"$work/t.txt" 2>&1
    rc=$?
    counts=$(grep -E '^\[  (PASSED|FAILED)  \] [0-9]+ tests?' "$work/t.txt" | tr -s ' ' | tr '\n' ' ')
    say "$(basename "$t"): exit $rc; $counts"
    grep -E '^\[  FAILED  \] .*\([0-9]+ ms\)$' "$work/t.txt" >>"$report"
    [ $rc = 0 ] || tail -n 15 "$work/t.txt" | sed 's/^/    /' >>"$report"
  done
fi
say '```'
echo "gpu-check: tests done at $(elapsed) s"

# --- Training runs, one rank --------------------------------------------------------------------
# row LABEL ARGS...: one run; its throughput, step time, MFU and device peak as a table row.
row() {
  local label=$1
  shift
  local out=$work/run.txt
  timeout 120 "$runner" --device cuda --transport nccl --steps 12 --warmup 4 --quiet \
    --out "$work/runs" "$@" >"$out" 2>&1
  local rc=$?
  if [ $rc != 0 ]; then
    say "| $label | failed (exit $rc): $(grep -m1 -iE 'error|what' "$out" | cut -c1-120) | | | |"
    tail -n 25 "$out" | sed 's/^/    /' >>"$work/failures.txt"
    return
  fi
  local tput p50 mfu peak
  tput=$(sed -nE 's/^  throughput +([0-9]+) tokens\/s.*/\1/p' "$out")
  p50=$(sed -nE 's/.*step p50 ([0-9.]+) ms.*/\1/p' "$out")
  mfu=$(sed -nE 's/.*MFU ([0-9.]+)%.*/\1/p' "$out")
  peak=$(sed -nE 's/^ +device peak ([^ ]+ [A-Za-z]+) =.*/\1/p' "$out")
  say "| $label | $tput | $p50 | $mfu% | $peak |"
  p50_of[$label]=$p50
}
declare -A p50_of
say ""
say "## One rank, 12 steps (4 warm-up)"
say ""
say "| run | tokens/s | step p50 ms | MFU | device peak |"
say "|---|---|---|---|---|"
gpt2=(--model gpt2-124m --plugin ddp)
row "gpt2-124m bf16 mb 8 ddp" "${gpt2[@]}" --precision bf16 --micro-batch 8
# The same with the forward and the backward each one CUDA graph launch (--cuda-graphs).
row "gpt2-124m bf16 mb 8 ddp, CUDA graphs" "${gpt2[@]}" --precision bf16 --micro-batch 8 \
  --cuda-graphs
# cuDNN's fused attention (a build that found cuDNN; its failure here says why not).
row "gpt2-124m bf16 mb 8 ddp, attention cudnn" "${gpt2[@]}" --precision bf16 --micro-batch 8 \
  --attention cudnn
if [ "${GPU_CHECK_QUICK:-0}" != 1 ]; then
  row "gpt2-124m bf16 mb 8 ddp, attention reference" "${gpt2[@]}" --precision bf16 \
    --micro-batch 8 --attention reference
  row "gpt2-124m bf16 mb 16 ddp" "${gpt2[@]}" --precision bf16 --micro-batch 16
  row "gpt2-124m bf16 mb 16 ddp, CUDA graphs" "${gpt2[@]}" --precision bf16 --micro-batch 16 \
    --cuda-graphs
  row "gpt2-124m bf16 mb 16 ddp, attention cudnn, CUDA graphs" "${gpt2[@]}" --precision bf16 \
    --micro-batch 16 --attention cudnn --cuda-graphs
  row "gpt2-124m bf16 mb 16 zero3" --model gpt2-124m --plugin zero3 --precision bf16 \
    --micro-batch 16
  row "gpt2-124m fp32 mb 8 ddp" "${gpt2[@]}" --micro-batch 8
  row "gpt2-124m fp32 mb 16 zero3" --model gpt2-124m --plugin zero3 --micro-batch 16
  # About 1.3B parameters: GPT-2's vocabulary, 24 layers of hidden 2048 in 16 heads of 128.
  xl=(--model gpt2-124m --layers 24 --hidden 2048 --heads 16 --seq 1024)
  row "1.3B bf16 mb 4 ddp" "${xl[@]}" --plugin ddp --precision bf16 --micro-batch 4
  row "1.3B bf16 mb 4 ddp, attention cudnn" "${xl[@]}" --plugin ddp --precision bf16 \
    --micro-batch 4 --attention cudnn
  row "1.3B bf16 mb 4 zero3" "${xl[@]}" --plugin zero3 --precision bf16 --micro-batch 4
  row "1.3B fp32 mb 2 ddp" "${xl[@]}" --plugin ddp --micro-batch 2
  # The llama family at Llama 3.2 1B's shape (16 layers of hidden 2048, 32 query heads on 8 K/V
  # heads of 64, SwiGLU of 8192, the 128,256-token vocabulary; here untied: 1.5B parameters).
  llama=(--model llama3-8b --layers 16 --hidden 2048 --heads 32 --kv-heads 8 --ffn 8192
    --seq 2048)
  row "llama 1.5B bf16 mb 2 ddp" "${llama[@]}" --plugin ddp --precision bf16 --micro-batch 2
  row "llama 1.5B bf16 mb 2 fsdp" "${llama[@]}" --plugin fsdp --precision bf16 --micro-batch 2
  # A mixture of experts at Mixtral's proportions, 8 blocks of hidden 2048 with 8 experts of 2816,
  # top 2 (1.3B parameters, 0.5B active): the router's read-back and the experts' smaller GEMMs.
  moe=(--model mixtral-8x7b --layers 8 --hidden 2048 --heads 16 --kv-heads 8 --ffn 2816
    --seq 2048)
  row "moe 1.3B bf16 mb 2 ddp" "${moe[@]}" --plugin ddp --precision bf16 --micro-batch 2
fi
if [ -s "$work/failures.txt" ]; then
  say ""
  say "The failed runs' last lines:"
  say '```'
  cat "$work/failures.txt" >>"$report"
  say '```'
fi
echo "gpu-check: runs done at $(elapsed) s"

# --- Predicted step times -----------------------------------------------------------------------
# predicted LABEL PROFILE ARGS...: the dry run's step against the measured row LABEL.
predicted() {
  local label=$1 profile=$2
  shift 2
  local out step how
  out=$("$runner" --dry-run --device cuda --transport nccl --profile "$profile" "$@" 2>&1)
  step=$(sed -nE 's/^  step +([0-9.]+) ms$/\1/p' <<<"$out")
  how=$(sed -nE 's/^  assumptions: //p' <<<"$out" | cut -c1-110)
  local measured=${p50_of[$label]:-}
  if [ -n "$step" ] && [ -n "$measured" ]; then
    say "| $label | $(basename "$profile") | $step | $measured | $(awk -v p="$step" -v m="$measured" \
      'BEGIN { printf "%+.1f%%", 100 * (p / m - 1) }') | $how |"
  else
    say "| $label | $(basename "$profile") | ${step:-none} | ${measured:-none} | | $how |"
  fi
}
say ""
say "## Predicted against measured (issue 27 item 6: GEMM time by shape)"
say ""
say "| run | profile | predicted ms | measured ms | error | assumptions |"
say "|---|---|---|---|---|---|"
# The published figures of the GPU the check runs on: an H200's, else an H100's.
table=profiles/h100-sxm-published.txt
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200 &&
  table=profiles/h200-sxm-published.txt
"$runner" --calibrate --calibrate-from "$table" --profile "$work/$(basename "$table" .txt).h5" \
  >/dev/null 2>&1
published=$work/$(basename "$table" .txt).h5
predicted "gpt2-124m bf16 mb 8 ddp" "$published" "${gpt2[@]}" --precision bf16 --micro-batch 8
if [ "${GPU_CHECK_QUICK:-0}" != 1 ]; then
  # A profile calibrated on gpt2-124m (its GEMM sweep through cuBLASLt) carried to the 1.3B shape.
  timeout 150 "$runner" --calibrate --device cuda --transport nccl --profile "$work/gpt2.h5" \
    "${gpt2[@]}" --precision bf16 --micro-batch 8 >"$work/calibrate.txt" 2>&1 ||
    tail -n 5 "$work/calibrate.txt" >>"$report"
  predicted "gpt2-124m bf16 mb 8 ddp" "$work/gpt2.h5" "${gpt2[@]}" --precision bf16 --micro-batch 8
  predicted "1.3B bf16 mb 4 ddp" "$work/gpt2.h5" "${xl[@]}" --plugin ddp --precision bf16 \
    --micro-batch 4
  predicted "1.3B bf16 mb 4 ddp" "$published" "${xl[@]}" --plugin ddp --precision bf16 \
    --micro-batch 4
fi
if [ -s "$work/calibrate.txt" ]; then
  say ""
  say "The calibration's GEMM sweep:"
  say '```'
  grep -E "GEMM sweep|block fwd" "$work/calibrate.txt" | cut -c1-200 >>"$report"
  say '```'
fi
echo "gpu-check: predictions done at $(elapsed) s"

# --- Kernel benchmarks --------------------------------------------------------------------------
say ""
say "## Kernel benchmarks (bench_kernels, cuda cases)"
say '```'
filter='/cuda/|BM_Gpu'
[ "${GPU_CHECK_QUICK:-0}" = 1 ] && filter='BM_GpuAttention/.*/hs64/forward_backward'
if [ -x "$build/bin/bench_kernels" ]; then
  timeout 150 "$build/bin/bench_kernels" --benchmark_filter="$filter" --benchmark_min_time=0.05 \
    >"$work/bench.txt" 2>&1
  echo "bench_kernels exit $?" >>"$work/bench.txt"
  grep -vE '^\*\*\*|^-+$' "$work/bench.txt" | cut -c1-200 >>"$report"
else
  say "bench_kernels is not built (STRATA_BUILD_BENCH=OFF)"
fi
say '```'
echo "gpu-check: benchmarks done at $(elapsed) s"

# --- Per-kernel time of one bf16 step -----------------------------------------------------------
# CUPTI's activity records (bench/kernel_times.cpp, an injection library) of two runs that differ
# only in --steps: the difference is 8 steps' kernels, whatever runs before and after the steps.
# (Nsight Compute replays each kernel, and took more than 140 s without reaching one step on
# 2026-11-27; Nsight Systems is not installed on the device tool's machines.)
say ""
say "## Per-kernel time of one step, gpt2-124m bf16 micro-batch 8 (runs of 12 and 4 steps)"
say '```'
times_lib=$build/lib/libstrata_kernel_times.so
step=(--device cuda --transport nccl --model gpt2-124m --plugin ddp --precision bf16
      --micro-batch 8 --warmup 1 --quiet --out "$work/runs")
if [ -f "$times_lib" ]; then
  for n in 4 12; do
    CUDA_INJECTION64_PATH=$times_lib STRATA_KERNEL_TIMES=$work/times$n.txt timeout 90 "$runner" \
      "${step[@]}" --steps $n >"$work/times_run$n.txt" 2>&1 || tail -n 5 "$work/times_run$n.txt" >>"$report"
  done
  if [ -s "$work/times4.txt" ] && [ -s "$work/times12.txt" ]; then
    # "ns count name" lines; per step: (12-step run - 4-step run) / 8.
    awk '{ k = $0; sub(/^[0-9]+ [0-9]+ /, "", k) }
      NR == FNR { ns[k] = $1; n[k] = $2; next }
      { t = ($1 - ns[k]) / 8e6; c = ($2 - n[k]) / 8
        if (c > 0) { printf "%9.3f ms %6.1f  %s\n", t, c, k; total += t; launches += c } }
      END { printf "%9.3f ms %6.1f  total per step\n", total, launches }' \
      "$work/times4.txt" "$work/times12.txt" | sort -rn | head -40 | cut -c1-200 >>"$report"
  else
    say "no kernel times (the runs' last lines are above)"
  fi
else
  say "$times_lib is not built (no CUPTI in the CUDA toolkit)"
fi
say '```'
say ""
say "Total $(elapsed) s."
echo "gpu-check: wrote $report in $(elapsed) s"
