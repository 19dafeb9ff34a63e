"""PyTorch's side of scripts/bench_ops.lua --torch: the registry's perf
entries as PyTorch expressions, timed the same way (cold L2 before each rep,
the device synchronised, the median of `reps`).

    python3 scripts/torch/bench_ops.py --spec spec.json

The spec (written by bench_ops.lua): {"device", "reps", "warmup", "flush", "timer",
"cases": [{"key", "expr", "inputs": [{"shape", "dtype", "low", "high"} | {"value"}],
"backward"}]}. Float inputs are randn (uniform in [low, high] when given: a
non-negative input on Ember's side), integer inputs randint(0, high), bool
inputs rand < 0.5; the expression sees them as a, b, c, d with torch and
F = torch.nn.functional in scope. Prints one JSON line per case:
{"key", "fwd_ms", "fwd_bwd_ms"} or {"key", "error"}.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64,
          "i64": torch.int64, "i32": torch.int32, "bool": torch.bool, "u8": torch.uint8}
FLOATS = {"f32", "bf16", "f16", "f64"}


def make_input(d, dev, grad):
    if "value" in d:
        return d["value"]
    shape, dt = d["shape"], d["dtype"]
    if dt in FLOATS:
        if d.get("low") is not None:   # a non-negative input on Ember's side: the same range
            x = torch.rand(shape, device=dev) * (d["high"] - d["low"]) + d["low"]
        else:
            x = torch.randn(shape, device=dev)
        return x.to(DTYPES[dt]).requires_grad_(grad)
    if dt == "bool":
        return torch.rand(shape, device=dev) < 0.5
    return torch.randint(0, max(1, int(d.get("high") or 1)), shape, device=dev, dtype=DTYPES[dt])


def timer(dev, flush, reps, warmup, events=False, flush_mode="write"):
    """events: CUDA events around fn and no sync after the flush (Triton's
    do_bench; bench_ops.lua --timer events), else the host clock between syncs.
    flush_mode "read" evicts the cache by summing the buffer (clean lines left),
    "write" by zeroing it (do_bench's way: dirty lines the op writes back)."""
    cuda = dev.type == "cuda"
    cache = torch.zeros(256 * 2 ** 20 // 4, dtype=torch.int32, device=dev) if flush else None

    def do_flush():
        if flush_mode == "read":
            cache.sum()
        else:
            cache.zero_()
    if events and not cuda:
        raise ValueError("timer events needs a CUDA device")

    def run(fn, setup=None):
        for _ in range(warmup):
            if setup:
                setup()
            fn()
        samples = []
        if events:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(reps):
                if setup:
                    setup()
                if cache is not None:
                    do_flush()
                e0.record()
                fn()
                e1.record()
                e1.synchronize()
                samples.append(e0.elapsed_time(e1) / 1e3)
            return statistics.median(samples) * 1e3
        for _ in range(reps):
            if setup:
                setup()
            if cache is not None:
                do_flush()
            if cuda:
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize(dev)
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples) * 1e3
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True)
    a = ap.parse_args()
    spec = json.load(open(a.spec))
    dev = torch.device("cuda" if spec["device"].startswith("cuda") else "cpu")
    run = timer(dev, spec.get("flush", True), int(spec["reps"]), int(spec["warmup"]), spec.get("timer") == "events",
                spec.get("flush_mode", "write"))
    for c in spec["cases"]:
        rec = {"key": c["key"]}
        try:
            grad = bool(c.get("backward"))
            xs = [make_input(d, dev, grad) for d in c["inputs"]]
            env = {"torch": torch, "F": F}
            env.update(zip("abcd", xs))
            code = compile(c["expr"], "<bench_ops>", "eval")
            with torch.no_grad():
                rec["fwd_ms"] = run(lambda: eval(code, env))
            if grad:
                out = eval(code, env)
                ones = torch.ones_like(out)
                leaves = [x for x in xs if torch.is_tensor(x) and x.requires_grad]

                def drop():
                    for x in leaves:
                        x.grad = None
                rec["fwd_bwd_ms"] = run(lambda: eval(code, env).backward(ones), drop)
        except Exception as e:  # a case PyTorch cannot run is a result, not a crash
            rec["error"] = f"{type(e).__name__}: {e}"[:300]
        print(json.dumps(rec), flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
