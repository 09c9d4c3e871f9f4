#!/usr/bin/env bash
# Memory admission (core/src/runner/memory_admission.hpp): a run whose predicted memory exceeds what the
# host lets it use is refused before it allocates: exit 4, one line naming the shortfall and what
# would fit, no run file; --memory-limit replaces the host's figure; --skip-memory-check runs it.
# usage: memory_admission.sh RUNNER OUTDIR
set -u
runner=$1 out=$2
rm -rf "$out" && mkdir -p "$out"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# refused SECONDS "<text>" args...: exit 4 within SECONDS, one stderr line with the text, no file.
refused() {
  local bound=$1 want=$2; shift 2
  local t0=$SECONDS err code
  err=$(/usr/bin/time -f "maxrss_kib %M" -o "$out/time.txt" timeout 60 "$runner" --out "$out" \
        --quiet "$@" 2>&1 >/dev/null); code=$?
  local secs=$((SECONDS - t0)) rss; rss=$(sed -n 's/^maxrss_kib //p' "$out/time.txt")
  local lines; lines=$(printf '%s\n' "$err" | grep -c .)
  if [[ $code -ne 4 || $lines -ne 1 || $err != *"$want"* || $secs -gt $bound ]]; then
    fail "runner $* -> exit $code after $secs s, $lines line(s): $err (wanted exit 4 within $bound s: $want)"
  elif ((rss > 1048576)); then
    fail "runner $* -> $rss KiB resident (wanted under 1 GiB)"
  else
    echo "ok: runner $* -> exit 4 after $secs s, $((rss / 1024)) MiB resident: $err"
  fi
}
# The audit's case: GPT-3 175B on this host without --dry-run (it grew to 17 GB before).
refused 5 "memory: the 1 rank(s) of this host need " --plugin ddp --model gpt3-175b --steps 1
refused 5 "no smaller micro-batch fits" --plugin ddp --model gpt3-175b --steps 1
# --memory-limit per rank instead of the host's figure; a smaller micro-batch that fits is named.
refused 5 "more than the 4.00 MiB they may use (--memory-limit)" --plugin ddp --model tiny \
  --micro-batch 8 --global-batch 8 --steps 2 --memory-limit 4MiB
# Two ranks relaunched here: both counted, refused before mpirun starts.
refused 5 "memory: the 2 rank(s) of this host need " --plugin ddp --model tiny --nodes 1 \
  --ranks-per-node 2 --steps 2 --memory-limit 1MiB
# What would fit is what fits: tiny at micro-batch 8 under a limit between micro-batch 2's and 4's
# predicted memory (--dry-run's total) is told to use micro-batch 2.
need() { "$runner" --plugin ddp --model tiny --global-batch 8 --micro-batch "$1" --dry-run |
         sed -n 's/^ *total *\([0-9]*\) bytes.*/\1/p'; }
n2=$(need 2) n4=$(need 4)
if [[ -z $n2 || -z $n4 || $n2 -ge $n4 ]]; then
  fail "--dry-run's totals of micro-batch 2 ($n2) and 4 ($n4)"
else
  refused 5 "--micro-batch 2 would fit" --plugin ddp --model tiny --micro-batch 8 --global-batch 8 \
    --steps 2 --memory-limit $(((n2 + n4) / 2))
fi
# Forced: the same run goes ahead and writes its file.
if OPENBLAS_NUM_THREADS=1 "$runner" --plugin ddp --model tiny --steps 2 --memory-limit 1MiB \
     --skip-memory-check --out "$out" --run-id forced --quiet > /dev/null 2>&1 && [[ -f $out/forced.h5 ]]; then
  echo "ok: --skip-memory-check ran it"
else
  fail "--skip-memory-check did not run the refused configuration"
fi
[[ $(find "$out" -name '*.h5' | wc -l) -eq 1 ]] || fail "a refused run left a run file"
((fails == 0)) && echo "memory admission: every case as expected"
exit $((fails > 0))
