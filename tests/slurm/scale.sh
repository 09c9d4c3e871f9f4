#!/usr/bin/env bash
# End to end on a real Slurm: start a local cluster of 4 virtual nodes, submit
# `sbatch slurm/scale.sbatch slurm/studies/tiny.study`, wait, check every run file and the
# figures, submit again and check that nothing is re-run, submit a study with too little time
# left and check that it starts nothing, let the runner relaunch itself with srun inside an
# allocation, run a study with STRATA_CPUS_PER_TASK (srun's binding flags, the runner's threads),
# run a transport A/B study (mpi vs ucx and gloo), stop the cluster and check that its
# processes are gone.
# usage: scale.sh SOURCE_DIR RUNNER CHECK_RUN WORK_DIR PORT
set -euo pipefail
src=$1 runner=$2 check_run=$3 work=$4 port=$5
fail() { echo "FAIL: $*"; exit 1; }
[[ $(id -u) -eq 0 ]] || fail "needs root to start slurmd (run the tests as root, as CI does)"
for t in slurmctld slurmd munged sbatch squeue scontrol; do
  command -v "$t" >/dev/null || fail "$t missing: scripts/install-deps.sh installs Slurm and munge"
done

cluster="$src/slurm/local-cluster --dir $work/cluster --port $port"
rm -rf "$work" && mkdir -p "$work"
$cluster stop >/dev/null 2>&1 || true
trap '$cluster stop' EXIT
$cluster start --nodes 4 --cpus 2
eval "$($cluster env)"
export STRATA_RESULTS=$work/results STRATA_RUNNER=$runner
cd "$src"

# submit FLAGS... : runs one job to its end; prints its id; the job's output in $work/job-ID.out
final_states='^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)$'
submit() {
  local id state
  id=$(sbatch --parsable -N 4 --ntasks-per-node 1 -o "$work/job-%j.out" "$@") || fail "sbatch refused"
  # Wait for a final state. scontrol keeps the record after the job ends (MinJobAge), and a
  # query that fails (a busy controller) is retried rather than taken for "gone". Asked every
  # 0.2 s (a query takes tens of ms): a 1 s poll lost half a second a job on average.
  for ((t = 0; t < 3000; t++)); do
    state=$(scontrol -o show job "$id" 2>/dev/null | grep -o -E 'JobState=[A-Z_]+' | cut -d= -f2)
    [[ $state =~ $final_states ]] && break
    sleep 0.2
  done
  [[ $state =~ $final_states ]] || { scancel "$id"; fail "job $id still '$state' after 10 minutes"; }
  echo "$id"
}
job_state() { scontrol show job "$1" | grep -o -E 'JobState=[A-Z]+|ExitCode=[0-9:]+' | tr '\n' ' '; }

study=$work/results/tiny
strategies=(ddp zero3 fsdp 1f1b)
nodes=(1 2 4)

# 1. The study runs: 12 configurations, each with its run file, log and ok file.
id=$(submit slurm/scale.sbatch slurm/studies/tiny.study)
cat "$work/job-$id.out"
[[ $(job_state "$id") == "JobState=COMPLETED ExitCode=0:0 " ]] || fail "job $id: $(job_state "$id")"
for s in "${strategies[@]}"; do
  for n in "${nodes[@]}"; do
    run=tiny_${s}_n${n}x1_weak_r1
    for ext in h5 log ok; do [[ -s $study/$run.$ext ]] || fail "$run.$ext missing"; done
    "$check_run" layout "$study/$run.h5" "$n" 10 >/dev/null || fail "$run.h5 layout"
    "$check_run" predicted "$study/$run.h5" >/dev/null || fail "$run.h5 bytes or memory differ from predicted"
  done
done
# The virtual nodes are real Slurm nodes: rank r of the 4-node runs ran on n(r+1).
h5dump -d /provenance/hostnames "$study/tiny_ddp_n4x1_weak_r1.h5" | grep -q '"n1", "n2", "n3", "n4"' \
  || fail "4-node run did not run on n1..n4"
# Equivalence: the sharded strategies follow ddp's loss trajectory at every node count.
for s in zero3 fsdp; do
  for n in "${nodes[@]}"; do
    "$check_run" trajectory "$study/tiny_ddp_n${n}x1_weak_r1.h5" "$study/tiny_${s}_n${n}x1_weak_r1.h5" 1e-5 \
      >/dev/null || fail "$s on $n nodes left ddp's trajectory"
  done
