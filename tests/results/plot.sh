#!/usr/bin/env bash
# results/plot on a generated study: data-parallel runs at 1, 2 and 4 ranks (the 4-rank one with
# --calibrate-comm), tp, two pipelines (one with --trace), a failed run and a truncated file. Every figure exists as PNG and PDF, the
# report embeds them and lists the skipped files; a directory with nothing usable exits 1.
# usage: plot.sh RESULTS_DIR E2E_DIR WORK_DIR
set -eu
tools=$1 e2e=$2 work=$3
rm -rf "$work" && mkdir -p "$work/study" "$work/empty"
for id in reference ddp.np2 ddp.calibrate.np4 tp.np2 gpipe.pp4 1f1b.pp4 fail.throw; do
  cp "$e2e/$id.h5" "$work/study/"
done
head -c 4096 "$e2e/ddp.np4.h5" > "$work/study/truncated.h5"
cp "$work/study/truncated.h5" "$work/empty/"

fail() { echo "FAIL: $*"; exit 1; }
"$tools/plot" "$work/study" || fail "exit $?"
figs="$work/study/figures"
for name in throughput efficiency memory comm loss bubble transport timeline-gpipe.pp4; do
  for ext in png pdf; do
    [[ -s $figs/$name.$ext ]] || fail "missing $name.$ext"
  done
  grep -q "alt=\"$name\" src=\"data:image/png;base64," "$figs/report.html" || fail "$name not in report"
done
[[ $(file -b "$figs/throughput.png") == PNG* ]] || fail "throughput.png is not a PNG"
[[ $(head -c 5 "$figs/memory.pdf") == %PDF- ]] || fail "memory.pdf is not a PDF"
for id in reference ddp.np2 tp.np2 gpipe.pp4; do grep -q ">$id<" "$figs/report.html" || fail "no row $id"; done
grep -q "fail.throw.h5: status failed" "$figs/report.html" || fail "failed run not listed"
grep -q "truncated.h5: unreadable or partial" "$figs/report.html" || fail "truncated file not listed"
if "$tools/plot" "$work/empty" 2>/dev/null; then fail "exit 0 for a study without usable runs"; fi
echo "plot: 6 figures as PNG and PDF, report.html with them and the skipped files"
