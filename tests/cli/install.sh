#!/usr/bin/env bash
# After `cmake --install`, the installed runner finds the installed plugins with no flags and runs.
# usage: install.sh BUILD_DIR PREFIX
set -eu
build=$1 prefix=$2
rm -rf "$prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
list=$("$prefix/bin/runner" --list-plugins)
for s in dp ddp allreduce; do
  grep -qE "^$s +" <<<"$list" || { echo "FAIL: installed runner does not list $s"; echo "$list"; exit 1; }
done
"$prefix/bin/runner" --describe ddp | grep -q "plugin  $prefix/lib/strata/plugins/libstrata_ddp.so" \
  || { echo "FAIL: installed runner loads plugins from outside $prefix"; exit 1; }
test -f "$prefix/include/strata/plugin.hpp" || { echo "FAIL: SDK headers not installed"; exit 1; }
"$prefix/bin/runner" --plugin ddp --steps 3 --quiet --out "$prefix/results" --run-id installed >/dev/null
test -f "$prefix/results/installed.h5" || { echo "FAIL: installed runner wrote no run file"; exit 1; }
echo "installed runner at $prefix/bin/runner lists and runs the installed plugins"
