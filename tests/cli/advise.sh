#!/usr/bin/env bash
# runner --advise: bad input refused in one line (exit 2) before any work; the profile made from
# published figures; GPT-3 175B on 1,024 and 4,096 H100-class GPUs in seconds, naming a
# configuration that fits 80 GiB with a plausible MFU; exit 4 when nothing fits.
#   advise.sh RUNNER SCRATCH_DIR TABLE
set -eu
runner=$1
dir=$2
table=$3
rm -rf "$dir" && mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
profile=$dir/h100.h5

# Bad input: exit 2, one line on stderr naming the option.
refused() {  # EXPECTED-TEXT ARGS...
  local want=$1; shift
  local rc=0
  "$runner" "$@" >"$dir/out.txt" 2>"$dir/err.txt" || rc=$?
  [ "$rc" = 2 ] || { cat "$dir/out.txt" "$dir/err.txt"; fail "$*: exit $rc, not 2"; }
  [ "$(wc -l <"$dir/err.txt")" = 1 ] && grep -qF -- "$want" "$dir/err.txt" \
    || { cat "$dir/err.txt"; fail "$*: not one line with '$want'"; }
}
refused "--advise: needs --profile" --advise --model tiny --memory-limit 80GiB
refused "--advise: needs --memory-limit" --advise --model tiny --profile "$profile"
refused "--advise-micro-batches" --advise --profile "$profile" --memory-limit 80GiB --advise-micro-batches 2,0
refused "--mesh: --advise tries every" --advise --profile "$profile" --memory-limit 80GiB --mesh tp=2
refused "--advise-top: only with --advise" --advise-top 3
refused "--profile $dir/none.h5" --advise --profile "$dir/none.h5" --memory-limit 80GiB
grep -v "^gemm_efficiency" "$table" >"$dir/bad.txt"
refused "no 'gemm_efficiency' line" --calibrate --calibrate-from "$dir/bad.txt" --profile "$dir/bad.h5"
"$runner" --calibrate --calibrate-from "$table" --profile "$profile" >/dev/null || fail "profile from the table"
refused "--plugin nosuch: no such strategy" --advise --plugin nosuch --profile "$profile" --memory-limit 80GiB

# The profile says where its numbers come from.
/usr/bin/python3 - "$profile" <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1])
assert f.attrs["schema"] == "strata-profile/1" and f.attrs["source"] == "published", dict(f.attrs)
d = f.attrs["description"]
assert "source = published figures: NVIDIA H100" in d and "989 TFLOP/s" in d, d
assert f["node_peak_flops"][0] == 8 * 989e12, f["node_peak_flops"][0]
c = f["compute"]
assert list(c["preset"]) == [b"gpt3-175b"] and list(c["device"]) == [b"cuda"], list(c["preset"])
# A block's forward: 2048 tokens x (24 h^2 + 4 h T) FLOPs at 0.6 x 989 TFLOP/s.
h, T = 12288, 2048
want = T * (24 * h * h + 4 * h * T) / (0.6 * 989e12)
assert abs(c["block_forward_s"][0] / want - 1) < 1e-12, (c["block_forward_s"][0], want)
assert len(f["comm_fits/op"]) == 12  # 4 ops x 3 group shapes
PY

# GPT-3 175B on 1,024 GPUs (128 nodes x 8), 80 GiB each, Megatron-LM's global batch of 1536.
"$runner" --advise --profile "$profile" --model gpt3-175b --nodes 128 --ranks-per-node 8 \
  --memory-limit 80GiB --global-batch 1536 --advise-micro-batches 1,2 --advise-top 5 >"$dir/175b.txt" \
  || { cat "$dir/175b.txt"; fail "175b on 1024"; }
/usr/bin/python3 - "$dir/175b.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
row = re.search(r"^ +1  (\S+) .*?dp(\d+) tp(\d+) pp(\d+) mb(\d+) \S+ +([0-9.]+) m?s +(\d+) +([0-9.]+)% +([0-9.]+) GiB", text, re.M)
assert row, text
dp, tp, pp = int(row[2]), int(row[3]), int(row[4])
assert dp * tp * pp == 1024 and tp <= 8, row[0]
mfu, mem = float(row[8]), float(row[9])
assert mem <= 80, row[0]
# Megatron-LM (Narayanan et al. 2021): 175B on 1,024 A100s at 44% of peak; an H100-class
# profile with a 60% GEMM efficiency should land in the same range.
assert 25 <= mfu <= 60, row[0]
# How long advising takes is a benchmark figure (docs/predict.md), not a test: only that it is reported.
assert re.search(r"advised in [0-9.]+ s", text), text
assert "excluded, memory:" in text and "excluded, divisibility:" in text, text
PY
"$runner" --advise --profile "$profile" --model gpt3-175b --nodes 512 --ranks-per-node 8 \
  --memory-limit 80GiB --global-batch 1536 --advise-top 3 >"$dir/4096.txt" || { cat "$dir/4096.txt"; fail "175b on 4096"; }
