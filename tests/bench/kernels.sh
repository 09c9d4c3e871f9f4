#!/usr/bin/env bash
# bench_kernels runs its CPU benchmarks for the small preset and reports positive rates (GEMM
# against the calibrated SGEMM peak). Not a speed test.
# usage: kernels.sh BENCH_KERNELS WORK_DIR
set -euo pipefail
bench=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
"$bench" --benchmark_filter='cpu/small' --benchmark_min_time=0.01 \
  --benchmark_out="$work/kernels.json" --benchmark_out_format=json > "$work/out.txt"
/usr/bin/python3 - "$work/kernels.json" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["benchmarks"]
gemm = [r for r in runs if r["name"].startswith("BM_Gemm/cpu/small/")]
attn = [r for r in runs if r["name"].startswith("BM_Attention/cpu/small/")]
norm = [r for r in runs if r["name"].startswith("BM_LayerNorm/cpu/small/")]
assert len(gemm) == 10 and len(attn) == 2 and len(norm) == 2, [r["name"] for r in runs]
assert all(r["GFLOPs"] > 0 and 0 < r["frac_of_peak"] for r in gemm)
assert all(r["GFLOPs"] > 0 for r in attn) and all(r["GBps"] > 0 for r in norm)
for r in gemm + attn + norm:
    print(r["name"], {k: round(v, 3) for k, v in r.items() if k in ("GFLOPs", "frac_of_peak", "GBps")})
PY
