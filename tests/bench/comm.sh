#!/usr/bin/env bash
# bench_comm under mpirun on a non-power-of-two world: every op of every transport built in runs,
# its data check passes (wrong = 0) and it reports busbw. Not a speed test: sizes up to 256 KiB.
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
ops = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "sendrecv"]
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
