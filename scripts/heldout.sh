#!/bin/bash
# The held-out check of the step-time predictor (docs/predict.md "Predicting step time"): a machine profile
# made only from some strategies' runs of a study predicts the runs of other strategies it never
# saw, and each prediction is compared with the measured step p50 (with repeats: the median of the
# configuration's repeats' p50, one line per configuration).
#
#   bash scripts/heldout.sh STUDY_DIR      # e.g. results/local after make run
#
#   HELDOUT_TRAIN    ddp,zero2           strategies whose runs make the profile (their phase timers,
#                                        --calibrate-comm samples; repeats: the median); a sharded
#                                        one among them fits the rate of the engine's new buffers
#                                        (zero2: its gradient buffers; zero1 allocates none per
#                                        step, so it cannot: then the rate, a machine constant, is
#                                        taken from the study's calibration, STUDY_DIR/profile.h5,
#                                        where there is one)
#   HELDOUT_PREDICT  the others of       strategies predicted from it
#                    ddp,zero1,zero2,zero3,fsdp,1f1b
#   HELDOUT_SHAPES   n1x1,n1x2           node shapes used (NxR as in the run ids; the local study's
#                                        not oversubscribed ones)
#   HELDOUT_LIMIT    15                  |error| in percent above which a configuration fails
#   HELDOUT_NAME     heldout             the files written: STUDY_DIR/NAME.h5 (the profile),
#                                        NAME.txt (the table) and NAME.log
#   STRATA_RUNNER    build/bin/runner
# Runs with plugin options (variants such as tp:dp=zero1) are left out. Exit 0 when every
# predicted configuration is within the limit, 1 when one is not, 2 for a usage error or when the
# study lacks the runs.
set -uo pipefail
die() { printf 'heldout: %s\n' "$*" >&2; exit 2; }
[[ $# -eq 1 && -d $1 ]] || die "usage: bash scripts/heldout.sh STUDY_DIR (a study's directory of run files)"
study=$1
home=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runner=${STRATA_RUNNER:-$home/build/bin/runner}
[[ -x $runner ]] || die "STRATA_RUNNER=$runner: not an executable (build first: make build)"
train=,${HELDOUT_TRAIN:-ddp,zero2},
predict=${HELDOUT_PREDICT:+,$HELDOUT_PREDICT,}
if [[ -z $predict ]]; then
  predict=,
  for s in ddp zero1 zero2 zero3 fsdp 1f1b; do [[ $train == *",$s,"* ]] || predict+=$s,; done
fi
shapes=,${HELDOUT_SHAPES:-n1x1,n1x2}, limit=${HELDOUT_LIMIT:-15} name=${HELDOUT_NAME:-heldout}
[[ $limit =~ ^[0-9]+([.][0-9]+)?$ ]] || die "HELDOUT_LIMIT=$limit: must be a percentage"
[[ $name =~ ^[A-Za-z0-9_-]+$ ]] || die "HELDOUT_NAME=$name: letters, digits, '_' and '-' only"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# The runner flags of each finished run: its .ok file says "job J, N s: runner FLAGS". Targets are
# configurations (the run id without its _rN): their repeats' ids in runs_of.
from=() targets=()
declare -A runs_of
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
  if [[ $predict == *",$plugin,"* ]]; then
    config=${id%_r[0-9]*}
    [[ -n ${runs_of[$config]:-} ]] || targets+=("$config")
    runs_of[$config]+="$id "
  fi
done
((${#from[@]} > 0)) || die "$study: no finished run of ${train:1:-1} on ${shapes:1:-1}"
((${#targets[@]} > 0)) || die "$study: no finished run of ${predict:1:-1} on ${shapes:1:-1}"

profile=$study/$name.h5
rm -f "$profile"
"$runner" --calibrate "${from[@]}" --profile "$profile" > "$study/$name.log" 2>&1 \
  || die "runner --calibrate --calibrate-from failed: $(tail -n 1 "$study/$name.log")"
# The machine constants no training run gives (the new-buffer rate without a sharded strategy among
# them; the host copy rate) from the study's calibration, entry by entry of one configuration.
if [[ -f $study/profile.h5 ]]; then
  /usr/bin/python3 - "$study/profile.h5" "$profile" >> "$study/$name.log" 2>&1 <<'PY' \
    || die "could not take the machine constants from $study/profile.h5 (see $study/$name.log)"
import sys, h5py
KEY = ("preset", "micro_batch", "device", "precision", "threads", "ranks_per_node")
CONSTANTS = ("fresh_memory_s_per_byte", "copy_s_per_byte")
def table(f):
    c = f["compute"]
    return {k: c[k][()] for k in c.keys()}, c
with h5py.File(sys.argv[1], "r") as cal, h5py.File(sys.argv[2], "r+") as out:
    a, _ = table(cal)
    b, group = table(out)
    key = lambda t, i: tuple(t[k][i] for k in KEY)
    measured = {key(a, i): i for i in range(len(a["preset"]))}
    for name in CONSTANTS:
        values = group[name][()]
        for i in range(len(values)):
            j = measured.get(key(b, i))
            if values[i] == 0 and j is not None and a[name][j] > 0:
                values[i] = a[name][j]
                print("heldout: %s of %s from the calibration" % (name, key(b, i)))
        group[name][...] = values
PY
fi

# Each target configuration's prediction from the held-out profile (a dry run with its first
# run's flags) against the median of its runs' measured p50 (results/summary --csv).
measured=$(/usr/bin/python3 "$home/results/summary" --csv "$study" 2> /dev/null) \
  || die "results/summary $study failed"
{
  printf 'profile from: %s (%s)\n' "${train:1:-1}" "${shapes:1:-1}"
  printf '%-36s %12s %12s %8s\n' configuration predicted_ms measured_ms error
  for config in "${targets[@]}"; do
    read -ra ids <<< "${runs_of[$config]}"
    read -ra flags <<< "$(sed -n 's/^job [^:]*: runner //p' "$study/${ids[0]}.ok")"
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
    # The median of the repeats' p50 (sorted first: mawk has no sort).
    p50=$(awk -F, -v ids=" ${runs_of[$config]}" 'NR == 1 { for (c = 1; c <= NF; c++) col[$c] = c; next }
      index(ids, " " $col["run_id"] " ") { print $col["step_ms_p50"] }' <<< "$measured" | sort -g |
      awk '{ v[++n] = $1 } END { if (n) print n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }')
    if [[ -z $predicted || -z $p50 ]]; then
      printf '%-36s %12s %12s %8s\n' "$config" "${predicted:--}" "${p50:--}" "-"
    else
      awk -v id="$config" -v p="$predicted" -v m="$p50" \
        'BEGIN { printf "%-36s %12.1f %12.1f %+7.1f%%\n", id, p, m, 100 * (p - m) / m }'
    fi
  done
} > "$study/$name.txt"
# The verdict: median |error| (sorted first: mawk has no sort) and the configurations beyond the
# limit.
awk 'NR > 2 { e = $4; sub(/%/, "", e); if (e == "-") print "nan"; else { e += 0; print (e < 0 ? -e : e) } }' \
  "$study/$name.txt" | sort -g | awk -v limit="$limit" '
  { n++; if ($1 == "nan") { bad++; next } v[++m] = $1; if ($1 + 0 > limit + 0) bad++ }
  END { med = m == 0 ? 0 : m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
    printf "held-out: %d configuration(s) predicted, median |error| %.1f%%, %d beyond %s%%\n", n, med, bad, limit
    exit bad > 0 }' >> "$study/$name.txt"
status=$?
cat "$study/$name.txt"
exit $status
