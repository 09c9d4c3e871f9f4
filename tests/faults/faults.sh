#!/usr/bin/env bash
# Fault injection: one case per call. Each case starts a real job, injects its fault, and asserts
# what the design promises: the job ends (within a bound), nothing of it is left running, the run
# file at <out>/<run-id>.h5 exists with the right status and a reason naming the culprit, an earlier
# run file in the same directory is untouched, no temporary file is left behind, and (where the
# runner, not the launcher, ends the job) the exit code names the failure kind.
# usage: faults.sh CASE RUNNER CHECK_RUN PLUGIN_DIR WORK_DIR MPIRUN [MPI flags...]
set -u
case_name=$1 runner=$2 check_run=$3 plugin_dir=$4 work=$5 mpirun=$6
shift 6
mpi_flags=("$@")
out=$work/$case_name
rm -rf "$out" && mkdir -p "$out"
id=fault-$case_name-$$
log=$out/job.log
fails=0 checks=0
fail() { echo "FAIL [$case_name]: $*"; fails=$((fails + 1)); }
pass() { checks=$((checks + 1)); }

# An earlier run file that must survive every fault (made by a short healthy run).
OPENBLAS_NUM_THREADS=1 "$runner" --plugin ddp --steps 2 --quiet --out "$out" --run-id earlier \
  >/dev/null 2>&1 || { echo "FAIL: could not make the earlier run file"; exit 1; }
earlier_sum=$(md5sum < "$out/earlier.h5")
# The relaunch folders already there (an earlier runner killed with SIGKILL leaves its own), which
# finish() does not count against this case.
job_dirs_before=$(ls -d /dev/shm/strata-job.* 2>/dev/null)