done
[[ $(sed '/^$/q' "$study/summary.txt" | grep -c .) -eq 13 ]] || fail "summary.txt: expected a header and 12 rows"
grep -q "^Provenance" "$study/summary.txt" && grep -q "^Caveats" "$study/summary.txt" \
  || fail "summary.txt: no provenance and caveats"
[[ $(wc -l < "$study/summary.csv") -eq 13 ]] || fail "summary.csv: expected a header and 12 rows"
for fig in throughput efficiency memory comm bubble loss; do
  file "$study/figures/$fig.png" | grep -q 'PNG image' || fail "figures/$fig.png missing"
  file "$study/figures/$fig.pdf" | grep -q 'PDF document' || fail "figures/$fig.pdf missing"
  grep -q "data:image/png;base64" "$study/figures/report.html" || fail "report.html has no figures"
done
[[ $(wc -l < "$study/runs.tsv") -eq 12 ]] || fail "runs.tsv: expected 12 runs"

# 2. Submitted again: every configuration has its ok file, so nothing runs and no file changes.
(cd "$study" && md5sum ./*.h5 ./*.ok > "$work/before.md5")
id=$(submit slurm/scale.sbatch slurm/studies/tiny.study)
cat "$work/job-$id.out"
[[ $(job_state "$id") == "JobState=COMPLETED ExitCode=0:0 " ]] || fail "resubmitted job $id: $(job_state "$id")"
grep -q "done: 0 run (0 failed), 12 already done" "$work/job-$id.out" || fail "resubmission re-ran configurations"
(cd "$study" && md5sum --quiet -c "$work/before.md5") || fail "resubmission changed run files"
[[ $(wc -l < "$study/runs.tsv") -eq 12 ]] || fail "runs.tsv grew on resubmission"

# 3. Too little time left in the job (5 minutes, 400 s wanted per run): no run starts, the job
#    says how many are left and fails so that the user sees it.
id=$(submit -t 5 --export=ALL,STRATA_STUDY=short,STRATA_RESERVE_S=400 slurm/scale.sbatch slurm/studies/tiny.study)
cat "$work/job-$id.out"
[[ $(job_state "$id") == "JobState=FAILED ExitCode=1:0 " ]] || fail "short job $id: $(job_state "$id")"
grep -q "stopping: .* s left in the job, a run needs 400 s" "$work/job-$id.out" || fail "no stop message"
grep -q "0 run (0 failed), 0 already done, 0 invalid, 12 left" "$work/job-$id.out" || fail "short job ran something"
! compgen -G "$work/results/short/*.h5" >/dev/null || fail "short job left run files"

# 4. `runner --plugin zero3 --nodes 4` inside an allocation launches its ranks itself with srun.
id=$(submit --wrap "$runner --plugin zero3 --nodes 4 --model tiny --steps 4 --blas-threads 1 --out $work/relaunch --run-id zero3 --quiet")
cat "$work/job-$id.out"
[[ $(job_state "$id") == "JobState=COMPLETED ExitCode=0:0 " ]] || fail "relaunch job $id: $(job_state "$id")"
grep -q "srun --mpi=pmix --nodes=4" "$work/job-$id.out" || fail "runner did not relaunch itself with srun"
"$check_run" layout "$work/relaunch/zero3.h5" 4 4 >/dev/null || fail "relaunched run file layout"
h5dump -d /provenance/hostnames "$work/relaunch/zero3.h5" | grep -q '"n1", "n2", "n3", "n4"' \
  || fail "relaunched run did not span n1..n4"

# 4b. Binding: STRATA_CPUS_PER_TASK=1 reaches srun (with the default --cpu-bind=cores) and the
#     runner's auto threads: 1, where this node's 2 CPUs would otherwise give 2 to its one rank.
id=$(export STRATA_STUDY=bind STRATA_STRATEGIES=ddp STRATA_NODES=1 STRATA_CPUS_PER_TASK=1 \
  STRATA_RUNNER_ARGS="--layers 4 --warmup 2"
  submit slurm/scale.sbatch slurm/studies/tiny.study)
cat "$work/job-$id.out"
[[ $(job_state "$id") == "JobState=COMPLETED ExitCode=0:0 " ]] || fail "binding job $id: $(job_state "$id")"
grep -q -- "launch: srun --mpi=pmix --nodes=1 --ntasks-per-node=1 --ntasks=1 --kill-on-bad-exit=1 --cpus-per-task=1 --cpu-bind=cores $runner " \
  "$work/job-$id.out" || fail "binding job: srun without --cpus-per-task=1 --cpu-bind=cores"
threads=$(h5dump -a /provenance/blas_threads "$work/results/bind/tiny_ddp_n1x1_weak_r1.h5" | grep -o '"[0-9]*"')
[[ $threads == '"1"' ]] || fail "binding job: $threads BLAS threads, not STRATA_CPUS_PER_TASK's 1"

# 5. A transport A/B inside one study (when UCX or gloo is built, as in CI): ddp and zero3 on 2 and
#    4 nodes over mpi and every other host transport; each run follows its MPI twin's loss
#    trajectory, and results/compare pairs the twins.
others=$("$runner" --list-transports | cut -f1 | grep -xE 'ucx|gloo' | paste -sd, -)
if [[ -n $others ]]; then
  # Comma lists cannot go through sbatch --export: the job inherits them from this environment.
  ab() {
    export STRATA_STUDY=ab STRATA_STRATEGIES=ddp,zero3 STRATA_NODES=2,4 STRATA_TRANSPORTS=mpi,$others
    submit slurm/scale.sbatch slurm/studies/tiny.study
  }
  id=$(ab)
  cat "$work/job-$id.out"
  # A rank that segfaulted at start-up, before strata wrote anything (UCX's handler reports it;
  # seen about once in several CI runs under load, never alone), fails its run: the study is
  # submitted again, as a user would, and only its failed runs run again. Any other failure,
  # or a second one, fails the test.
  if [[ $(job_state "$id") != "JobState=COMPLETED ExitCode=0:0 " ]]; then
    failed=$(awk -F'\t' '$3 ~ /^failed/ {print $2}' "$work/results/ab/runs.tsv")
    startup=1
    for r in $failed; do
      [[ ! -e $work/results/ab/$r.h5 ]] && grep -q "Segmentation fault" "$work/results/ab/$r.log" || startup=0
    done
    if [[ -n $failed && $startup == 1 ]]; then
      echo "note: A/B job $id: $(echo $failed) died at start-up (segfault, no run file); resubmitting"
      id=$(ab)
      cat "$work/job-$id.out"
      grep -q "done: $(wc -w <<<"$failed") run (0 failed), " "$work/job-$id.out" \
        || fail "the resubmitted A/B job ran more than the failed runs again"
    fi
  fi
  [[ $(job_state "$id") == "JobState=COMPLETED ExitCode=0:0 " ]] || fail "A/B job $id: $(job_state "$id")"
  for t in ${others//,/ }; do
    for s in ddp zero3; do
      for n in 2 4; do
        mpi=$work/results/ab/tiny_${s}_n${n}x1_weak_r1.h5 twin=$work/results/ab/tiny_${s}_n${n}x1_weak_${t}_r1.h5
        h5dump -a /config/transport "$twin" | grep -q "\"$t\"" || fail "$twin did not run over $t"
        "$check_run" trajectory "$mpi" "$twin" 1e-5 >/dev/null || fail "$s on $n nodes: $t left mpi's trajectory"
      done
    done
    "$src/results/compare" --ignore transport --where-a transport=mpi --where-b transport=$t \
      "$work/results/ab" "$work/results/ab" > "$work/ab_$t.txt"
    cat "$work/ab_$t.txt"
    grep -q "^4 configuration(s)" "$work/ab_$t.txt" && ! grep -q "only in" "$work/ab_$t.txt" \
      || fail "results/compare did not pair the mpi and $t runs"
  done
else
  echo "note: this build has neither UCX nor gloo; the transport A/B part did not run"
fi

# 6. Stop: the daemons it started are gone.
pids=$(cat "$work"/cluster/ctld/slurmctld.pid "$work"/cluster/nodes/*/slurmd.pid "$work"/cluster/munge/munged.pid)
trap - EXIT
$cluster stop
for p in $pids; do
  if [[ -r /proc/$p/stat ]] && ! grep -q ') Z' "/proc/$p/stat"; then fail "process $p still running after stop"; fi
done
echo "PASS: study of 12 runs on 4 Slurm nodes, resubmission re-ran nothing, time limit respected, runner relaunched itself with srun, binding (--cpus-per-task, 1 thread), transport A/B"
