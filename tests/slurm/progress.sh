#!/usr/bin/env bash
# A study's progress and its failed runs, outside Slurm (bash slurm/scale.sbatch, as make run):
# "N configuration(s) to run", each run as k/N with the elapsed time and an ETA once a run has
# ended, and a run that fails (the faulty test plugin, out of memory) logged and listed in runs.tsv
# with its exit code and the failure kind it stands for; the study then exits 1.
# usage: progress.sh SOURCE_DIR RUNNER PLUGIN_DIR WORK_DIR
set -u
src=$1 runner=$2 plugins=$3 work=$4
source "$(dirname "${BASH_SOURCE[0]}")/checks.sh" "$work"
cat > "$work/p.study" <<STUDY
STRATA_STUDY=progress
STRATA_STRATEGIES=ddp,zero1,faulty:mode=oom:rank=0:step=1
STRATA_NODES=1
STRATA_RANKS_PER_NODE=1
STRATA_MODEL=tiny
STRATA_STEPS=3
STRATA_ORDER=listed
STRATA_MICRO_BATCH=2
STRATA_RUNNER_ARGS=--blas-threads 1
STRATA_PLUGIN_PATH=$plugins
STUDY
run_study "$work/p.study"
out=$work/progress
((code == 1)) && ok || fail "a study with a failed run exited $code, want 1"
grep -q "scale: 3 configuration(s) to run" "$work/study.log" && ok || fail "no count of configurations"
grep -qE "run 1/3 tiny_ddp_n1x1_weak_r1 \(1 rank\(s\)\) \| elapsed 0h00m[0-9]{2}s \| ETA -$" \
  "$work/study.log" && ok || fail "first run: no k/N with elapsed time"
grep -qE "run 3/3 tiny_faulty_mode_oom_rank_0_step_1_n1x1_weak_r1 .*\| ETA 0h[0-9]{2}m[0-9]{2}s$" \
  "$work/study.log" && ok || fail "third run: no ETA after two runs"
grep -q "FAILED tiny_faulty.* (exit 5: out of memory, " "$work/study.log" && ok \
  || fail "the failed run is not logged with its kind"
grep -qP "\tfailed\(rc=5 out of memory\)\t" "$out/runs.tsv" && ok || fail "runs.tsv: $(cat "$out/runs.tsv")"
[[ $(grep -c $'\tok\t' "$out/runs.tsv") -eq 2 ]] && ok || fail "runs.tsv: want 2 ok runs"
grep -q "done: 3 run (1 failed)" "$work/study.log" && ok || fail "no done line with the failure"
# Results under a directory whose name holds glob characters: found, summarised (not taken as a
# pattern that matches nothing: "no run files yet").
globby="$work/[x] *"
mkdir -p "$globby"
printf 'STRATA_STUDY=g\nSTRATA_STRATEGIES=ddp\nSTRATA_NODES=1\nSTRATA_RANKS_PER_NODE=1\nSTRATA_MODEL=tiny\nSTRATA_STEPS=2\nSTRATA_RUNNER_ARGS=--blas-threads 1\n' \
  > "$work/g.study"
STRATA_RESULTS=$globby STRATA_RUNNER=$runner bash "$src/slurm/scale.sbatch" "$work/g.study" \
  > "$work/g.log" 2>&1 && [[ -s "$globby/g/summary.txt" ]] && ! grep -q "no run files yet" "$work/g.log" \
  && ok || fail "a study under '$globby': $(tail -3 "$work/g.log")"
finish
