#!/usr/bin/env bash
# A/B of training speed on `small`, 1 rank, 2 threads, in one run on one machine:
#   fp32 of this build against fp32 of an older build (REV, default the commit before mixed
#   precision), and bf16 against fp32 of this build. Runs alternate (old, new fp32, new bf16) for
#   REPS rounds so that machine noise hits all three alike; the median tokens/s of each is
#   reported with the two ratios. This machine is shared: compare ratios, not absolute speeds.
#
# usage: bench/precision_ab.sh [REV] [REPS] [STEPS]      (from the repository root, after `make build`)
set -euo pipefail
rev=${1:-71622fb}
reps=${2:-5}
steps=${3:-30}
root=$(git rev-parse --show-toplevel)
new="$root/build/bin/runner"
old_src="/tmp/strata-ab-$(git rev-parse --short "$rev")"
[[ -x "$new" ]] || { echo "precision_ab: build this tree first (make build)" >&2; exit 1; }

if [[ ! -e "$old_src/build/.ab-built" ]]; then
  echo "precision_ab: building $rev in $old_src (runner and plugins)"
  git -C "$root" worktree remove --force "$old_src" 2>/dev/null || rm -rf "$old_src"
  git -C "$root" worktree add --detach "$old_src" "$rev" >/dev/null
  cmake -S "$old_src" -B "$old_src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DSTRATA_WITH_CUDA=OFF -DSTRATA_BUILD_BENCH=OFF -DSTRATA_BUILD_TESTS=OFF >/dev/null
  cmake --build "$old_src/build" -j 2 >/dev/null
  touch "$old_src/build/.ab-built"
fi
old="$old_src/build/bin/runner"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# tokens/s of one run (the runner's summary line).
tokens() {
  "$@" --model small --steps "$steps" --warmup 3 --plugin ddp --blas-threads 2 --out "$out" \
    --quiet | awk '/throughput/ {print $2}'
}
declare -a a b c
for ((i = 0; i < reps; ++i)); do
  a+=("$(tokens "$old" --run-id old$i)")
  b+=("$(tokens "$new" --run-id new$i)")
  c+=("$(tokens "$new" --run-id bf16$i --precision bf16)")
  echo "round $((i + 1))/$reps: old fp32 ${a[i]}  new fp32 ${b[i]}  new bf16 ${c[i]} tokens/s"
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print v[int((NR + 1) / 2)]}'; }
ma=$(median "${a[@]}") mb=$(median "${b[@]}") mc=$(median "${c[@]}")
echo "median tokens/s: old fp32 $ma, new fp32 $mb, new bf16 $mc"
awk -v a="$ma" -v b="$mb" -v c="$mc" 'BEGIN {
  printf "fp32 new/old = %.3f (target >= 1 within noise)\nbf16/fp32    = %.3f (target >= 1.5)\n", b / a, c / b }'
