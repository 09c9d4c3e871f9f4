# Shared by the study tests (progress.sh, interrupt.sh, prediction.sh), sourced with the work
# directory: it starts empty; fail and ok keep the tally; finish prints it and is the test's
# exit status (0 when nothing failed).
# usage: source checks.sh WORK_DIR
work=$1
rm -rf "$work" && mkdir -p "$work"
fails=0 checks=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { checks=$((checks + 1)); }
finish() {
  echo "$checks passed, $fails failed"
  ((fails == 0))
}
