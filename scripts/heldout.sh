#!/bin/bash
# The held-out check of the step-time predictor (docs/predict.md "Predicting step time"): a machine profile
# made only from some strategies' runs of a study predicts the runs of other strategies it never
# saw, and each prediction is compared with the measured step p50.
#
#   bash scripts/heldout.sh STUDY_DIR      # e.g. results/local after make run
#
#   HELDOUT_TRAIN    ddp,zero2           strategies whose runs make the profile (their phase timers,
#                                        --calibrate-comm samples); a sharded one among them fits the
#                                        rate of the engine's new buffers (zero2: its gradient
#                                        buffers; zero1 allocates none per step, so it cannot)
#   HELDOUT_PREDICT  zero3,fsdp,1f1b     strategies predicted from it
#   HELDOUT_SHAPES   n1x1,n1x2           node shapes used (NxR as in the run ids; the local study's
#                                        not oversubscribed ones)
#   HELDOUT_LIMIT    15                  |error| in percent above which a run fails the check
#   STRATA_RUNNER    build/bin/runner
# Runs with plugin options (variants such as tp:dp=zero1) are left out. Writes STUDY_DIR/heldout.h5
# (the profile) and STUDY_DIR/heldout.txt (the table). Exit 0 when every predicted run is within
# the limit, 1 when one is not, 2 for a usage error or when the study lacks the runs.
set -uo pipefail
die() { printf 'heldout: %s\n' "$*" >&2; exit 2; }
[[ $# -eq 1 && -d $1 ]] || die "usage: bash scripts/heldout.sh STUDY_DIR (a study's directory of run files)"
study=$1
home=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runner=${STRATA_RUNNER:-$home/build/bin/runner}
[[ -x $runner ]] || die "STRATA_RUNNER=$runner: not an executable (build first: make build)"
train=,${HELDOUT_TRAIN:-ddp,zero2}, predict=,${HELDOUT_PREDICT:-zero3,fsdp,1f1b},
shapes=,${HELDOUT_SHAPES:-n1x1,n1x2}, limit=${HELDOUT_LIMIT:-15}
[[ $limit =~ ^[0-9]+([.][0-9]+)?$ ]] || die "HELDOUT_LIMIT=$limit: must be a percentage"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# The runner flags of each finished run: its .ok file says "job J, N s: runner FLAGS".
from=() targets=()
for ok in "$study"/*.ok; do
  [[ -f $ok ]] || continue
  id=$(basename "$ok" .ok)
  [[ -f $study/$id.h5 ]] || continue
  read -ra flags <<< "$(sed -n 's/^job [^:]*: runner //p' "$ok")"
  plugin="" variant=0
  for ((i = 0; i < ${#flags[@]}; i++)); do
    [[ ${flags[i]} == --plugin ]] && plugin=${flags[i + 1]}
    [[ ${flags[i]} == --plugin-opt ]] && variant=1
  done
  shape=$(sed -n 's/.*_\(n[0-9]*x[0-9]*\)_.*/\1/p' <<< "$id")
  [[ -n $plugin && $variant == 0 && $shapes == *",$shape,"* ]] || continue
  [[ $train == *",$plugin,"* ]] && from+=(--calibrate-from "$study/$id.h5")
  [[ $predict == *",$plugin,"* ]] && targets+=("$id")
done
((${#from[@]} > 0)) || die "$study: no finished run of ${train:1:-1} on ${shapes:1:-1}"
((${#targets[@]} > 0)) || die "$study: no finished run of ${predict:1:-1} on ${shapes:1:-1}"

profile=$study/heldout.h5
rm -f "$profile"
"$runner" --calibrate "${from[@]}" --profile "$profile" > "$study/heldout.log" 2>&1 \
  || die "runner --calibrate --calibrate-from failed: $(tail -n 1 "$study/heldout.log")"

# Each target's prediction from the held-out profile (a dry run with its own flags) against its
# measured p50 (results/summary --csv).
measured=$(/usr/bin/python3 "$home/results/summary" --csv "$study" 2> /dev/null) \
  || die "results/summary $study failed"
{
  printf 'profile from: %s (%s)\n' "${train:1:-1}" "${shapes:1:-1}"
  printf '%-36s %12s %12s %8s\n' run predicted_ms measured_ms error
  for id in "${targets[@]}"; do
    read -ra flags <<< "$(sed -n 's/^job [^:]*: runner //p' "$study/$id.ok")"
    args=()
    for ((i = 0; i < ${#flags[@]}; i++)); do
      case ${flags[i]} in
        --profile | --out | --run-id) i=$((i + 1)) ;;
        --trace | --quiet | --calibrate-comm) ;;
        *) args+=("${flags[i]}") ;;
      esac
    done
    predicted=$("$runner" --dry-run "${args[@]}" --profile "$profile" 2>&1 |
      sed -n 's/^  step  *\([0-9.]*\) ms$/\1/p')
    p50=$(awk -F, -v id="$id" 'NR == 1 { for (c = 1; c <= NF; c++) col[$c] = c; next }
      $col["run_id"] == id { print $col["step_ms_p50"] }' <<< "$measured")
    if [[ -z $predicted || -z $p50 ]]; then
      printf '%-36s %12s %12s %8s\n' "$id" "${predicted:--}" "${p50:--}" "-"
    else
      awk -v id="$id" -v p="$predicted" -v m="$p50" \
        'BEGIN { printf "%-36s %12.1f %12.1f %+7.1f%%\n", id, p, m, 100 * (p - m) / m }'
    fi
  done
} > "$study/heldout.txt"
# The verdict: median |error| (sorted first: mawk has no sort) and the runs beyond the limit.
awk 'NR > 2 { e = $4; sub(/%/, "", e); if (e == "-") print "nan"; else { e += 0; print (e < 0 ? -e : e) } }' \
  "$study/heldout.txt" | sort -g | awk -v limit="$limit" '
  { n++; if ($1 == "nan") { bad++; next } v[++m] = $1; if ($1 + 0 > limit + 0) bad++ }
  END { med = m == 0 ? 0 : m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
    printf "held-out: %d run(s) predicted, median |error| %.1f%%, %d beyond %s%%\n", n, med, bad, limit
    exit bad > 0 }' >> "$study/heldout.txt"
status=$?
cat "$study/heldout.txt"
exit $status
