#!/usr/bin/env bash
# scale.sbatch's launch settings, inside a (pretend) job: a stand-in `srun` records its flags and
# runs the task; every run then shows srun --cpus-per-task / --cpu-bind / --gpus-per-task or
# --gpu-bind, STRATA_PRE_RUN ran before the runner was first called (it puts the launch prefix's
# command on PATH), STRATA_LAUNCH_PREFIX wraps every runner call (the study's own --list-plugins
# too), STRATA_PLUGIN_PATH reaches --list-plugins and the runs (a strategy only found there), and
# the runner's auto threads follow STRATA_CPUS_PER_TASK. Also --help. (tests/slurm/scale.sh runs
# the same settings under the real local Slurm.)
# usage: binding.sh SOURCE_DIR RUNNER PLUGIN_DIR WORK_DIR
set -uo pipefail
src=$1 runner=$2 plugin_dir=$3 work=$4
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work/bin" "$work/prefix-bin"
# srun: record the flags, run the task (the words after the last --flag) as rank 0 of 1.
cat > "$work/bin/srun" <<'SH'
#!/bin/bash
echo "$*" >> "$STRATA_FAKE_LOG/srun.args"
while [[ $1 == --* ]]; do shift; done
exec "$@"
SH
printf '#!/bin/bash\nexit 0\n' > "$work/bin/squeue"  # "no time limit"
# The launch prefix (a container launcher's stand-in), on PATH only once STRATA_PRE_RUN has run.
cat > "$work/prefix-bin/wrap" <<'SH'
#!/bin/bash
[[ $1 == --image ]] || { echo "wrap: expected --image, got $1" >&2; exit 9; }
echo "$2 $3 $4" >> "$STRATA_FAKE_LOG/wrap.args"  # image, runner, its first flag
shift 2; exec "$@"
SH
chmod +x "$work/bin/"* "$work/prefix-bin/wrap"

# --help prints the usage and starts nothing.
help=$(bash "$src/slurm/scale.sbatch" --help) || fail "--help exited $?"
grep -q "STRATA_CPUS_PER_TASK" <<<"$help" && grep -q "^  sbatch " <<<"$help" || fail "--help: $help"
[[ $(bash "$src/slurm/scale.sbatch" -h) == "$help" ]] || fail "-h differs from --help"

study() {  # study NAME RUNNER_ARGS [VAR=value...]: one tiny study in the pretend job
  local name=$1 args=$2; shift 2
  env PATH="$work/bin:$PATH" SLURM_JOB_ID=4242 SLURM_JOB_NUM_NODES=1 SLURM_SUBMIT_DIR="$src" STRATA_FAKE_LOG="$work" \
    OPENBLAS_NUM_THREADS= STRATA_RESULTS="$work/results" STRATA_RUNNER="$runner" STRATA_STUDY="$name" \
    STRATA_STRATEGIES=ddp,faulty:step=1000 STRATA_NODES=1 STRATA_MODEL=tiny STRATA_STEPS=2 \
    STRATA_RUNNER_ARGS="--peak-tflops 1 $args" STRATA_PLUGIN_PATH="$plugin_dir" \
    STRATA_PRE_RUN="PATH=$work/prefix-bin:\$PATH; echo pre-run >> $work/wrap.args" \
    STRATA_LAUNCH_PREFIX="wrap --image strata.sif" "$@" bash "$src/slurm/scale.sbatch" \
    > "$work/$name.out" 2>&1
}
prov() {  # prov FILE KEY
  /usr/bin/python3 -c 'import h5py, sys
v = h5py.File(sys.argv[1], "r")["provenance"].attrs[sys.argv[2]]
print(v.decode() if isinstance(v, bytes) else v)' "$1" "$2"
}

