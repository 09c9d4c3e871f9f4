#!/usr/bin/env bash
# --dry-run of an offloaded run shows the two sides apart: device memory per tag with its total,
# host memory (tag offload) with its own total and outside the device's, and the device<->host
# transfers per step apart from the collectives. tiny (120576 parameters) under zero3 at 2 ranks,
# fp32: each rank holds half of the AdamW state on the host (8 x 60288 bytes) and copies 8 bytes
# per shard element down and 4 back per step.
# usage: dry_run_offload.sh RUNNER
set -eu
runner=$1
fail() { echo "FAIL: $*"; echo "$out"; exit 1; }
# The bytes of row NAME in the section whose header starts with HEADER.
row() { awk -v h="$2" -v n="$3" 'index($0, h) == 1 {s = 1; next} /^[a-z]/ {s = 0}
                                 s && $1 == n {print $2; exit}' <<<"$1"; }
args=(--dry-run --plugin zero3 --nodes 1 --ranks-per-node 2 --model tiny --micro-batch 2)
out=$("$runner" "${args[@]}")
base_total=$(row "$out" "predicted device memory" total)
base_opt=$(row "$out" "predicted device memory" optimizer)
grep -q "^predicted host memory per rank .*not in the device total" <<<"$out" || fail "host header"
grep -A1 "^predicted host memory" <<<"$out" | grep -q "none (no offload)" || fail "no-offload host"
grep -A1 "^predicted device<->host transfers" <<<"$out" | grep -q "^  none" || fail "no transfers"
[[ $base_opt == 482304 ]] || fail "optimizer $base_opt without offload, want 482304"

out=$("$runner" "${args[@]}" --plugin-opt offload=optimizer)
total=$(row "$out" "predicted device memory" total)
[[ $(row "$out" "predicted device memory" optimizer) == 0 ]] || fail "optimizer on the device"
[[ $total == $((base_total - base_opt)) ]] || fail "device total $total, want $base_total - $base_opt"
host=$(row "$out" "predicted host memory" offload)
# The state plus host copies of the rank's gradient and parameter shards (8 x 60288).
[[ $host == $((482304 + 482304)) ]] || fail "host offload $host"
[[ $(row "$out" "predicted host memory" total) == "$host" ]] || fail "host total"
[[ -z $(row "$out" "predicted comm per rank" d2h) ]] || fail "d2h among the collectives"
[[ $(row "$out" "predicted device<->host transfers" d2h) == 482304 ]] || fail "d2h"
[[ $(row "$out" "predicted device<->host transfers" h2d) == 241152 ]] || fail "h2d"
# --memory-limit is about the device: the offloaded run fits where the other does not.
limit=$((total + 1024))
"$runner" "${args[@]}" --plugin-opt offload=optimizer --memory-limit "$limit" >/dev/null ||
  fail "offloaded run does not fit in $limit"
set +e
"$runner" "${args[@]}" --memory-limit "$limit" >/dev/null
code=$?
set -e
[[ $code -eq 4 ]] || fail "run without offload: exit $code under $limit, want 4"
echo "dry run offload: device total $total (without offload $base_total), host $host, d2h 482304, h2d 241152 bytes per rank per step"
