#!/usr/bin/env bash
# run.sh BUILD_DIR [SECONDS]: replay the known reproducers of each libFuzzer target of BUILD_DIR (a
# build configured with STRATA_BUILD_FUZZ=ON), then fuzz it for SECONDS (default 60). Prints each
# target's executions, coverage (cov, ft) and libFuzzer's final stats; exits 1 if anything crashed,
# hung, leaked or ran out of memory, with the path of the input that did it.
#
# Everything it writes stays under BUILD_DIR/fuzz/<target>/: corpus/ (the committed seeds of
# tests/fuzz/corpus/<target>/ plus what the fuzzer found, kept from run to run), crashes/, and the
# logs. The repository is only read.
set -uo pipefail

if (($# < 1)) || [[ ! -d $1 ]]; then
  echo "usage: $0 BUILD_DIR [SECONDS]  (BUILD_DIR configured with -DSTRATA_BUILD_FUZZ=ON)" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
seconds=${2:-60}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
targets=(fuzz_config fuzz_run_file)
limits=(-timeout=10 -rss_limit_mb=2048)

# Stop at the first report; leaks are bugs (neither libhdf5 nor Boost leaks on its own here, so
# there is no suppressions file). A small quarantine: HDF5 allocates and frees a large cache per
# file open, and recycling it sooner keeps the page faults, and so the run file target, cheaper.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:quarantine_size_mb=16${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"

# The lines of a libFuzzer log that say what went wrong and where the input is.
report() {
  grep -E 'ERROR: |SUMMARY: |runtime error: |^fuzz_[a-z_]+: |Test unit written to' "$1" | head -n 12
}

# One target: its reproducers, then SECONDS of fuzzing. Prints what it did; each failure's name
# goes on a line of its own into $work/failed.
fuzz_target() {
  local t=$1 bin=$build/bin/$1 work=$build/fuzz/$1
  mkdir -p "$work/corpus" "$work/crashes"
  : >"$work/failed"
  if [[ ! -x $bin ]]; then
    echo "$t: $bin not built (cmake --build $build --target $t)"
    echo "$t" >>"$work/failed"
    return
  fi
  local seed input log rc dict=()
  for seed in "$here/corpus/$t"/*; do
    [[ -f $seed && ! -e $work/corpus/${seed##*/} ]] && cp "$seed" "$work/corpus/"
  done

  # Known reproducers (bugs found before), one at a time so that each gets its own line.
  for input in "$here/regressions/$t"/*; do
    [[ -f $input ]] || continue
    log=$work/regression-${input##*/}.log
    if "$bin" "${limits[@]}" "$input" >"$log" 2>&1; then
      echo "$t: regression ${input##*/}: ok"
    else
      echo "$t: regression ${input##*/}: FAILED (input $input, log $log)"
      report "$log" | sed 's/^/    /'
      echo "$t:${input##*/}" >>"$work/failed"
    fi
  done

  [[ -f $here/$t.dict ]] && dict=(-dict="$here/$t.dict")
  log=$work/fuzz.log
  echo "$t: fuzzing for $seconds s (log $log)"
  "$bin" "$work/corpus" "${dict[@]}" "${limits[@]}" -max_total_time="$seconds" \
    -print_final_stats=1 -artifact_prefix="$work/crashes/" >"$log" 2>&1
  rc=$?
  grep -E '^#[0-9]+' "$log" | tail -n 1 | sed "s/^/$t: /"
  grep -E '^(Done |stat::)' "$log" | sed "s/^/$t: /"
  if ((rc != 0)); then
    echo "$t: FAILED (exit $rc); reproduce with: $bin <input>"
    report "$log" | sed 's/^/    /'
    echo "$t" >>"$work/failed"
  fi
}

# The targets fuzz at the same time, each a single-threaded process (on 2 cores each has its own:
# the same SECONDS of fuzzing each, in half the time of one after the other); their output is
# printed afterwards, target by target.
for t in "${targets[@]}"; do
  mkdir -p "$build/fuzz/$t"
  fuzz_target "$t" >"$build/fuzz/$t/run.out" 2>&1 &
done
wait
failed=()
for t in "${targets[@]}"; do
  cat "$build/fuzz/$t/run.out"
  mapfile -t -O "${#failed[@]}" failed <"$build/fuzz/$t/failed"
done

if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]}"
  exit 1
fi
echo "fuzz: no crash in ${targets[*]} ($seconds s each)"