# 1. CPU binding: --cpus-per-task 1 (and SLURM_CPUS_PER_TASK in the ranks), --cpu-bind default.
study cpu "" STRATA_CPUS_PER_TASK=1 || { cat "$work/cpu.out"; fail "study cpu failed"; }
for run in tiny_ddp_n1x1_weak_r1 tiny_faulty_step_1000_n1x1_weak_r1; do
  [[ -s $work/results/cpu/$run.ok ]] || { cat "$work/cpu.out"; fail "cpu: $run did not run"; }
  [[ $(prov "$work/results/cpu/$run.h5" blas_threads) == 1 ]] \
    || fail "cpu: $run ran $(prov "$work/results/cpu/$run.h5" blas_threads) BLAS threads, not STRATA_CPUS_PER_TASK's 1"
done
[[ $(grep -c -- "--cpus-per-task=1 --cpu-bind=cores wrap --image strata.sif $runner --plugin" "$work/srun.args") -eq 2 ]] \
  || { cat "$work/srun.args"; fail "cpu: srun flags"; }
grep -q -- "--gpu" "$work/srun.args" && fail "cpu: a GPU flag without --device cuda"
grep -q -- "--plugin faulty .* --plugin-path $plugin_dir " "$work/srun.args" || fail "cpu: --plugin-path not passed to the run"
# PRE_RUN first, then every runner call through the prefix: --list-transports, --list-plugins.
[[ $(head -n 3 "$work/wrap.args" | tr '\n' '|') == "pre-run|strata.sif $runner --list-transports|strata.sif $runner --list-plugins|" ]] \
  || { cat "$work/wrap.args"; fail "cpu: pre-run and prefixed checks"; }
[[ $(grep -c "^strata.sif $runner --plugin$" "$work/wrap.args") -eq 2 ]] || fail "cpu: the runs did not go through the prefix"
echo "ok: srun --cpus-per-task=1 --cpu-bind=cores, 1 BLAS thread, PRE_RUN, LAUNCH_PREFIX, PLUGIN_PATH"

# 2. GPU binding: --device cuda in the runner's flags gives one GPU per task, or STRATA_GPU_BIND.
#    (The runner refuses --device cuda here: only srun's flags are checked.)
: > "$work/srun.args"
study gpu "--device cuda" STRATA_CPU_BIND=none STRATA_STRATEGIES=ddp
grep -q -- "--ntasks=1 --kill-on-bad-exit=1 --cpu-bind=none --gpus-per-task=1 wrap" "$work/srun.args" \
  || { cat "$work/srun.args"; fail "gpu: --gpus-per-task=1"; }
: > "$work/srun.args"
study gpubind "--device=cuda" STRATA_CPU_BIND= STRATA_GPU_BIND=closest STRATA_STRATEGIES=ddp
grep -q -- "--kill-on-bad-exit=1 --gpu-bind=closest wrap" "$work/srun.args" \
  || { cat "$work/srun.args"; fail "gpu: --gpu-bind=closest"; }
echo "ok: --device cuda -> --gpus-per-task=1, or --gpu-bind=STRATA_GPU_BIND"

# 3. A --plugin-path in STRATA_RUNNER_ARGS reaches the study's --list-plugins too.
: > "$work/srun.args"
study args "--plugin-path $plugin_dir" STRATA_PLUGIN_PATH= STRATA_STRATEGIES=faulty:step=1000 \
  || { cat "$work/args.out"; fail "study args: faulty not found through STRATA_RUNNER_ARGS"; }
[[ $(grep -o -- "--plugin-path" "$work/srun.args" | wc -l) -eq 1 ]] || fail "args: --plugin-path given to the run twice"
echo "ok: --plugin-path in STRATA_RUNNER_ARGS reaches --list-plugins"

# 4. Bad values: one line naming the setting, exit 2.
for kv in STRATA_CPUS_PER_TASK=0 STRATA_CPU_BIND=bogus STRATA_GPU_BIND=far "STRATA_PLUGIN_PATH=/nonexistent" \
  "STRATA_PRE_RUN=false"; do
  study bad "" STRATA_LAUNCH_PREFIX= "$kv"; code=$? err=$(cat "$work/bad.out")
  [[ $code -eq 2 && $(grep -c . <<<"$err") -eq 1 && $err == *"${kv%%=*}"* ]] || fail "$kv -> exit $code: $err"
done
echo "ok: bad binding settings refused in one line"
echo "PASS"
