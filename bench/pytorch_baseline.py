#!/usr/bin/env python3
"""scripts/bench_model.lua in PyTorch: the same reference TransformerLM
(bench/torch_lm.py), the same random batch shape, flags, output lines and
JSON fields, so the two print side by side in one GPU session.

  python3 bench/pytorch_baseline.py --model small --mode train --precision bf16
  python3 bench/pytorch_baseline.py --model small --mode train --precision bf16 --compile
  python3 bench/pytorch_baseline.py --model xl --mode train --precision bf16 --attn naive --json runs.jsonl

Modes: fwd (forward + loss under no_grad), fwd_bwd (zero_grad, forward, loss,
backward), train (fwd_bwd + AdamW step, fused=True unless --optimizer says
otherwise). --precision bf16 wraps forward and loss in
torch.autocast("cuda", torch.bfloat16). --compile wraps model + loss in
torch.compile (default mode). --graph captures one whole step as a CUDA graph
(AdamW capturable=True) after the warm-up and times replays. Out of memory is
a result ("OOM"), not a crash.

MFU uses the formula bench_model.lua states: FLOPs/token = 6·N + 12·L·d·T
(train, fwd_bwd) or 2·N + 4·L·d·T (fwd), N = all parameters but the token
embeddings; peak 989.4 (bf16), 494.7 (TF32) or 66.9 (fp32) TFLOP/s on
H100/H200 SXM.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import timeit

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "scripts", "torch"))
from common import add_model_args, sh  # noqa: E402  (the options and the shell helper the study twins use)
from torch_lm import CONFIGS, TransformerLM, WithLoss, count_parameters  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Time forward / backward / training steps of the "
                                "reference TransformerLM in PyTorch.")
    add_model_args(p, CONFIGS)
    p.add_argument("--mode", default="train", choices=["fwd", "fwd_bwd", "train"])
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--tf32", action="store_true", help="allow TF32 for f32 matmuls")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "naive"])
    p.add_argument("--compile", action="store_true", help="torch.compile(model + loss), default mode")
    p.add_argument("--graph", action="store_true", help="capture one step as a CUDA graph")
    p.add_argument("--optimizer", default="fused", choices=["fused", "foreach", "forloop"],
                   help="AdamW implementation (forloop = unfused, one kernel chain per tensor)")
    p.add_argument("--device", default=None)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peak-tflops", type=float)
    p.add_argument("--breakdown", action="store_true",
                   help="after the timed steps, one more eager step measured by phase")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--threads", type=int,
                   help="CPU threads (torch.set_num_threads; default: PyTorch's, the cores in the affinity mask)")
    p.add_argument("--json")
    a = p.parse_args(argv)
    if a.threads is not None and a.threads < 1:
        p.error("--threads must be a positive integer")
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if a.graph and not a.device.startswith("cuda"):
        p.error("--graph needs --device cuda")
    return a


def git_commit():
    if os.environ.get("EMBER_COMMIT"):      # hosts without .git
        return os.environ["EMBER_COMMIT"]
    c = sh("git rev-parse --short HEAD") or "unknown"
    if sh("git status --porcelain --untracked-files=no"):
        c += "+dirty"
    return c


def device_name(on_cuda):
    if on_cuda:
        return torch.cuda.get_device_name(0)
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return "cpu (" + line.split(":", 1)[1].strip() + ")"
    except OSError:
        pass
    return "cpu"


def peak_tflops(a, dev, on_cuda):
    if a.peak_tflops:
        return a.peak_tflops, "--peak-tflops"
    if not on_cuda:
        return None, "no peak known for a CPU"
    if "H100" in dev or "H200" in dev:
        if a.precision == "bf16":
            return 989.4, "H100/H200 SXM dense bf16"
        if a.tf32:
            return 494.7, "H100/H200 SXM dense TF32"
        return 66.9, "H100/H200 SXM fp32 (no tensor cores)"
    return None, "unknown device: pass --peak-tflops"


def make_optimizer(a, params, on_cuda):
    kw = dict(lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    if a.graph:
        kw["capturable"] = True
    if a.optimizer == "fused" and on_cuda:
        try:
            return torch.optim.AdamW(params, fused=True, **kw)
        except (TypeError, RuntimeError):       # older PyTorch: no fused AdamW
            pass
    if a.optimizer in ("fused", "foreach"):
        return torch.optim.AdamW(params, foreach=True, **kw)
    return torch.optim.AdamW(params, foreach=False, **kw)


def main(argv=None):
    a = parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    on_cuda = a.device.startswith("cuda")
    D, FF, L, H = CONFIGS[a.model]
    D, FF, L, H = a.d_model or D, a.d_ff or FF, a.layers or L, a.heads or H
    T, B, V = a.context, a.batch, a.vocab
    n_params = count_parameters(V, D, FF, L)
    n_matmul = n_params - V * D
    flops_per_token = 2 * n_matmul + 4 * L * D * T if a.mode == "fwd" else 6 * n_matmul + 12 * L * D * T
    tokens_per_step = B * T
    dev = device_name(on_cuda)
    driver = sh("nvidia-smi --query-gpu=driver_version --format=csv,noheader -i 0") if on_cuda else None
    commit = git_commit()
    peak, peak_why = peak_tflops(a, dev, on_cuda)
    variant = ("compile" if a.compile else "eager") + ("+graph" if a.graph else "")
    config = dict(model=a.model, d_model=D, d_ff=FF, layers=L, heads=H, vocab=V, context=T, batch=B,
                  mode=a.mode, precision=a.precision, tf32=a.tf32, attn=a.attn, graph=a.graph,
                  compile=a.compile, optimizer=a.optimizer, warmup=a.warmup, steps=a.steps,
                  seed=a.seed, lr=a.lr, device=a.device, params=n_params, params_matmul=n_matmul,
                  threads=torch.get_num_threads())

    print(f"device: {dev}" + (f", driver {driver}" if driver else "") + f", {torch.get_num_threads()} CPU threads")
    now = datetime.datetime.now(datetime.timezone.utc)
    print(f"commit: {commit}, {now:%Y-%m-%d %H:%M} UTC, torch {torch.__version__} ({variant})")
    print(f"config: {a.model} d_model={D} d_ff={FF} layers={L} heads={H} vocab={V} context={T} "
          f"batch={B} mode={a.mode} precision={a.precision}{'+tf32' if a.tf32 else ''} attn={a.attn} "
          f"graph={str(a.graph).lower()} warmup={a.warmup} steps={a.steps} params={n_params / 1e6:.1f}M")

    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32

    def sync():
        if on_cuda:
            torch.cuda.synchronize()

    model_ref, opt_ref = [None], [None]

    def run():
        if on_cuda:
            torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(a.seed)
        model = TransformerLM(V, T, D, FF, L, H, attn=a.attn).to(a.device)
        net = WithLoss(model)
        if a.compile:
            net = torch.compile(net)
        opt = make_optimizer(a, model.parameters(), on_cuda) if a.mode == "train" else None
        model_ref[0], opt_ref[0] = model, opt
        data = torch.randint(0, V, (B, T + 1), device=a.device)
        x, y = data[:, :T], data[:, 1:]
        amp = a.precision == "bf16"
        dev_type = "cuda" if on_cuda else "cpu"

        def forward():
            with torch.autocast(dev_type, dtype=torch.bfloat16, enabled=amp):
                return net(x, y)

        def step():
            if a.mode == "fwd":
                with torch.no_grad():
                    return forward()
            model.zero_grad(set_to_none=True)
            loss = forward()
            loss.backward()
            if opt is not None:
                opt.step()
            return loss

        loss = None
        if a.graph:
            # PyTorch's whole-network capture recipe: warm up on a side stream.
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(max(a.warmup, 3)):
                    loss = step()
            torch.cuda.current_stream().wait_stream(s)
            model.zero_grad(set_to_none=True)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                loss = step()
            g.replay()
            sync()
            timed = g.replay
        else:
            for _ in range(a.warmup):
                loss = step()
            timed = step
        sync()

        samples = []
        for i in range(a.steps):
            sync()
            t0 = timeit.default_timer()
            out = timed()
            sync()
            samples.append((timeit.default_timer() - t0) * 1e3)
            if out is not None:
                loss = out
            if not a.quiet:
                tps = tokens_per_step / samples[-1] * 1e3
                mfu = f"  MFU {100 * tps * flops_per_token / (peak * 1e12):5.1f}%" if peak else ""
                print(f"step {i + 1:3d}/{a.steps}  {samples[-1]:9.3f} ms  {tps:12.0f} tok/s{mfu}")
        final_loss = loss.item() if loss is not None else None
        peak_mem = torch.cuda.max_memory_allocated() if on_cuda else None
        if a.breakdown and not a.graph:
            result["breakdown"] = phase_breakdown(forward)
        return samples, final_loss, peak_mem

    def phase_breakdown(forward):
        """One eager step by phase, each synchronised: ms, allocated after, peak during."""
        out = []

        def phase(name, fn):
            sync()
            if on_cuda:
                torch.cuda.reset_peak_memory_stats()
            t0 = timeit.default_timer()
            r = fn()
            sync()
            e = dict(name=name, ms=(timeit.default_timer() - t0) * 1e3)
            if on_cuda:
                e.update(allocated=torch.cuda.memory_allocated(), peak=torch.cuda.max_memory_allocated())
            out.append(e)
            return r

        if a.mode == "fwd":
            with torch.no_grad():
                phase("forward", forward)
        else:
            phase("zero_grad", lambda: model_ref[0].zero_grad(set_to_none=True))
            loss = phase("forward", forward)
            phase("backward", loss.backward)
            del loss
            if opt_ref[0] is not None:
                phase("optimizer", opt_ref[0].step)
        for e in out:
            mem = (f"   allocated after {e['allocated'] / 2**30:6.2f} GiB, peak during {e['peak'] / 2**30:6.2f} GiB"
                   if "peak" in e else "")
            print(f"breakdown: {e['name']:<9} {e['ms']:9.3f} ms{mem}")
        return out

    result = dict(tool="pytorch", variant=variant, torch=torch.__version__, commit=commit, device=dev,
                  driver=driver, date=now.strftime("%Y-%m-%dT%H:%M:%SZ"), config=config,
                  flops_per_token=flops_per_token, peak_tflops=peak,
                  command="python3 bench/pytorch_baseline.py " + " ".join(sys.argv[1:] if argv is None else argv))
    try:
        samples, final_loss, peak_mem = run()
    except torch.cuda.OutOfMemoryError as e:
        result.update(status="OOM", error=str(e).splitlines()[0])
        print(f"result: OOM ({result['error']})")
    except RuntimeError as e:
        if "out of memory" not in str(e):
            raise
        result.update(status="OOM", error=str(e).splitlines()[0])
        print(f"result: OOM ({result['error']})")
    else:
        mean = statistics.fmean(samples)
        std = statistics.stdev(samples) if len(samples) > 1 else 0.0
        med = statistics.median(samples)
        tps = tokens_per_step / mean * 1e3
        result.update(status="ok", samples_ms=samples, mean_ms=mean, std_ms=std, median_ms=med,
                      min_ms=min(samples), max_ms=max(samples), tokens_per_s=tps,
                      mfu=tps * flops_per_token / (peak * 1e12) if peak else None,
                      peak_memory_bytes=peak_mem, final_loss=final_loss)
        print(f"time: {mean:.3f} ± {std:.3f} ms per step (mean ± std of {len(samples)}), "
              f"median {med:.3f} ms, min {min(samples):.3f} ms")
        print(f"throughput: {tps:.0f} tokens/s ({tokens_per_step} tokens per step, from the mean)")
        formula = "2·N + 4·L·d·T" if a.mode == "fwd" else "6·N + 12·L·d·T"
        if peak:
            print(f"MFU: {100 * result['mfu']:.1f}% = tokens/s × {flops_per_token:.4g} FLOPs/token / "
                  f"{peak:.1f} TFLOP/s ({peak_why}); FLOPs/token = {formula}")
        else:
            print(f"MFU: n/a ({peak_why}); FLOPs/token = {flops_per_token:.4g}")
        if peak_mem is not None:
            print(f"peak memory: {peak_mem / 2**30:.2f} GiB (torch.cuda.max_memory_allocated)")
        if final_loss is not None:
            print(f"loss: {final_loss:.4f}")
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
