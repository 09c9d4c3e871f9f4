#!/usr/bin/env bash
# An out-of-tree plugin builds against an installed prefix and runs: install strata, build
# tests/out_of_tree (find_package(strata) + strata_add_plugin(), nothing from the source tree but
# its two files), list it, run it on 2 ranks beside the installed zero3 and compare: the same
# losses (the same algorithm), less or equal peak memory, exposed comm not below zero3's. The
# prefix is moved after installing: the package's CMake and pkg-config files hold no absolute path
# of the source, the build or the install prefix. Last, the plugin installs beside strata's own.
# usage: build_and_run.sh SOURCE_DIR BUILD_DIR WORK_DIR CHECK_RUN
set -eu
src=$1 build=$2 work=$3 check_run=$4
rm -rf "$work" && mkdir -p "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$work/installed" >/dev/null
mv "$work/installed" "$prefix"
stale=$(grep -rlF -e "$work/installed" -e "$(cd "$build" && pwd)" -e "$src" "$prefix/lib/cmake" "$prefix/lib/pkgconfig" || true)
[[ -z $stale ]] || { echo "FAIL: absolute build or install paths in $stale"; exit 1; }
cp "$src/tests/out_of_tree/CMakeLists.txt" "$src/tests/out_of_tree/zero_lean.cpp" "$work/"
cmake -S "$work" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
# The package it found is the moved prefix's, at its version.
grep -q "^strata_DIR:PATH=$prefix/lib/cmake/strata$" "$work/build/CMakeCache.txt" \
  || { grep strata_DIR "$work/build/CMakeCache.txt"; echo "FAIL: strata not found in $prefix"; exit 1; }
cmake --build "$work/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
plugin_dir=$work/build
"$prefix/bin/runner" --plugin-path "$plugin_dir" --list-plugins | grep -qE "^zero-lean +" \
  || { echo "FAIL: zero-lean not listed"; exit 1; }
exported=$(nm -D --defined-only "$plugin_dir/libstrata_zero_lean.so" | awk '{print $3}' | grep -c strata || true)
[[ $exported -eq 3 ]] || { echo "FAIL: $exported strata symbols exported, want the 3 entry points"; exit 1; }
run() {
  "$prefix/bin/runner" --plugin-path "$plugin_dir" --plugin "$1" --nodes 1 --ranks-per-node 2 \
    --steps 4 --blas-threads 1 --quiet --out "$work/runs" --run-id "$@" > "$work/$1.log" 2>&1 \
    || { cat "$work/$1.log"; echo "FAIL: $1 did not run"; exit 1; }
}
run zero-lean
run zero3 --calibrate-comm
"$check_run" layout "$work/runs/zero-lean.h5" 2 4
"$check_run" trajectory "$work/runs/zero3.h5" "$work/runs/zero-lean.h5" 0
"$check_run" predicted "$work/runs/zero-lean.h5"
# Its step time predicted through the SDK (the engine's plan_step), from a profile of the zero3 run:
# the same compute, and without prefetch or overlap no less exposed comm than zero3.
"$prefix/bin/runner" --calibrate --calibrate-from "$work/runs/zero3.h5" --profile "$work/profile.h5" \
  > "$work/calibrate.log" 2>&1 || { cat "$work/calibrate.log"; echo "FAIL: profile from the zero3 run"; exit 1; }
exposed() {
  local out
  out=$("$prefix/bin/runner" --plugin-path "$plugin_dir" --plugin "$1" --nodes 1 --ranks-per-node 2 \
    --blas-threads 1 --dry-run --profile "$work/profile.h5")
  awk '/^  exposed comm /{print $3; found = 1} END {exit !found}' <<<"$out" \
    || { echo "$out"; echo "FAIL: $1: no predicted step time" >&2; exit 1; }
}
lean=$(exposed zero-lean) && zero3=$(exposed zero3)
/usr/bin/python3 -c "import sys; sys.exit(not float('$lean') >= float('$zero3') > 0)" \
  || { echo "FAIL: predicted exposed comm: zero-lean $lean ms, zero3 $zero3 ms"; exit 1; }
# strata_add_plugin() installs into the runner's plugin directory of the same prefix: no flag needed.
cmake --install "$work/build" --prefix "$prefix" >/dev/null
test -f "$prefix/lib/strata/plugins/libstrata_zero_lean.so" || { echo "FAIL: plugin not installed beside strata's"; exit 1; }
"$prefix/bin/runner" --list-plugins | grep -E "^zero-lean +" >/dev/null || { echo "FAIL: installed zero-lean not listed"; exit 1; }
echo "out-of-tree zero-lean built against $prefix, ran on 2 ranks, the same losses as zero3, predicted (exposed comm $lean ms, zero3's $zero3 ms), installed beside its plugins"
