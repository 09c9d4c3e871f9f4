#!/usr/bin/env bash
# runner --calibrate on --device cuda, on the CUDA emulator and the NCCL stand-in (runner_emu): the
# unit passes timed with the device synchronised, the comm points on device buffers over nccl, a
# profile entry of device cuda that --dry-run --profile and a run's stored prediction then use.
# A small custom shape keeps the emulator's passes short. Timings here are the emulator's.
#   calibrate_cuda.sh RUNNER_EMU SCRATCH_DIR
set -eu
runner=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
shape=(--model tiny --layers 1 --hidden 32 --heads 2 --seq 16 --vocab 64 --micro-batch 2
       --device cuda --transport nccl --peak-tflops 0.01 --ranks-per-node 2)
"$runner" --calibrate --profile "$dir/gpu.h5" "${shape[@]}" > "$dir/calibrate.txt" 2>&1 \
  || { cat "$dir/calibrate.txt"; fail "calibrate on cuda"; }
grep -q "^calibrate: custom, micro-batch 2, tp 1, cuda fp32" "$dir/calibrate.txt" \
  || { cat "$dir/calibrate.txt"; fail "no cuda entry"; }
/usr/bin/python3 - "$dir/gpu.h5" <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1])
c = f["compute"]
assert list(c["device"]) == [b"cuda"], list(c["device"])
assert 0 < c["block_forward_s"][0] and 0 < c["copy_s_per_byte"][0], "passes and copies timed"
assert 0 < c["block_input_backward_s"][0] and 0 < c["block_weight_backward_s"][0], "split passes"
ops = sorted(o.decode() for o in f["comm_fits/op"])
assert ops == ["all_gather", "all_reduce", "all_to_all", "reduce_scatter"], ops
# The GEMM sweep through the CUDA kernels: hidden 8..48 rounded to 16, 32, 48, five linears each,
# less hidden 16's FC (64 x 16) that is also its head (vocab 64): 14 shapes, forward and backward.
g = f["gemm"]
assert set(g["device"]) == {b"cuda"} and (g["time_s"][:] > 0).all(), list(g["device"])
assert len(g["m"]) == 2 * 14 and set(g["m"]) == {32}, (len(g["m"]), set(g["m"]))
PY
out=$("$runner" --dry-run --profile "$dir/gpu.h5" --plugin zero3 --global-batch 4 "${shape[@]}")
grep -q "^  step " <<<"$out" || { echo "$out"; fail "no predicted step on cuda"; }
"$runner" --plugin zero3 --global-batch 4 --steps 4 --warmup 1 --profile "$dir/gpu.h5" --out "$dir" \
  --run-id z3 --quiet "${shape[@]}" > "$dir/run.txt" 2>&1 || { cat "$dir/run.txt"; fail "zero3 run"; }
/usr/bin/python3 - "$dir/z3.h5" <<'PY'
import sys, h5py
s = h5py.File(sys.argv[1])["summary"]
p = s["step_s_predicted"][()] if "step_s_predicted" in s else s.attrs.get("step_s_predicted")
assert p is not None and float(p) > 0, "no stored prediction"
print("cuda profile: predicted %.1f ms a step of the emulated zero3" % (float(p) * 1e3))
PY