grep -qE "^ +1  1f1b|^ +1  gpipe|^ +1  interleaved|^ +1  zb-h1|^ +1  zb-v" "$dir/4096.txt" || { cat "$dir/4096.txt"; fail "4096: no pipeline first"; }
# Expert parallelism is enumerated for a moe only, at each ep >= 2 that divides dp: fine-moe-16b
# (64 experts) on 2 nodes ranks ep 8 inside a node (the experts replicated over the nodes) and ep 16
# across them, whose all-to-alls cross the network and are the slower.
! grep -qE "^ +[0-9]+  ep " "$dir/175b.txt" || { cat "$dir/175b.txt"; fail "ep ranked for a dense model"; }
"$runner" --advise --profile "$profile" --model fine-moe-16b --capacity-factor 1.25 --nodes 2 \
  --ranks-per-node 8 --memory-limit 80GiB --global-batch 128 --advise-micro-batches 4 \
  --advise-top 1000 >"$dir/moe.txt" || { cat "$dir/moe.txt"; fail "fine-moe-16b on 16"; }
/usr/bin/python3 - "$dir/moe.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
rate = {int(m[1]): float(m[2]) for m in re.finditer(
    r"^ +\d+  ep dp16 tp1 pp1 ep(\d+) mb4 full +[0-9.]+ m?s +(\d+)", text, re.M)}
assert sorted(rate) == [8, 16], text
assert rate[8] > rate[16], rate
PY
# Mixtral 8x7B on 256 GPUs (issue 30's acceptance): the pipelines with their stages' experts over
# ep are ranked beside those without.
"$runner" --advise --profile "$profile" --model mixtral-8x7b --nodes 32 --ranks-per-node 8 \
  --memory-limit 80GiB --global-batch 1024 --advise-micro-batches 1 --advise-top 1000 \
  >"$dir/mixtral.txt" || { cat "$dir/mixtral.txt"; fail "mixtral-8x7b on 256"; }
grep -qE "^ +[0-9]+  (1f1b|gpipe|interleaved) dp[0-9]+ tp1 pp[0-9]+ ep8 mb1 " "$dir/mixtral.txt" \
  || { cat "$dir/mixtral.txt"; fail "mixtral-8x7b: no pipeline with ep 8 ranked"; }
# The ep plugin alone fits only with its optimizer state sharded (dp=zero1, zero2, fsdp: the
# experts' over ep_dp, the rest over dp); replicated (dp=allreduce) it holds 81 GiB of AdamW state.
grep -qE "^ +[0-9]+  ep dp=zero1 dp256 tp1 pp1 ep8 mb1 " "$dir/mixtral.txt" \
  || { cat "$dir/mixtral.txt"; fail "mixtral-8x7b: ep dp=zero1 not ranked"; }
if grep -qE "^ +[0-9]+  ep dp256 tp1 pp1 ep8 " "$dir/mixtral.txt"; then
  cat "$dir/mixtral.txt"; fail "mixtral-8x7b: ep with dp=allreduce ranked as fitting 80 GiB"
fi
# Llama 3 70B on 1,024 GPUs (issue 30's acceptance): context parallelism in the enumeration, a
# configuration with cp ranked where its cp = 1 twin does not fit.
"$runner" --advise --profile "$profile" --model llama3-70b --nodes 128 --ranks-per-node 8 \
  --memory-limit 80GiB --global-batch 512 --advise-micro-batches 1 --advise-top 1000 \
  >"$dir/llama70b.txt" || { cat "$dir/llama70b.txt"; fail "llama3-70b on 1024"; }
grep -qE "^ +[0-9]+  [a-z0-9-]+( dp=[a-z0-9]+)? dp[0-9]+ tp[0-9]+ pp[0-9]+ cp[248] mb1 " \
  "$dir/llama70b.txt" || { cat "$dir/llama70b.txt"; fail "llama3-70b: no configuration with cp"; }
grep -q "^strategies: cp: dp x tp (tp >= 2), x cp;" "$dir/llama70b.txt" \
  || { cat "$dir/llama70b.txt"; fail "llama3-70b: the cp plugin's axes"; }
# Ring attention is enumerated beside Ulysses, at cp > 1 only (at cp 1 it is its twin).
grep -qE "^ +[0-9]+  cp( dp=[a-z0-9]+)? attention=ring dp[0-9]+ tp[0-9]+ pp1 cp[248] mb1 " \
  "$dir/llama70b.txt" || { cat "$dir/llama70b.txt"; fail "llama3-70b: no ring attention ranked"; }
if grep -qE "attention=ring dp[0-9]+ tp[0-9]+ pp[0-9]+ mb" "$dir/llama70b.txt"; then
  cat "$dir/llama70b.txt"; fail "llama3-70b: ring attention enumerated at cp 1"
fi
# Nothing fits: said, exit 4.
rc=0
"$runner" --advise --profile "$profile" --model gpt3-175b --nodes 1 --ranks-per-node 8 \
  --memory-limit 80GiB --advise-micro-batches 1 >"$dir/none.txt" || rc=$?
[ "$rc" = 4 ] && grep -q "^no configuration fits" "$dir/none.txt" || { cat "$dir/none.txt"; fail "8 GPUs: exit $rc"; }
echo "advise: ok"
