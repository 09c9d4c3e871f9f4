#!/usr/bin/env bash
# A study interrupted by SIGTERM (what --signal=B:TERM@120 sends before Slurm's time limit, and
# scancel) passes it to the running configuration, whose run file says cancelled; it starts no
# other run, leaves nothing running, and a second submission resumes: the interrupted run again and
# the one never started, nothing else. Outside Slurm (bash slurm/scale.sbatch), as make run does.
# usage: interrupt.sh SOURCE_DIR RUNNER CHECK_RUN WORK_DIR
set -u
src=$1 runner=$2 check_run=$3 work=$4
source "$(dirname "${BASH_SOURCE[0]}")/checks.sh" "$work"
cat > "$work/two.study" <<STUDY
STRATA_STUDY=interrupt
STRATA_STRATEGIES=ddp,zero1
STRATA_NODES=1
STRATA_RANKS_PER_NODE=1
STRATA_MODEL=tiny
STRATA_STEPS=1500
STRATA_ORDER=listed
STRATA_RUNNER_ARGS=--blas-threads 1
STUDY
study() { STRATA_RESULTS=$work STRATA_RUNNER=$runner exec bash "$src/slurm/scale.sbatch" "$work/two.study"; }
out=$work/interrupt
id=tiny_ddp_n1x1_weak_r1

(study) > "$work/first.log" 2>&1 &
script=$!
deadline=$((SECONDS + 60))
until grep -qE "run [0-9]+/[0-9]+ $id" "$work/first.log" 2>/dev/null && [[ -s $out/$id.log ]]; do
  ((SECONDS < deadline)) || { fail "the first run never started"; break; }
  sleep 0.2
done
sleep 1
kill -TERM "$script"
t0=$SECONDS
wait "$script"
code=$?
echo "the study ended $((SECONDS - t0)) s after SIGTERM, exit $code"
((code != 0)) && ok || fail "an interrupted study exited 0"
((SECONDS - t0 < 60)) && ok || fail "the study took $((SECONDS - t0)) s to end"
"$check_run" status "$out/$id.h5" cancelled "cancelled" && ok || fail "run file status"
[[ ! -e $out/$id.ok ]] && ok || fail "the interrupted run is marked done"
[[ ! -e $out/tiny_zero1_n1x1_weak_r1.h5 ]] && ok || fail "a run started after the signal"
grep -q "interrupted: $id" "$work/first.log" && ok || fail "no 'interrupted' line"
grep -q "cancelled" "$out/runs.tsv" && ok || fail "runs.tsv does not say cancelled"
sleep 0.5
pgrep -f -- "--run-id $id" >/dev/null && fail "processes left running" || ok

(study) > "$work/second.log" 2>&1
code=$?
((code == 0)) && ok || fail "the resumed study exited $code"
grep -q "done: 2 run (0 failed), 0 already done" "$work/second.log" && ok || fail "resume did not run exactly the two: $(grep 'done:' "$work/second.log")"
"$check_run" status "$out/$id.h5" ok "" && ok || fail "the resumed run is not ok"
[[ -e $out/$id.ok && -e $out/tiny_zero1_n1x1_weak_r1.ok ]] && ok || fail "not both marked done"
if ((fails)); then tail -n 20 "$work/first.log" "$work/second.log"; fi
finish
