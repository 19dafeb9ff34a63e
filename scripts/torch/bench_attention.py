"""PyTorch's side of scripts/bench_attention.lua: F.scaled_dot_product_attention
over the same (d, seq) grid, shapes, dtype, mask and pass protocol, one JSON
line per cell on stdout ({"torch": true, "d", "seq", "fwd_ms", "bwd_ms", ...}).

    python3 scripts/torch/bench_attention.py --d 64,128 --seq 4096,16384 --batch 1 --heads 16 \
        --dtype bf16 --causal --flush-l2 --backend default

Protocol (as the Lua side): `--warmup` + `--passes` forwards, each timed
alone (the device synchronised around it; CUDA events); then one forward
whose graph the backward passes use (retain_graph, a fixed random upstream
gradient, the inputs' .grad dropped before each). With --flush-l2 a 256 MiB
buffer is overwritten before every timed pass. --backend picks SDPA's kernel:
default (PyTorch's choice: cuDNN on an H100 for bf16), flash
(FlashAttention-2), cudnn, efficient (memory-efficient) or math.
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import DTYPES, runinfo  # noqa: E402


def int_list(s):
    return [int(x) for x in s.split(",") if x]


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d", type=int_list, default=[64, 128])
    p.add_argument("--seq", type=int_list, default=[4096, 16384])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int)
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--tq", type=int)
    p.add_argument("--dtype", default="bf16", choices=["f32", "bf16", "f16"])
    p.add_argument("--causal", action="store_true")
    p.add_argument("--align", default="top_left", choices=["top_left", "bottom_right"])
    p.add_argument("--fwd-only", action="store_true")
    p.add_argument("--passes", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--flush-l2", action="store_true")
    p.add_argument("--backend", default="default", choices=["default", "flash", "cudnn", "efficient", "math"])
    p.add_argument("--tf32", action="store_true")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


BACKENDS = {}
try:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
except ImportError:  # older PyTorch: only the default
    sdpa_kernel = None


def timed(fn, passes, warmup, setup, flush, dev):
    cuda = dev.type == "cuda"
    for _ in range(warmup):
        setup()
        fn()
    samples = []
    for _ in range(passes):
        setup()
        if flush is not None:
            flush.zero_()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(dev)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(dev)
            samples.append(start.elapsed_time(end))
        else:
            import time
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.fmean(samples), statistics.median(samples)


def cell(a, d, T, dev, flush):
    dt = DTYPES[a.dtype]
    tq = a.tq or T
    H, Hkv = a.heads or 1, a.kv_heads or a.heads or 1
    if a.heads:
        qs, ks = (a.batch, H, tq, d), (a.batch, Hkv, T, d)
    else:
        qs, ks = (a.batch, tq, d), (a.batch, T, d)
    g = torch.Generator(device=dev).manual_seed(a.seed)
    need = not a.fwd_only
    q = torch.randn(qs, device=dev, dtype=dt, generator=g).requires_grad_(need)
    k = torch.randn(ks, device=dev, dtype=dt, generator=g).requires_grad_(need)
    v = torch.randn(ks, device=dev, dtype=dt, generator=g).requires_grad_(need)
    gout = torch.randn(qs, device=dev, dtype=dt, generator=g)
    mask, causal = None, a.causal
    if a.causal and a.align == "bottom_right" and tq != T:
        mask = torch.ones(tq, T, dtype=torch.bool, device=dev).tril(T - tq)
        causal = False
    kw = {"enable_gqa": True} if Hkv != H else {}
    state = {}

    def attend():
        state["o"] = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, **kw)

    def drop_out():
        state.pop("o", None)

    def drop_grads():
        q.grad = k.grad = v.grad = None

    fwd, fwd_med = timed(attend, a.passes, a.warmup, drop_out, flush, dev)
    rec = {"fwd_ms": fwd, "fwd_median_ms": fwd_med, "bwd_ms": None, "bwd_median_ms": None}
    if need:
        drop_out()
        attend()
        o = state["o"]
        bwd, bwd_med = timed(lambda: o.backward(gout, retain_graph=True), a.passes, a.warmup, drop_grads,
                             flush, dev)
        rec.update(bwd_ms=bwd, bwd_median_ms=bwd_med)
    return rec


def main():
    a = parse()
    dev = torch.device(a.device)
    if a.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
    facts = runinfo(dev)
    flush = torch.empty(256 * 2 ** 20 // 4, dtype=torch.int32, device=dev) if a.flush_l2 else None
    for d in a.d:
        for T in a.seq:
            rec = {"torch": True, "tool": "pytorch", "backend": a.backend, "d": d, "seq": T, "batch": a.batch,
                   "heads": a.heads or 1, "kv_heads": a.kv_heads or a.heads or 1, "tq": a.tq or T,
                   "dtype": a.dtype, "causal": a.causal, **facts}
            try:
                if a.backend != "default":
                    if sdpa_kernel is None:
                        raise RuntimeError("this PyTorch has no torch.nn.attention.sdpa_kernel")
                    with sdpa_kernel([BACKENDS[a.backend]]):
                        rec.update(cell(a, d, T, dev, flush))
                else:
                    rec.update(cell(a, d, T, dev, flush))
                rec["status"] = "ok"
            except torch.cuda.OutOfMemoryError as e:
                rec.update(status="OOM", error=str(e).split("\n")[0])
            except Exception as e:  # an unsupported case is a result, not a crash
                rec.update(status="error", error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            print(json.dumps(rec), flush=True)
            if dev.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
