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

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
from common import (add_model_args, emit, fresh_ddp, header, lm_batch, lm_loss, reduce_number,  # noqa: E402
                    start_study, sync, timed_steps)
from torch_lm import CONFIGS, TransformerLM, count_parameters  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description="Memory and step time: AdamW vs ZeroRedundancyOptimizer (PyTorch).")
    add_model_args(p, CONFIGS)
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
    rank, n, dev, (D, FF, L, H), n_params, facts, config = start_study(a, "zero", CONFIGS, count_parameters)
    on_cuda = dev.type == "cuda"
    B, T, V = a.batch, a.context, a.vocab
    config.update(bucket_mb=a.bucket_mb)
    if rank == 0:
        header(facts, f"torch ZeRO-1 ranks={n} {a.model} d_model={D} layers={L} vocab={V} context={T} "
                      f"batch/GPU={B} precision={a.precision} params={n_params / 1e6:.1f}M")
    x, y = lm_batch(a, rank, dev)

    def allocated():
        return torch.cuda.memory_allocated(dev) if on_cuda else None

    def maxr(v):
        return reduce_number(v, "max", dev) if v is not None else None

    for variant in a.variants.split(","):
        model, ddp = fresh_ddp(lambda: TransformerLM(V, T, D, FF, L, H), dev, a.seed, a.bucket_mb, True)
        sync(dev)
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
            loss = lm_loss(ddp, x, y, a, dev)
            loss.backward()

        def step():
            fwd_bwd()
            opt.step()

        fwd_bwd()
        sync(dev)
        before_step = allocated()
        opt.step()
        sync(dev)
        after_step = allocated()
        for _ in range(a.warmup):
            step()
        sync(dev)
        dist.barrier()
        samples, _ = timed_steps(step, a.steps, dev)
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