# The job under test: N ranks of the tiny model for a long time, one line per step.
start_job() {  # start_job RANKS WATCHDOG [runner args...]
  local ranks=$1 watchdog=$2
  shift 2
  OPENBLAS_NUM_THREADS=1 "$mpirun" -np "$ranks" "${mpi_flags[@]}" "$runner" --plugin ddp \
    --steps 1000000 --micro-batch 2 --out "$out" --run-id "$id" --watchdog "$watchdog" "$@" \
    >"$log" 2>&1 &
  job=$!
}
wait_for() {  # wait_for REGEX SECONDS: until the job log matches
  local deadline=$((SECONDS + $2))
  until grep -qE "$1" "$log" 2>/dev/null; do
    ((SECONDS < deadline)) || { fail "no '$1' in the log after $2 s"; return 1; }
    sleep 0.2
  done
}
rank_pid() {  # rank_pid R: the pid of rank R of this job
  local p
  for p in $(pgrep -f -- "--run-id $id"); do
    [[ $(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p') == "$1" ]] \
      && { echo "$p"; return; }
  done
}
job_ends_within() {  # job_ends_within SECONDS
  local deadline=$((SECONDS + $1)) t0=$SECONDS
  while kill -0 "$job" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      fail "the job did not end within $1 s"
      pkill -9 -f -- "--run-id $id"
      break
    fi
    sleep 0.2
  done
  wait "$job" 2>/dev/null
  job_rc=$?
  echo "job ended after $((SECONDS - t0)) s, exit code $job_rc"
  pass
}
now_us() { echo "${EPOCHREALTIME//[!0-9]/}"; }
# expect_end_near_file FILE_US END_US [WHAT]: a relaunched job ended within 2.5 s of its run file:
# the supervising runner ends mpirun on the job-end note (core/src/comm/job_end_note.hpp) instead
# of waiting out mpirun's kill sequence after the ranks' non-zero exit (twice
# odls_base_sigkill_timeout, 6 s).
expect_end_near_file() {
  local ms=$((($2 - $1) / 1000))
  ((ms < 2500)) && pass || fail "${3:-the job} ended $ms ms after its run file (mpirun's kill sequence?)"
}
# await_file_then_end SECONDS: a relaunched job, signalled: its run file, then its end within
# SECONDS, near the file.
await_file_then_end() {
  local t0 file_us
  t0=$(now_us)
  until [[ -f $out/$id.h5 ]] || (($(now_us) - t0 > $1 * 1000000)); do sleep 0.05; done
  file_us=$(now_us)
  job_ends_within "$1"
  expect_end_near_file "$file_us" "$(now_us)"
}
expect_exit() {  # expect_exit CODE: the job's exit code names the failure kind (docs/running.md, "Exit codes")
  [[ $job_rc -eq $1 ]] && pass || fail "exit code $job_rc, want $1"
}
expect_file() {  # expect_file STATUS TEXT
  if "$check_run" status "$out/$id.h5" "$1" "$2"; then pass; else fail "run file status/reason"; fi
}
# expect_cancelled_by SIG: a signal that reached every rank at once (the launcher passed it on):
# the file names the rank rank 0 heard of it first, which is a race between the ranks.
expect_cancelled_by() {
  expect_file cancelled "cancelled: rank "
  expect_file cancelled " got $1 ("
}
finish() {
  sleep 0.5
  if pgrep -f -- "--run-id $id" >/dev/null; then
    fail "processes left running: $(pgrep -f -- "--run-id $id" | tr '\n' ' ')"
    pkill -9 -f -- "--run-id $id"
  else
    pass
  fi
  [[ $(md5sum < "$out/earlier.h5") == "$earlier_sum" ]] && pass || fail "earlier.h5 changed"
  local tmp
  tmp=$(find "$out" -name '.*.tmp-*')
  [[ -z $tmp ]] && pass || fail "temporary files left: $tmp"
  # A relaunch's own folder (mpirun's session directory, Open MPI's shared-memory segments, the
  # job-end note: core/src/runner/launch.cpp) goes with its supervisor.
  local dir left=
  for dir in /dev/shm/strata-job.*; do
    [[ -e $dir ]] && ! grep -qxF "$dir" <<<"$job_dirs_before" || continue
    dir=${dir#/dev/shm/strata-job.}
    kill -0 "${dir%%.*}" 2>/dev/null || left+=" /dev/shm/strata-job.$dir"
  done
  [[ -z $left ]] && pass || fail "folders of ended relaunches left:$left"
  if ((fails > 0)); then
    echo "--- job log ---"
    tail -n 30 "$log"
  fi
  # A sanitizer build's report in the job's log, printed so that the test's own check sees it
  # (tests/sanitize/sanitize.cmake: SANITIZE_REPORT).
  grep -E -A3 "ERROR: (Address|Leak|Thread)Sanitizer|WARNING: ThreadSanitizer|runtime error: " "$log" 2>/dev/null
  echo "$checks passed, $fails failed"
  [[ $fails -eq 0 ]]
  exit
}

case $case_name in
  kill9-rank1)  # a rank dies without a word: named in the file written by rank 0
    start_job 3 30
    wait_for "step +3/" 60 && kill -9 "$(rank_pid 1)"
    job_ends_within 20
    expect_file failed "rank(s) 1 ended without a word"
    ;;
  kill9-rank0)  # rank 0 dies: rank 1 writes the file in its place
    start_job 3 30
    wait_for "step +3/" 60 && kill -9 "$(rank_pid 0)"
    job_ends_within 20
    expect_file failed "rank 0 ended without a word"
    ;;
  sigstop-rank1)  # a stopped rank is named, not the ranks waiting for it
    start_job 3 4
    wait_for "step +3/" 60 && kill -STOP "$(rank_pid 1)"
    job_ends_within 20
    expect_file timeout "rank 1 stopped responding"
    ;;
  sigstop-rank0)
    start_job 3 4
    wait_for "step +3/" 60 && kill -STOP "$(rank_pid 0)"
    job_ends_within 25
    expect_file timeout "rank 0 stopped responding"
    ;;
  sigterm-launcher)  # Slurm's time limit / scancel / the launcher ending the job
    start_job 3 30
    wait_for "step +3/" 60 && kill -TERM "$job"
    job_ends_within 20
    expect_cancelled_by SIGTERM
    ;;
  sigint-relaunch)  # Ctrl-C to the runner that re-launched itself: its supervisor passes it on
    OPENBLAS_NUM_THREADS=1 "$runner" --plugin ddp --nodes 1 --ranks-per-node 2 --steps 1000000 \
      --micro-batch 2 --out "$out" --run-id "$id" >"$log" 2>&1 &
    job=$!
    wait_for "step +3/" 60 && kill -INT "$job"
    await_file_then_end 20
    expect_cancelled_by SIGINT
    expect_exit 130
    ;;
  sigpipe-1rank | sigpipe-relaunch)  # `runner | head -3`: the reader gone, a file naming SIGPIPE
    ranks=1
    [[ $case_name == *relaunch ]] && ranks=2
    (OPENBLAS_NUM_THREADS=1 timeout 60 "$runner" --plugin ddp --ranks-per-node "$ranks" --micro-batch 4 \
       --steps 1000000 --out "$out" --run-id "$id" 2>"$log" | head -3 >/dev/null
     echo "${PIPESTATUS[0]}" >"$out/rc") &
    job=$!
    if ((ranks == 1)); then job_ends_within 30; else await_file_then_end 30; fi
    job_rc=$(cat "$out/rc")
    if ((ranks == 1)); then expect_file cancelled "cancelled: rank 0 got SIGPIPE ("
    else expect_cancelled_by SIGPIPE; fi
    expect_exit 141
    ;;
  sigbus-rank1)  # a bus error (a mapped file shrank, /dev/shm full): failed, naming it
    start_job 3 30
    wait_for "step +3/" 60 && kill -BUS "$(rank_pid 1)"
    job_ends_within 20
    expect_file failed "rank 1 got SIGBUS"
    expect_exit 3
    ;;
  data-truncated)  # the --data file cut short under a running job: failed, naming --data
    head -c 2000000 /dev/zero >"$out/tokens.bin"
    start_job 2 30 --data "$out/tokens.bin"
    wait_for "step +3/" 60 && truncate -s 1000 "$out/tokens.bin"
    job_ends_within 20
    expect_file failed "--data $out/tokens.bin: cannot read tokens"
    expect_exit 3
    ;;
  data-fifo)  # a named pipe as --data: refused at once, not waited on for a writer
    mkfifo "$out/tokens.fifo"
    OPENBLAS_NUM_THREADS=1 timeout 20 "$runner" --plugin ddp --data "$out/tokens.fifo" --out "$out" \
      --run-id "$id" >"$log" 2>&1 &
    job=$!
    job_ends_within 10
    expect_exit 2
    grep -q -- "--data $out/tokens.fifo: not a regular file" "$log" && pass || fail "$(cat "$log")"
    ;;
  ulimit-v)  # an address-space limit below what a rank maps: refused (exit 4), no spin at exit
    (ulimit -v 200000; OPENBLAS_NUM_THREADS=1 timeout 20 "$runner" --plugin ddp --steps 1 \
       --out "$out" --run-id "$id" >"$log" 2>&1; echo $? >"$out/rc") &
    job=$!
    job_ends_within 10
    job_rc=$(cat "$out/rc")
    expect_exit 4
    [[ $(grep -c . "$log") -eq 1 ]] && grep -q "each process may map (ulimit -v)" "$log" && pass \
      || fail "want one line naming ulimit -v: $(cat "$log")"
    (ulimit -v 200000; timeout 20 "$runner" --version >/dev/null 2>&1) && pass \
      || fail "runner --version under ulimit -v 200000 did not exit 0"
    # The audit's limits with micro-batch 256 (a spin, a silent hang, an uncaught system_error
    # there): refused in one line, or a run whose file's status agrees with its exit code.
    for kib in 1000000 1200000 1500000; do
      (ulimit -v "$kib"; OPENBLAS_NUM_THREADS=1 timeout 60 "$runner" --plugin ddp --steps 3 --quiet \
         --micro-batch 256 --global-batch 256 --watchdog 5 --out "$out" --run-id "$id-$kib" \
         >"$log" 2>&1; echo $? >"$out/rc")
      rc=$(cat "$out/rc") status=none
      [[ -f $out/$id-$kib.h5 ]] && status=$("$check_run" status "$out/$id-$kib.h5" "" "" 2>/dev/null | sed -n 's/^status \([a-z]*\).*/\1/p')
      case "$rc:$status" in
        4:none | 0:ok | 5:oom | 3:failed) pass; echo "ulimit -v $kib: exit $rc, run file: $status" ;;
        *) fail "ulimit -v $kib: exit $rc with run file status '$status': $(tail -n 2 "$log")" ;;
      esac
    done
    ;;
  ulimit-n)  # too few open files for mpirun: raised to the hard limit, refused below it
    (ulimit -Sn 32; OPENBLAS_NUM_THREADS=1 timeout 60 "$runner" --plugin ddp --ranks-per-node 2 \
       --micro-batch 4 --steps 2 --quiet --out "$out" --run-id "$id-soft" >"$log" 2>&1) \
      && pass || fail "soft limit 32: $(tail -n 3 "$log")"
    (ulimit -n 32; OPENBLAS_NUM_THREADS=1 timeout 60 "$runner" --plugin ddp --ranks-per-node 2 \
       --micro-batch 4 --steps 2 --out "$out" --run-id "$id" >"$log" 2>&1; echo $? >"$out/rc") &
    job=$!
    job_ends_within 10
    job_rc=$(cat "$out/rc")
    expect_exit 2
    [[ $(grep -c . "$log") -eq 1 ]] && grep -q "open files, more than the hard limit of 32" "$log" \
      && pass || fail "want one line naming the open-file limit: $(cat "$log")"
    ;;
  signals-under-load)  # signals to the launcher while every core is busy elsewhere
    hogs=()
    for _ in 1 2 3 4; do (while :; do :; done) & hogs+=($!); done
    # The next trial starts once a trial's file is written, while its job may still be ending:
    # each job runs in a subshell that writes its exit code and end time to trial-N.end, and its
    # end is held to 20 s from its own signal.
    sigs=() signalled_at=() file_at=()
    for sig in TERM TERM TERM TERM TERM TERM TERM TERM TERM TERM USR1 HUP INT; do
      trial=$((${#sigs[@]} + 1)) sigs+=("$sig")
      (
        OPENBLAS_NUM_THREADS=1 "$runner" --plugin ddp --ranks-per-node 2 --micro-batch 4 \
          --steps 1000000 --out "$out" --run-id "$id-$trial" >"$out/trial-$trial.log" 2>&1 &
        echo $! >"$out/trial-$trial.pid"
        wait $!
        echo "$? $(now_us)" >"$out/trial-$trial.end"
      ) &
      # Signalled in its steps: once the first is logged (1.4-2.1 s after the start beside the
      # hogs on 2 cores; a fixed 3 s before, which a slower start would have missed).
      t0=$(now_us)
      until grep -qE "^step +1/" "$out/trial-$trial.log" 2>/dev/null || (($(now_us) - t0 > 30000000)); do
        sleep 0.05
      done
      t0=$(now_us) signalled_at+=("$t0")
      kill -"$sig" "$(<"$out/trial-$trial.pid")"
      until [[ -f $out/$id-$trial.h5 ]] || (($(now_us) - t0 > 10000000)); do sleep 0.05; done
      file_at+=("$(now_us)") ms=$((($(now_us) - t0) / 1000))
      if "$check_run" status "$out/$id-$trial.h5" cancelled "got SIG$sig" >/dev/null && ((ms < 10000)); then
        pass; echo "trial $trial: SIG$sig -> cancelled file after $ms ms"
      else
        fail "trial $trial: SIG$sig -> no cancelled file naming it within 10 s ($ms ms)"
        cp "$out/trial-$trial.log" "$log"
      fi
    done
    for trial in "${!sigs[@]}"; do
      sig=${sigs[$trial]} t0=${signalled_at[$trial]} trial=$((trial + 1))
      until [[ -s $out/trial-$trial.end ]] || (($(now_us) - t0 > 20000000)); do sleep 0.1; done
      if read -r job_rc ended <"$out/trial-$trial.end" 2>/dev/null && ((ended - t0 < 20000000)); then
        pass; echo "trial $trial: the job ended $(((ended - t0) / 1000)) ms after SIG$sig, exit code $job_rc"
        expect_exit $((128 + $(kill -l "$sig")))
        expect_end_near_file "${file_at[$((trial - 1))]}" "$ended" "trial $trial: the job"
      else
        fail "trial $trial: the job did not end within 20 s of SIG$sig"
        cp "$out/trial-$trial.log" "$log"
        pkill -9 -f -- "--run-id $id"
      fi
    done
    kill "${hogs[@]}"
    ;;
  sigterm-rank2)  # one rank alone gets SIGTERM: the job ends, cancelled, naming it
    start_job 3 30
    wait_for "step +3/" 60 && kill -TERM "$(rank_pid 2)"
    job_ends_within 20
    expect_file cancelled "cancelled: rank 2 got SIGTERM"
    ;;
  sigusr1-rank1 | sighup-rank0)  # Slurm's --signal=USR1@N to the ranks; a closed session's SIGHUP
    sig=${case_name%-*} rank=${case_name#*-rank}
    start_job 3 30
    wait_for "step +3/" 60 && kill -"${sig#sig}" "$(rank_pid "$rank")"
    job_ends_within 20
    expect_file cancelled "cancelled: rank $rank got ${sig^^}"
    ;;
  throw-setup | oom-setup | throw-step | oom-step | threads-step)  # an exception, a refused allocation or thread
    mode=${case_name%-*} at=${case_name#*-}
    OPENBLAS_NUM_THREADS=1 "$mpirun" -np 2 "${mpi_flags[@]}" "$runner" --plugin-path "$plugin_dir" \
      --plugin faulty --plugin-opt mode="$mode" --plugin-opt at="$at" --plugin-opt rank=1 \
      --plugin-opt step=3 --steps 10 --out "$out" --run-id "$id" >"$log" 2>&1 &
    job=$!
    job_ends_within 30
    want=failed reason="rank 1: faulty plugin: failing on purpose at $at" code=3
    [[ $mode == oom ]] && want=oom reason="rank 1: std::bad_alloc" code=5
    [[ $mode == threads ]] && want=oom reason="rank 1: Resource temporarily unavailable (a thread or its memory was refused" code=5
    expect_file "$want" "$reason"
    expect_exit "$code"
    [[ $(grep -c 'could not write' "$log") -eq 0 ]] && pass || fail "a second, failed write"
    ;;
  hang)  # a rank skips a collective: the watchdog names the call each rank waits in
    OPENBLAS_NUM_THREADS=1 "$mpirun" -np 2 "${mpi_flags[@]}" "$runner" --plugin-path "$plugin_dir" \
      --plugin faulty --plugin-opt mode=hang --plugin-opt rank=1 --steps 10 --watchdog 3 \
      --out "$out" --run-id "$id" >"$log" 2>&1 &
    job=$!
    job_ends_within 20
    expect_file timeout "rank 0 waits in all_reduce on group dp"
    expect_exit 6
    ;;
  disk-full)  # --out on a full file system: a clear error, no crash, the earlier file intact
    cp "$out/earlier.h5" "$work/disk-full-earlier.h5"
    unshare -m bash -c "mount -t tmpfs -o size=160k tmpfs '$out' 2>/dev/null || exit 77
      cp '$work/disk-full-earlier.h5' '$out/earlier.h5' || exit 78
      head -c 400000 /dev/zero > '$out/fill' 2>/dev/null
      OPENBLAS_NUM_THREADS=1 '$runner' --plugin ddp --steps 2 --quiet --trace --out '$out' \
        --run-id '$id' >'$work/disk-full.log' 2>&1
      code=\$?
      ls '$out' | grep -q 'trace.json' && code=97
      cmp -s '$work/disk-full-earlier.h5' '$out/earlier.h5' || code=99
      ls -a '$out' | grep -q '\.tmp-' && code=98
      exit \$code" 2>/dev/null
    code=$?
    log=$work/disk-full.log
    [[ $code -ne 77 ]] || { echo "FAIL: cannot mount a tmpfs in a mount namespace here"; exit 1; }
    [[ $code -eq 1 ]] && pass || fail "exit code $code (want 1; 97: a trace JSON without its run file, 98: temporary file left, 99: earlier file changed, >128: a crash)"
    grep -q "No space left on device" "$log" && pass || fail "no clear disk-full error"
    [[ $(grep -c "runner: error" "$log") -eq 1 ]] && pass || fail "want one error line: $(cat "$log")"
    grep -q "MPI_ABORT\|Segmentation\|backtrace" "$log" && fail "a crash or an abort banner: $(cat "$log")" || pass
    echo "$checks passed, $fails failed"
    [[ $fails -eq 0 ]]
    exit
    ;;
  trace-replaced)  # a failed run under the id of an earlier traced run leaves no stale timeline
    OPENBLAS_NUM_THREADS=1 "$runner" --plugin ddp --steps 3 --quiet --trace --out "$out" \
      --run-id "$id" >"$log" 2>&1
    [[ -s $out/$id.trace.json ]] && pass || fail "the healthy traced run wrote no timeline"
    OPENBLAS_NUM_THREADS=1 "$mpirun" -np 2 "${mpi_flags[@]}" "$runner" --plugin-path "$plugin_dir" \
      --plugin faulty --plugin-opt rank=1 --plugin-opt step=2 --steps 10 --trace --overwrite --out "$out" \
      --run-id "$id" >>"$log" 2>&1 &
    job=$!
    job_ends_within 30
    expect_file failed "failing on purpose at step 2"
    [[ ! -e $out/$id.trace.json ]] && pass || fail "a timeline that belongs to an earlier run"
    ;;
  bad-data)  # a corrupt token file: one line before any rank starts, even for 4 ranks
    printf 'odd' > "$out/tokens.bin"
    OPENBLAS_NUM_THREADS=1 "$runner" --plugin ddp --nodes 1 --ranks-per-node 4 --data "$out/tokens.bin" \
      --out "$out" --run-id "$id" >"$log" 2>&1
    code=$?
    [[ $code -eq 2 ]] && pass || fail "exit $code, want 2"
    [[ $(grep -c . "$log") -eq 1 ]] && pass || fail "want one line, got: $(cat "$log")"
    [[ ! -e $out/$id.h5 ]] && pass || fail "a run file for a run that never started"
    ;;
  *)
    echo "unknown case $case_name"
    exit 2
    ;;
esac
finish
