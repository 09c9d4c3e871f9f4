# Shared by the study tests (progress.sh, interrupt.sh, prediction.sh), sourced with the work
# directory: it starts empty; fail and ok keep the tally; run_study runs a study; finish prints
# the tally and is the test's exit status (0 when nothing failed).
# usage: source checks.sh WORK_DIR
work=$1
rm -rf "$work" && mkdir -p "$work"
fails=0 checks=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { checks=$((checks + 1)); }
# run_study FILE: slurm/scale.sbatch on FILE outside Slurm, as make run does (the caller's $src
# and $runner), into $work; its log in $work/study.log, printed; its exit status in $code.
run_study() {
  STRATA_RESULTS=$work STRATA_RUNNER=$runner bash "$src/slurm/scale.sbatch" "$1" > "$work/study.log" 2>&1
  code=$?
  cat "$work/study.log"
}
finish() {
  echo "$checks passed, $fails failed"
  ((fails == 0))
}
