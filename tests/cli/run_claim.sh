#!/usr/bin/env bash
# One run per run file (core/src/results/run_claim.hpp): a second run with the same --run-id is
# refused before any work (exit 2, one line) and the first file stays byte for byte; --overwrite
# replaces it (and an earlier --trace timeline that no longer belongs to it); of runs started
# together with one id exactly one runs; a stale claim (kill -9 leaves its file) is not in the way;
# a claimed file held by another process, or a symlink put in its place, is refused.
# usage: run_claim.sh RUNNER OUTDIR
set -u
runner=$1 out=$2
rm -rf "$out" && mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
run() { timeout 120 "$runner" --plugin ddp --model tiny --quiet --out "$out" "$@"; }
# refused "<text>" args...: exit 2 within 10 s, one stderr line with the text.
refused() {
  local want=$1; shift
  local t0=$SECONDS err code
  err=$(run "$@" 2>&1 >/dev/null); code=$?
  local lines; lines=$(printf '%s\n' "$err" | grep -c .)
  if [[ $code -ne 2 || $lines -ne 1 || $err != *"$want"* || $((SECONDS - t0)) -gt 10 ]]; then
    fail "runner $* -> exit $code, $lines line(s): $err (wanted exit 2, one line: $want)"
  else
    echo "ok: runner $* -> exit 2: $err"
  fi
}

# A repeated id: refused, the first file intact, no claim file left behind.
run --steps 3 --run-id first --trace > /dev/null 2>&1 || fail "the first run failed"
cp "$out/first.h5" "$out/first.copy"
refused "first.h5 exists (an earlier run's); --overwrite replaces it" --steps 2 --run-id first
cmp -s "$out/first.h5" "$out/first.copy" || fail "the refused run changed the first run file"
[[ -f $out/first.trace.json ]] || fail "the refused run removed the first run's trace"
[[ -e $out/.first.h5.claim ]] && fail "a finished or refused run left its claim file"

# --overwrite: the new file in place, the earlier timeline (not this run's) gone.
if run --steps 2 --run-id first --overwrite > /dev/null 2>&1 && ! cmp -s "$out/first.h5" "$out/first.copy"; then
  echo "ok: --overwrite replaced the run file"
else
  fail "--overwrite did not replace the run file"
fi
[[ -e $out/first.trace.json ]] && fail "--overwrite without --trace kept the earlier run's timeline"

# A stale claim: what a run killed with SIGKILL leaves (its file, no lock).
echo "pid 1 on elsewhere token 0123456789abcdef" > "$out/.stale.h5.claim"
run --steps 2 --run-id stale > /dev/null 2>&1 && [[ -f $out/stale.h5 ]] \
  && echo "ok: a stale claim file did not stop the run" || fail "a stale claim file stopped the run"

# Held by another process: refused, naming the holder.
echo "pid 42 on somewhere token feedfeedfeedfeed" > "$out/.held.h5.claim"
# (Its sleep is ended with it and writes nowhere: an orphan holding this script's output kept
# ctest waiting out its 20 s.)
flock -n "$out/.held.h5.claim" sleep 20 </dev/null >/dev/null 2>&1 &
holder=$!
sleep 0.5
refused "another run (pid 42 on somewhere) is writing" --steps 2 --run-id held --overwrite
pkill -P "$holder" sleep; wait "$holder" 2>/dev/null
[[ -e $out/held.h5 ]] && fail "a refused run wrote held.h5"

# A symlink where the claim goes is not followed.
ln -s /etc/hostname "$out/.link.h5.claim"
refused "cannot create" --steps 2 --run-id link

# Four runs with one id at once (with --trace): one runs, three refused; its trace beside it.
for i in 1 2 3 4; do
  run --steps 20 --run-id together --trace --overwrite > "$out/together.$i.log" 2>&1 &
done
wait
winners=$(grep -L "runner: error" "$out"/together.?.log | wc -l)
losers=$(grep -l "another run (pid .*) is writing" "$out"/together.?.log | wc -l)
if [[ $winners -eq 1 && $losers -eq 3 && -f $out/together.h5 && -f $out/together.trace.json ]]; then
  echo "ok: four runs of one id at once: one ran, three refused"
else
  fail "four runs of one id at once: $winners ran, $losers refused (wanted 1 and 3)"
  tail -n 3 "$out"/together.?.log
fi

# Relaunched ranks (mpirun from the runner) find the launcher's claim theirs.
if run --steps 2 --ranks-per-node 2 --micro-batch 4 --run-id relaunched > "$out/relaunched.log" 2>&1 \
   && [[ -f $out/relaunched.h5 && ! -e $out/.relaunched.h5.claim ]]; then
  echo "ok: a relaunched run holds its claim through mpirun"
else
  fail "a relaunched run: $(grep -m 2 error "$out/relaunched.log")"
fi
((fails == 0)) || { echo "$fails failure(s)"; exit 1; }
echo "all run-claim checks passed"
