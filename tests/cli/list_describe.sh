#!/usr/bin/env bash
# --list-plugins and --describe come from the plugins' descriptors.
set -eu
runner=$1
list=$("$runner" --list-plugins)
for s in dp ddp allreduce zero1 zero2 zero3 fsdp fsdp-grad-op fsdp-hybrid tp gpipe 1f1b interleaved; do grep -qE "^$s +" <<<"$list" || { echo "FAIL: $s not listed"; echo "$list"; exit 1; }; done
# The model-parallel strategies list what their data-parallel axis can be.
for s in tp gpipe 1f1b interleaved; do grep -qE "^$s +pp|^$s +tp" <<<"$list" && grep -qE "^$s +[a-z]+ +dp=allreduce\|zero1\|zero2\|fsdp " <<<"$list" || { echo "FAIL: $s composition"; echo "$list"; exit 1; }; done
desc=$("$runner" --describe ddp)
grep -q "bucket_mb <real>  default 25" <<<"$desc" || { echo "FAIL: describe ddp"; echo "$desc"; exit 1; }
grep -q "plugin  .*/libstrata_ddp.so (ABI 19)" <<<"$desc" || { echo "FAIL: describe path"; exit 1; }
echo "$list"; echo "$desc"
# A plugin directory's files the loader does not open: one note each for what looks like a library
# not named lib*.so (a copy of the ddp plugin as strata_ddp.so and as libstrata_ddp.so.1), none for
# other files, and the strategies found elsewhere still listed.
ddp_so=$(sed -n 's/^ *plugin  \(.*\.so\) (ABI.*/\1/p' <<<"$desc")
odd=$(mktemp -d)
trap 'rm -rf "$odd"' EXIT
cp "$ddp_so" "$odd/strata_ddp.so"
cp "$ddp_so" "$odd/libstrata_ddp.so.1"
echo "not a plugin" > "$odd/README"
list=$("$runner" --plugin-path "$odd" --list-plugins 2>"$odd/notes") || { echo "FAIL: --list-plugins with $odd"; exit 1; }
grep -qE "^ddp +" <<<"$list" || { echo "FAIL: ddp not listed beside $odd"; exit 1; }
for f in strata_ddp.so libstrata_ddp.so.1; do
  [[ $(grep -c "^note: skipped plugin $odd/$f: not named lib<name>.so, so not loaded" "$odd/notes") -eq 1 ]] \
    || { echo "FAIL: no single note for $odd/$f"; cat "$odd/notes"; exit 1; }
done
[[ $(wc -l < "$odd/notes") -eq 2 ]] || { echo "FAIL: expected 2 notes (README passed over)"; cat "$odd/notes"; exit 1; }
echo "misnamed plugins: one note each"; cat "$odd/notes"
# --dry-run answers for any strategy and preset without starting a rank; exit 4 when it won't fit.
for s in dp ddp zero1 zero2 zero3 fsdp fsdp-grad-op fsdp-hybrid; do
  out=$("$runner" --dry-run --plugin "$s" --nodes 2 --ranks-per-node 4 --model gpt2-124m)
  grep -q "^  total  " <<<"$out" || { echo "FAIL: dry run $s"; echo "$out"; exit 1; }
done
for args in "--plugin 1f1b --mesh dp=2,pp=4 --model gpt2-124m --global-batch 64" \
            "--plugin interleaved --mesh dp=2,tp=2,pp=2 --model small --global-batch 32 --micro-batch 4" \
            "--plugin tp --mesh dp=2,tp=4 --model small --plugin-opt sp=on"; do
  # shellcheck disable=SC2086
  out=$("$runner" --dry-run --nodes 2 --ranks-per-node 4 $args)
  grep -q "^  total  " <<<"$out" || { echo "FAIL: dry run $args"; echo "$out"; exit 1; }
done
set +e
"$runner" --dry-run --plugin zero3 --nodes 4 --model gpt2-124m --memory-limit 1GiB >/dev/null; code=$?
"$runner" --dry-run --plugin zero3 --nodes 4 --model tiny --memory-limit 1GiB >/dev/null; code2=$?
set -e
[[ $code -eq 4 && $code2 -eq 0 ]] || { echo "FAIL: --memory-limit exit codes $code $code2"; exit 1; }
echo "dry run: all strategies answer; memory limit exit codes 4 (does not fit) and 0 (fits)"
