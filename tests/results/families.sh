#!/usr/bin/env bash
# The model family and precision in the archive tools' configurations: compare keeps a llama run
# and a bf16 run apart from the GPT-2 fp32 run they were copied from (arch and precision are part
# of a configuration), and reads a file from before the families (no /config arch, kv_heads, ffn,
# experts, top_k, shared_experts, capacity_factor, aux_loss_coef, precision) as the GPT-2 fp32 run
# it was: the same configuration as today's file of it.
# usage: families.sh RESULTS_DIR E2E_DIR WORK_DIR
set -eu
tools=$1 e2e=$2 work=$3
py=/usr/bin/python3
rm -rf "$work" && mkdir -p "$work/old" "$work/new"
cp "$e2e/ddp.np2.h5" "$work/old/ddp.old.h5"
cp "$e2e/ddp.np2.h5" "$work/new/ddp.h5"
cp "$e2e/ddp.np2.h5" "$work/new/ddp.llama.h5"
cp "$e2e/ddp.np2.h5" "$work/new/ddp.bf16.h5"
"$py" - "$work/old/ddp.old.h5" "$work/new/ddp.llama.h5" "$work/new/ddp.bf16.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    c = f["config"].attrs
    assert c["arch"] in ("gpt2", b"gpt2") and c["precision"] in ("fp32", b"fp32"), dict(c)
    assert int(c["ffn"]) == 4 * int(c["hidden"]) and int(c["kv_heads"]) == int(c["heads"]), dict(c)
    for k in ("arch", "kv_heads", "ffn", "experts", "top_k", "shared_experts", "capacity_factor",
              "aux_loss_coef", "precision"):
        del c[k]
for path, key, value in ((sys.argv[2], "arch", "llama"), (sys.argv[3], "precision", "bf16")):
    with h5py.File(path, "r+") as f:
        c = f["config"].attrs
        c.create(key, value, dtype=c.get_id(key).dtype)  # the runner's own string type
        f.attrs.modify("run_id", f.attrs["run_id"] + "." + value)
PY

fail() { echo "FAIL: $*"; exit 1; }
"$tools/compare" "$work/old" "$work/new" > "$work/compare.txt" || fail "compare exit $?"
cat "$work/compare.txt"
grep -q "^3 configuration(s)" "$work/compare.txt" || fail "not 3 configurations"
# The old file and today's: one configuration, both sides.
grep -qE "^ddp dp2\.tp1\.pp1 .* mb[0-9]+/gb[0-9]+ mpi cpu +[0-9.e+]+ \(n=1\) .* \(n=1\) .*no difference$" \
  "$work/compare.txt" || fail "the old file and today's are not one configuration"
# The llama and the bf16 copies: each its own configuration, only in B, named by family and
# precision.
[ "$(grep -cE "only in B$" "$work/compare.txt")" = 2 ] || fail "llama and bf16 not apart"
grep -qE "^ddp .* tiny llama mb[0-9]+/gb[0-9]+ mpi cpu .*only in B$" "$work/compare.txt" \
  || fail "llama not named in its configuration"
grep -qE "^ddp .* mb[0-9]+/gb[0-9]+ bf16 mpi cpu .*only in B$" "$work/compare.txt" \
  || fail "bf16 not named in its configuration"
"$tools/compare" --ignore arch --ignore precision "$work/old" "$work/new" > "$work/ignored.txt" \
  || fail "compare --ignore exit $?"
grep -q "^1 configuration(s)" "$work/ignored.txt" || { cat "$work/ignored.txt"; fail "--ignore arch, precision"; }
echo "families: arch and precision keep configurations apart; an old file reads as GPT-2 fp32"
