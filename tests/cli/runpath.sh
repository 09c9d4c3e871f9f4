#!/usr/bin/env bash
# No binary strata builds or installs searches the current directory for libraries: every RUNPATH
# entry is absolute or $ORIGIN-relative (an empty entry, '.' or a relative one means "where the user
# happens to be", so a library dropped there would be loaded and its constructors run). Checked on
# the ELF headers of the build and install trees, and by watching the dynamic loader start the
# runner from a directory of our own.
# usage: runpath.sh BUILD_DIR PREFIX
set -u
build=$(cd "$1" && pwd) prefix=$2
fails=0 checked=0
rm -rf "$prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null || { echo "FAIL: cmake --install"; exit 1; }
while IFS= read -r f; do
  head -c 4 "$f" 2>/dev/null | grep -q $'\x7fELF' || continue
  checked=$((checked + 1))
  paths=$(readelf -d "$f" 2>/dev/null | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]$/\2/p')
  [[ -z $paths ]] && continue
  IFS=: read -r -a entries <<<"$paths:"
  # "a:b:" splits into a, b; a trailing or doubled ':' shows up as an empty entry in the middle.
  n=$(awk -F: '{print NF}' <<<"$paths")
  for ((i = 0; i < n; i++)); do
    e=$(cut -d: -f$((i + 1)) <<<"$paths")
    if [[ -z $e || ( $e != /* && $e != '$ORIGIN'* ) ]]; then
      echo "FAIL: $f: RUNPATH entry '${e}' is not absolute or \$ORIGIN-relative ($paths)"
      fails=$((fails + 1))
    fi
  done
done < <(find "$build/bin" "$build/lib" "$build/tests/plugins" "$prefix/bin" "$prefix/lib" -type f)

# The loader's own account: every library lookup of the runner, started from a scratch directory,
# tries only absolute paths.
scratch=$(mktemp -d)
(cd "$scratch" && LD_DEBUG=libs "$build/bin/runner" --help >/dev/null 2>"$scratch/ld.log")
tries=$(grep -c 'trying file=' "$scratch/ld.log")
relative=$(grep -E "trying file=([^/]|$)|search path=(.*::|:$|.*:\s)" "$scratch/ld.log" | head -3 | cut -c1-300)
if [[ $tries -eq 0 ]]; then echo "FAIL: LD_DEBUG showed no library lookups"; fails=$((fails + 1)); fi
if [[ -n $relative ]]; then echo "FAIL: the loader looks in the current directory: $relative"; fails=$((fails + 1)); fi
rm -rf "$scratch"
echo "checked $checked ELF files and $tries library lookups"
echo "$((fails == 0 ? 1 : 0)) passed, $fails failed"
[[ $fails -eq 0 && $checked -gt 5 ]]
