#!/usr/bin/env python3
"""PyTorch parity of Ember's TransformerLM: logits, loss and every parameter
gradient of a case written by tests/reference/write_case.lua.

  python3 tests/reference/parity.py CASE_DIR [CASE_DIR ...]

Each CASE_DIR holds weights.safetensors (loaded into bench/torch_lm.py's
model by name: API.md's names, no renaming) and case.safetensors (the batch
and Ember's outputs). The reference is PyTorch in float64 on the CPU, so
neither side's f32 rounding is taken as truth. Errors are norm-wise relative,
‖ember − ref‖ / ‖ref‖, per tensor.

Tolerances and why:
  f32 cases: 1e-5. f32 rounding (6e-8) grown by sums of up to a few hundred
    terms through 2 layers lands near 1e-7..1e-6; a wrong formula (RoPE pair
    order, mask, eps, scale) lands far above 1e-3.
  bf16 autocast cases: Ember must be as accurate as PyTorch's own autocast of
    the same model and batch: err_ember <= 2 * err_torch + 1e-3 (and never
    above 5e-2). PyTorch runs that on CUDA when it can, else CPU autocast.

Prints one line per check and a final "N passed, N failed"; exits 1 on any
failure.
"""
import json
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
from torch_lm import TransformerLM  # noqa: E402

F32_TOL = 1e-5
BF16_FACTOR, BF16_SLACK, BF16_CAP = 2.0, 1e-3, 5e-2

_NP = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
       "U8": np.uint8, "BOOL": np.bool_}


def load_safetensors(path):
    """{name: torch tensor}, metadata. A plain reader (8-byte header size, JSON, raw LE bytes)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    base, out = 8 + n, {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        buf = raw[base + b:base + e]
        shape = info["shape"]
        if info["dtype"] == "BF16":
            u = np.frombuffer(buf, dtype=np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(buf, dtype=_NP[info["dtype"]])
        out[name] = torch.from_numpy(arr.copy().reshape(shape))
    return out, meta


def rel(a, b):
    a, b = a.double(), b.double()
    den = b.norm().item()
    return (a - b).norm().item() / (den if den > 0 else 1.0)


def run_torch(weights, meta, ids, targets, dtype, device, autocast):
    cfg = {k[4:]: v for k, v in meta.items() if k.startswith("cfg.")}
    model = TransformerLM(int(cfg["vocab_size"]), int(cfg["context_length"]), int(cfg["d_model"]),
                          int(cfg["d_ff"]), int(cfg["num_layers"]), int(cfg["num_heads"]),
                          rope_theta=float(cfg["rope_theta"]), attn="naive")
    missing = model.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys
    model = model.to(device=device, dtype=dtype)
    ids, targets = ids.to(device), targets.to(device)
    with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=autocast):
        logits = model(ids)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).to(torch.promote_types(
            logits.dtype, torch.float32)), targets.reshape(-1))
    loss.backward()
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters()}
    return logits.detach().cpu(), loss.detach().cpu(), grads


def check_case(case_dir):
    weights, _ = load_safetensors(os.path.join(case_dir, "weights.safetensors"))
    case, meta = load_safetensors(os.path.join(case_dir, "case.safetensors"))
    label = f"{meta.get('device', '?')}/{meta.get('precision', '?')}/{meta.get('attn', '?')}"
    ids, targets = case["input_ids"].long(), case["targets"].long()
    ref = run_torch(weights, meta, ids, targets, torch.float64, "cpu", False)
    bf16 = meta.get("precision") == "bf16"
    if bf16:
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        other = run_torch(weights, meta, ids, targets, torch.float32, dev, True)
        other_name = f"torch bf16 autocast ({dev})"
    else:
        other = run_torch(weights, meta, ids, targets, torch.float32, "cpu", False)
        other_name = "torch f32 (cpu)"
    checks = [("logits", case["logits"], ref[0], other[0]), ("loss", case["loss"], ref[1], other[1])]
    for name in ref[2]:
        key = "grad." + name
        if key not in case:
            checks.append((key, None, None, None))
            continue
        checks.append((key, case[key], ref[2][name], other[2][name]))
    passed = failed = 0
    for name, ember, r, o in checks:
        if ember is None:
            print(f"FAIL {label} {name}: missing from the case file")
            failed += 1
            continue
        if tuple(ember.shape) != tuple(r.shape):
            print(f"FAIL {label} {name}: shape {tuple(ember.shape)}, expected {tuple(r.shape)}")
            failed += 1
            continue
        e, t = rel(ember, r), rel(o, r)
        tol = min(BF16_FACTOR * t + BF16_SLACK, BF16_CAP) if bf16 else F32_TOL
        ok = e <= tol and e == e
        print(f"{'PASS' if ok else 'FAIL'} {label} {name}: err {e:.2e} vs f64 (tol {tol:.1e}); "
              f"{other_name} err {t:.2e}")
        passed, failed = passed + ok, failed + (not ok)
    return passed, failed


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    torch.manual_seed(0)
    passed = failed = 0
    for d in argv:
        p, f = check_case(d)
        passed, failed = passed + p, failed + f
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
