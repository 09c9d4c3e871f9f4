#!/usr/bin/env bash
# --list-plugins and --describe come from the plugins' descriptors.
set -eu
runner=$1
list=$("$runner" --list-plugins)
for s in dp ddp allreduce; do grep -qE "^$s +" <<<"$list" || { echo "FAIL: $s not listed"; echo "$list"; exit 1; }; done
desc=$("$runner" --describe ddp)
grep -q "bucket_mb <real>  default 25" <<<"$desc" || { echo "FAIL: describe ddp"; echo "$desc"; exit 1; }
grep -q "plugin  .*/libstrata_ddp.so (ABI 1)" <<<"$desc" || { echo "FAIL: describe path"; exit 1; }
echo "$list"; echo "$desc"
