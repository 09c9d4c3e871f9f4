#!/usr/bin/env bash
# bench_comm under mpirun on a non-power-of-two world: every op of every transport built in runs,
# its data check passes (wrong = 0) and it reports busbw. Not a speed test: sizes up to 256 KiB.
# Then its points of one transport go into a machine profile (runner --calibrate --calibrate-from
# FILE.json): one sample per point of the four collectives the predictor fits.
# usage: comm.sh BENCH_COMM RUNNER RANKS WORK_DIR MPIRUN_FLAGS...
set -euo pipefail
bench=$1 runner=$2 ranks=$3 work=$4; shift 4
rm -rf "$work" && mkdir -p "$work"
mpirun -np "$ranks" "$@" "$bench" --max-bytes=256K --iters=3 --warmup-iters=1 \
  --benchmark_out="$work/comm.json" --benchmark_out_format=json > "$work/out.txt"
# Host-memory transports: bench_comm has no device buffers, so nccl (when built) is not in it.
transports=$("$runner" --list-transports | cut -f1 | grep -vx nccl | paste -sd, -)
/usr/bin/python3 - "$work/comm.json" "$transports" "$ranks" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["benchmarks"]
transports, ranks = sys.argv[2].split(","), int(sys.argv[3])
ops = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "sendrecv",
       "all_to_all"]
bad = [r["name"] for r in runs if r.get("error_occurred") or r["wrong"] != 0]
assert not bad, "data check failed: %s" % bad
for t in transports:
    for op in ops:
        mine = [r for r in runs if r["name"].startswith("BM_Coll/%s/%s/" % (t, op))]
        assert mine, "no %s benchmarks over %s" % (op, t)
        assert all(r["ranks"] == ranks and r["busbw_GBps"] > 0 for r in mine), (t, op)
        biggest = max(mine, key=lambda r: r["bytes"])
        print("%-4s %-15s %9.0f bytes  busbw %.3f GB/s" % (t, op, biggest["bytes"],
                                                           biggest["busbw_GBps"]))
print("bench_comm: %d benchmarks over %s on %d ranks, all data checked" %
      (len(runs), ", ".join(transports), ranks))
PY
# A profile from bench_comm's points: one transport per file, every point a sample, a fit per op.
if [[ $transports == *,* ]]; then
  if "$runner" --calibrate --calibrate-from "$work/comm.json" --profile "$work/mixed.h5" > "$work/mixed.txt" 2>&1; then
    echo "FAIL: a profile from the points of several transports"; exit 1
  fi
  grep -q "transports; a profile is of one" "$work/mixed.txt" || { cat "$work/mixed.txt"; echo "FAIL: mixed transports message"; exit 1; }
fi
mpirun -np "$ranks" "$@" "$bench" --transports=mpi --ops=all_reduce,reduce_scatter,all_gather,all_to_all \
  --min-bytes=64K --max-bytes=1M --step-factor=4 --iters=3 --warmup-iters=1 --check=0 \
  --benchmark_out="$work/mpi.json" --benchmark_out_format=json > "$work/mpi.txt"
"$runner" --calibrate --calibrate-from "$work/mpi.json" --profile "$work/bench.h5" > "$work/calibrate.txt" 2>&1 \
  || { cat "$work/calibrate.txt"; echo "FAIL: profile from bench_comm"; exit 1; }
grep -q "comm sample(s) of bench_comm over mpi" "$work/calibrate.txt" || { cat "$work/calibrate.txt"; echo "FAIL: calibrate output"; exit 1; }
/usr/bin/python3 - "$work/mpi.json" "$work/bench.h5" "$ranks" <<'PY'
import json, sys, h5py
points = [r for r in json.load(open(sys.argv[1]))["benchmarks"] if r["run_type"] == "iteration"
          and "/all_gather/out-of-place/" not in r["name"]]  # the engines gather in place
f, ranks = h5py.File(sys.argv[2]), int(sys.argv[3])
s = f["comm_samples"]
assert len(s["op"]) == len(points), (len(s["op"]), len(points))
assert set(s["ranks"][:]) == {ranks} and set(s["ranks_per_node"][:]) == {ranks}, "one node's group"
mean_us = sorted(p["real_time"] for p in points)
assert all(abs(t * 1e6 - m) <= 1e-9 * m for t, m in zip(sorted(s["time_s"][:]), mean_us)), \
    "times: the benchmarks' means"
ops = sorted(o.decode() for o in f["comm_fits/op"])
assert ops == ["all_gather", "all_reduce", "all_to_all", "reduce_scatter"], ops
print("profile from bench_comm: %d samples, fits of %s on %d ranks" % (len(points), ", ".join(ops), ranks))
PY
