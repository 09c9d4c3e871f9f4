#!/usr/bin/env bash
# Every table of published figures (profiles/*.txt) makes a profile; the H200's is the H100's with
# HBM3e: the same GEMM-bound compute and links, its memory-bound work (embedding, AdamW, fresh
# buffers) faster by 4.8 / 3.35 TB/s exactly, so its gpt2-124m step is predicted shorter.
#   published_profiles.sh RUNNER SCRATCH_DIR PROFILES_DIR
set -eu
runner=$1
dir=$2
tables=$3
rm -rf "$dir" && mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
for table in "$tables"/*.txt; do
  name=$(basename "$table" .txt)
  "$runner" --calibrate --calibrate-from "$table" --profile "$dir/$name.h5" >/dev/null ||
    fail "$table: no profile"
  "$runner" --dry-run --device cuda --transport nccl --profile "$dir/$name.h5" --plugin ddp \
    --model gpt2-124m --precision bf16 --micro-batch 8 >"$dir/$name.txt" 2>&1 ||
    { cat "$dir/$name.txt"; fail "$name: dry run"; }
done
/usr/bin/python3 - "$dir" <<'PY'
import re, sys, h5py
d = sys.argv[1]
h100, h200 = (h5py.File("%s/%s-sxm-published.h5" % (d, n)) for n in ("h100", "h200"))
assert "NVIDIA H200 Tensor Core GPU datasheet" in h200.attrs["description"], h200.attrs["description"]
assert h200["node_peak_flops"][0] == h100["node_peak_flops"][0] == 8 * 989e12
a, b = h100["compute"], h200["compute"]
for key in ("block_forward_s", "block_backward_s", "head_forward_s", "copy_s_per_byte"):
    assert a[key][0] == b[key][0], (key, a[key][0], b[key][0])
for key in ("optimizer_s_per_param", "fresh_memory_s_per_byte", "embedding_forward_s"):
    assert abs(a[key][0] / b[key][0] - 4.8 / 3.35) < 1e-12, (key, a[key][0], b[key][0])
for key in ("alpha_s", "beta_bytes_per_s"):
    assert list(h100["comm_fits"][key]) == list(h200["comm_fits"][key]), key
step = {n: float(re.search(r"^  step +([0-9.]+) ms$", open("%s/%s-sxm-published.txt" % (d, n)).read(),
                           re.M)[1]) for n in ("h100", "h200")}
assert step["h200"] < step["h100"], step
print("profiles: h100 and h200 share compute and links; memory-bound x%.3f; gpt2-124m step %s"
      % (4.8 / 3.35, step))
PY
