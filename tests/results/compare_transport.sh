#!/usr/bin/env bash
# results/compare as a transport A/B inside one study: ddp and zero3 at 4 ranks over MPI and over
# UCX. Without --ignore every configuration is "only in" one side; with --ignore transport and
# --where-a/--where-b the MPI run is paired with the UCX run of the same configuration, and
# neither memory nor the last loss differ (only throughput may).
# usage: compare_transport.sh RESULTS_DIR E2E_DIR WORK_DIR
set -eu
tools=$1 e2e=$2 work=$3
rm -rf "$work" && mkdir -p "$work/study"
for id in ddp.np4 ddp.np4.ucx zero3.np4 zero3.np4.ucx; do cp "$e2e/$id.h5" "$work/study/"; done
fail() { echo "FAIL: $*"; exit 1; }
"$tools/compare" --where-a transport=mpi --where-b transport=ucx "$work/study" "$work/study" \
  > "$work/plain.txt" || fail "exit $?"
cat "$work/plain.txt"
[[ $(grep -c "only in A" "$work/plain.txt") -eq 2 && $(grep -c "only in B" "$work/plain.txt") -eq 2 ]] \
  || fail "without --ignore the transports should not pair"
"$tools/compare" --ignore transport --where-a transport=mpi --where-b transport=ucx \
  "$work/study" "$work/study" > "$work/ab.txt" || fail "exit $?"
cat "$work/ab.txt"
grep -q "2 configuration(s)" "$work/ab.txt" || fail "expected 2 paired configurations"
for s in ddp zero3; do
  grep -E "^$s .*\(n=1\) +- +[0-9.e+]+ \(n=1\) +- " "$work/ab.txt" >/dev/null || fail "$s not paired"
done
! grep -E "memory|loss|only in" "$work/ab.txt" || fail "memory or loss differ between transports"
if "$tools/compare" --where-a transport "$work/study" "$work/study" 2>/dev/null; then
  fail "--where-a without = accepted"
fi
echo "compare: transport A/B pairs 2 configurations, same memory and loss"
