#!/usr/bin/env python3
"""scripts/bench_zero.lua's measurement in PyTorch: AdamW vs
ZeroRedundancyOptimizer(AdamW), both under DistributedDataParallel(
bucket_cap_mb=, gradient_as_bucket_view=True), the reference TransformerLM
(bench/torch_lm.py), the same batch per GPU and autocast. Memory is
torch.cuda.memory_allocated after init / before / after the first optimizer
step, and max_memory_allocated over the first and the timed steps (largest
rank); state_bytes are the optimizer-state tensors of this rank.

  torchrun --standalone --nproc_per_node 2 scripts/torch/bench_zero.py --model small
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
from common import emit, header, init, reduce_number, runinfo  # noqa: E402
from torch_lm import CONFIGS, TransformerLM, count_parameters  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description="Memory and step time: AdamW vs ZeroRedundancyOptimizer (PyTorch).")
    p.add_argument("--model", default="small", choices=list(CONFIGS))
    p.add_argument("--d-model", type=int)
    p.add_argument("--d-ff", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--variants", default="adamw,sharded")
    p.add_argument("--bucket-mb", type=float, default=25)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json")
    return p.parse_args()


def state_bytes(opt):
    inner = opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt
    return sum(v.numel() * v.element_size() for st in inner.state.values() for v in st.values()
               if torch.is_tensor(v))


def main():
    a = parse_args()
    rank, n, dev = init(a.device)
    on_cuda = dev.type == "cuda"
    D, FF, L, H = CONFIGS[a.model]
    D, FF, L, H = a.d_model or D, a.d_ff or FF, a.layers or L, a.heads or H
    B, T, V = a.batch, a.context, a.vocab
    n_params = count_parameters(V, D, FF, L)
    facts = runinfo(dev)
    config = dict(study="zero", model=a.model, d_model=D, d_ff=FF, layers=L, heads=H, vocab=V, context=T,
                  batch=B, precision=a.precision, bucket_mb=a.bucket_mb, warmup=a.warmup, steps=a.steps,
                  lr=a.lr, seed=a.seed, params=n_params, device_kind=dev.type)
    if rank == 0:
        header(facts, f"torch ZeRO-1 ranks={n} {a.model} d_model={D} layers={L} vocab={V} context={T} "
                      f"batch/GPU={B} precision={a.precision} params={n_params / 1e6:.1f}M")
    torch.manual_seed(a.seed + 1 + rank)
    data = torch.randint(0, V, (B, T + 1), device=dev)
    x, y = data[:, :T], data[:, 1:]

    def sync():
        if on_cuda:
            torch.cuda.synchronize()

    def allocated():
        return torch.cuda.memory_allocated(dev) if on_cuda else None

    def maxr(v):
        return reduce_number(v, "max", dev) if v is not None else None

    for variant in a.variants.split(","):
        sync()
        if on_cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        torch.manual_seed(a.seed)
        model = TransformerLM(V, T, D, FF, L, H).to(dev)
        ddp = DDP(model, device_ids=[dev.index] if on_cuda else None, bucket_cap_mb=a.bucket_mb,
                  gradient_as_bucket_view=True)
        sync()
        after_init = allocated()
        kw = dict(lr=a.lr, foreach=True)
        if variant == "sharded":
            opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, **kw)
        else:
            opt = torch.optim.AdamW(ddp.parameters(), **kw)
        loss = None

        def fwd_bwd():
            nonlocal loss
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
                logits = ddp(x)
                loss = F.cross_entropy(logits.reshape(-1, V).float(), y.reshape(-1))
            loss.backward()

        fwd_bwd()
        sync()
        before_step = allocated()
        opt.step()
        sync()
        after_step = allocated()
        for _ in range(a.warmup):
            fwd_bwd()
            opt.step()
        sync()
        dist.barrier()
        samples = []
        for _ in range(a.steps):
            sync()
            t0 = time.perf_counter()
            fwd_bwd()
            opt.step()
            sync()
            samples.append((time.perf_counter() - t0) * 1e3)
        peak = torch.cuda.max_memory_allocated(dev) if on_cuda else None
        pbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        gbytes = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
        sb = state_bytes(opt)
        rec = dict(facts, impl="pytorch", variant=variant, world_size=n, status="ok",
                   after_init_bytes=maxr(after_init), before_step_bytes=maxr(before_step),
                   after_step_bytes=maxr(after_step), peak_memory_bytes=maxr(peak), params_bytes=pbytes,
                   grads_bytes=gbytes, state_bytes=maxr(sb),
                   step_ms=reduce_number(statistics.median(samples), "max", dev), samples_ms=samples,
                   final_loss=loss.item(), config=config)
        if rank == 0:
            emit(rec, a.json)
        del ddp, opt, model, loss
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
