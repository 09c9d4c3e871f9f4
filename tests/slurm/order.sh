#!/usr/bin/env bash
# STRATA_ORDER=shuffled (the default) with STRATA_REPEATS=2: the runs go round-robin, every
# configuration's first run before any second, each round in a seeded random order that a second
# study with the same seed repeats; results/summary gives each configuration's median over its
# repeats; STRATA_REPEAT_NODES repeats only some node shapes. Outside Slurm (bash slurm/scale.sbatch), as make run does.
# usage: order.sh SOURCE_DIR RUNNER WORK_DIR
set -u
src=$1 runner=$2 work=$3
source "$(dirname "${BASH_SOURCE[0]}")/checks.sh" "$work"
study_file() {  # study_file NAME [KEY=VALUE...]: four configurations, two repeats, seed 7
  local name=$1; shift
  {
    cat <<STUDY
STRATA_STUDY=$name
STRATA_STRATEGIES=ddp,zero1,zero2,zero3
STRATA_NODES=1
STRATA_RANKS_PER_NODE=1
STRATA_MODEL=tiny
STRATA_STEPS=3
STRATA_MICRO_BATCH=2
STRATA_REPEATS=2
STRATA_ORDER_SEED=7
STRATA_RUNNER_ARGS=--blas-threads 1 --warmup 1
STUDY
    printf '%s\n' "$@"  # later lines override earlier ones
  } > "$work/$name.study"
}
# The run ids in the order the study started them (its k/N lines).
started() { grep -oE "run [0-9]+/8 [^ ]+" "$work/$1.log" | awk '{print $3}' | tr '\n' ' '; }
study_file first
run_study "$work/first.study"
((code == 0)) && ok || fail "the study exited $code"
cp "$work/study.log" "$work/first.log"
order=$(started first)
read -ra ids <<< "$order"
((${#ids[@]} == 8)) && ok || fail "8 runs expected, started: $order"
round1=$(printf '%s\n' "${ids[@]:0:4}" | sort | tr '\n' ' ')
round2=$(printf '%s\n' "${ids[@]:4:4}" | sed 's/_r2$/_r1/' | sort | tr '\n' ' ')
[[ $round1 == "$round2" && $round1 != *_r2* ]] && ok \
  || fail "not round-robin (every configuration's r1, then its r2): $order"
listed="tiny_ddp_n1x1_weak_r1 tiny_zero1_n1x1_weak_r1 tiny_zero2_n1x1_weak_r1 tiny_zero3_n1x1_weak_r1"
[[ ${ids[*]:0:4} != "$listed" || ${ids[*]:4:4} != "${listed//_r1/_r2}" ]] && ok \
  || fail "both rounds in the listed order: $order"
grep -q "2 repeat(s) in shuffled order" "$work/first.log" && ok || fail "the study line does not name the order"
study_file second
run_study "$work/second.study"
cp "$work/study.log" "$work/second.log"
[[ $(started second | sed 's/_r/_R/g') == "$(echo "$order" | sed 's/_r/_R/g')" ]] && ok \
  || fail "the same seed gave another order: $(started second) vs $order"
# The summary's medians over repeats: one line per configuration, 2 runs each.
table=$("$src/results/summary" "$work/first") || fail "results/summary exit $?"
[[ $(grep -cE "^  (ddp|zero1|zero2|zero3) dp1.tp1.pp1 1x1 tiny .*: 2 runs, tokens/s median " <<< "$table") -eq 4 ]] \
  && ok || { echo "$table"; fail "no median over repeats for each of the 4 configurations"; }
# STRATA_REPEAT_NODES: only the 1-node configurations are repeated, the 2-node ones run once.
study_file shapes STRATA_STRATEGIES=ddp,zero1 STRATA_NODES=1,2 STRATA_REPEAT_NODES=1
run_study "$work/shapes.study"
((code == 0)) && ok || fail "the shapes study exited $code"
ids=$(grep -oE "run [0-9]+/6 [^ ]+" "$work/study.log" | awk '{print $3}' | sort | tr '\n' ' ')
want="tiny_ddp_n1x1_weak_r1 tiny_ddp_n1x1_weak_r2 tiny_ddp_n2x1_weak_r1 tiny_zero1_n1x1_weak_r1 tiny_zero1_n1x1_weak_r2 tiny_zero1_n2x1_weak_r1 "
[[ $ids == "$want" ]] && ok || fail "STRATA_REPEAT_NODES=1: ran $ids, want $want"
grep -q "2 repeat(s) (on node shapes 1; the others once) in shuffled order" "$work/study.log" && ok \
  || fail "the study line does not name the repeated node shapes"
finish
