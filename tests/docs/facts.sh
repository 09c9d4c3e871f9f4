#!/usr/bin/env bash
# The facts the docs state are the code's: the plugin ABI version docs/architecture.md names,
# every transport of this build in docs/architecture.md and docs/running.md, every strategy
# `runner --list-plugins` finds in README.md's strategy table, every exit code of
# core/src/run/exit_codes.hpp in docs/running.md's table, every model preset in
# slurm/scale.sbatch's check and docs/running.md; and every relative link of README.md,
# CHANGELOG.md and docs/*.md resolves.
# usage: facts.sh SOURCE_DIR RUNNER
set -u
src=$1 runner=$2
fails=0 checks=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
check() { checks=$((checks + 1)); }

abi=$(sed -n 's/.*kPluginAbiVersion = \([0-9]*\);.*/\1/p' "$src/core/include/strata/plugin.hpp")
check
[[ -n $abi ]] && grep -q "($abi today" "$src/docs/architecture.md" \
  || fail "docs/architecture.md does not name plugin ABI $abi (core/include/strata/plugin.hpp)"

while IFS=$'\t' read -r transport _; do
  for doc in docs/architecture.md docs/running.md; do
    check
    grep -q "\`$transport\`" "$src/$doc" || fail "$doc does not name the transport \`$transport\`"
  done
done < <("$runner" --list-transports)

# Every model preset (runner --help's --model line) is one slurm/scale.sbatch's STRATA_MODEL check
# accepts (its pattern and its message) and docs/running.md names.
presets=$("$runner" --help 2>&1 | tr -s ' \n' ' ' | sed -n 's/.*--model arg[^[]*\[one of \([^]]*\)\].*/\1/p')
pattern=$(sed -n 's/.*\[\[ \$m =~ \(.*\) \]\] ||.*/\1/p' "$src/slurm/scale.sbatch")
allowed=$(sed -n 's/.*STRATA_MODEL: unknown preset.*(allowed: \([^)]*\)).*/\1/p' "$src/slurm/scale.sbatch")
check
[[ -n $presets && -n $pattern && -n $allowed ]] \
  || fail "runner --help's presets or slurm/scale.sbatch's STRATA_MODEL check not found"
for preset in ${presets//,/ }; do
  check
  [[ $preset =~ $pattern && ", $allowed, " == *", $preset, "* ]] \
    || fail "slurm/scale.sbatch's STRATA_MODEL check does not accept the preset $preset"
  check
  grep -q "\`$preset\`" "$src/docs/running.md" || fail "docs/running.md does not name the preset \`$preset\`"
done

while read -r strategy; do
  check
  grep -qE "^\| .*\`$strategy\`" "$src/README.md" \
    || fail "README.md's strategy table lacks \`$strategy\` (runner --list-plugins)"
done < <("$runner" --list-plugins 2>/dev/null | awk 'NR > 1 { print $1 }')

while read -r code; do
  check
  grep -qE "^\| $code \|" "$src/docs/running.md" \
    || fail "docs/running.md's exit-code table lacks $code (core/src/run/exit_codes.hpp)"
done < <(sed -n 's/^inline constexpr int [a-z_]* = \([0-9]*\);.*/\1/p' "$src/core/src/run/exit_codes.hpp")
check
grep -qE '^\| 128 \+ N \|' "$src/docs/running.md" || fail "docs/running.md lacks the 128 + N row"

for doc in "$src"/README.md "$src"/CHANGELOG.md "$src"/docs/*.md; do
  while read -r link; do
    case $link in http://* | https://* | mailto:*) continue ;; esac
    check
    [[ -e $(dirname "$doc")/$link ]] || fail "${doc#"$src"/}: the link $link does not resolve"
  done < <(grep -oE '\]\([^)#[:space:]]+' "$doc" | sed 's/^](//')
done

echo "$checks checks, $fails failed"
((fails == 0))
