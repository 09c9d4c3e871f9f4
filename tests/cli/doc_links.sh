#!/usr/bin/env bash
# Every relative link of README.md and docs/*.md names a file or directory of the repository: a
# user who clones strata has everything the documents point to (no ../shared/...).
# usage: doc_links.sh SOURCE_DIR
set -u
src=$1
fail=0 n=0
for doc in "$src/README.md" "$src"/docs/*.md; do
  [[ -f $doc ]] || { echo "FAIL: $doc missing"; exit 1; }
  dir=$(dirname "$doc")
  # [text](target) with a target that is not a URL or an in-page anchor; the anchor part dropped.
  while IFS= read -r target; do
    target=${target%%#*}
    [[ -z $target ]] && continue
    n=$((n + 1))
    resolved=$(realpath -m "$dir/$target")
    if [[ ! -e $resolved ]]; then
      echo "FAIL: ${doc#$src/} links '$target', which does not exist"; fail=1
    elif [[ $resolved != "$(realpath "$src")"/* ]]; then
      echo "FAIL: ${doc#$src/} links '$target', outside the repository"; fail=1
    fi
  done < <(grep -oE '\]\([^)]+\)' "$doc" | sed -E 's/^\]\((.*)\)$/\1/' | grep -vE '^(https?|mailto):|^#')
done
((n > 0)) || { echo "FAIL: no relative link found (the link pattern is broken)"; exit 1; }
((fail == 0)) && echo "ok: $n relative links in README.md and docs/*.md resolve inside the repository"
exit $fail
