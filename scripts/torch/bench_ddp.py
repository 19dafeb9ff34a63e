#!/usr/bin/env python3
"""scripts/bench_ddp.lua's measurement in PyTorch: the reference TransformerLM
(bench/torch_lm.py), the same batch per GPU, bf16 autocast, AdamW, wrapped in
DistributedDataParallel(bucket_cap_mb=B, gradient_as_bucket_view=True) for
each --bucket-mb (rows "bucketed"), and the compute-only step under
ddp.no_sync() (row "none"). Same figures and JSON fields as the Lua script:

  step_ms     median of --steps timed steps (host clock between synchronisations), slowest rank
  compute_ms  the step under no_sync() (no all-reduce)
  comm_ms     all-reduces of DDP's buckets alone, back to back, CUDA events; bucket sizes
              rebuilt as DDP's first plan: reverse parameter order, first bucket 1 MiB, then
              bucket_cap_mb (DDP may re-bucket after step 1 by gradient order; sizes are similar)
  exposed_ms  step_ms - compute_ms;  hidden_frac = 1 - exposed_ms / comm_ms

  torchrun --standalone --nproc_per_node 2 scripts/torch/bench_ddp.py --model small --bucket-mb 25
"""
import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
from common import (MiB, add_model_args, emit, fresh_ddp, header, lm_batch, lm_loss,  # noqa: E402
                    reduce_number, sizes_list, start_study, sync, time_calls, timed_steps)
from torch_lm import CONFIGS, TransformerLM, count_parameters  # noqa: E402

FIRST_BUCKET_BYTES = 1 * MiB      # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES


def parse_args():
    p = argparse.ArgumentParser(description="DDP step time, exposed communication and memory (PyTorch).")
    add_model_args(p, CONFIGS)
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "naive"])
    p.add_argument("--bucket-mb", default="25")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--comm-reps", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--optimizer", default="fused", choices=["fused", "foreach"])
    p.add_argument("--no-bucket-view", action="store_true", help="gradient_as_bucket_view=False")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json")
    return p.parse_args()


def adamw(params, a, on_cuda):
    if a.optimizer == "fused" and on_cuda:
        try:
            return torch.optim.AdamW(params, lr=a.lr, fused=True)
        except (TypeError, RuntimeError):
            pass
    return torch.optim.AdamW(params, lr=a.lr, foreach=True)


def bucket_sizes(params, cap_bytes):
    """Element counts of DDP's buckets: reverse order, first bucket 1 MiB, then cap."""
    sizes, cur, first = [], 0, True
    for p in reversed(params):
        nb = p.numel() * p.element_size()
        cap = min(FIRST_BUCKET_BYTES, cap_bytes) if first else cap_bytes
        if cur and cur + nb > cap:
            sizes.append(cur)
            cur, first = 0, False
            cap = cap_bytes
        cur += nb
        if cur >= cap:
            sizes.append(cur)
            cur, first = 0, False
    if cur:
        sizes.append(cur)
    return [s // params[0].element_size() for s in sizes]


def main():
    a = parse_args()
    rank, n, dev, (D, FF, L, H), n_params, facts, config = start_study(a, "ddp", CONFIGS, count_parameters)
    on_cuda = dev.type == "cuda"
    B, T, V = a.batch, a.context, a.vocab
    config.update(attn=a.attn, comm_reps=a.comm_reps, optimizer=a.optimizer,
                  gradient_as_bucket_view=not a.no_bucket_view)
    if rank == 0:
        header(facts, f"torch DDP ranks={n} {a.model} d_model={D} d_ff={FF} layers={L} heads={H} vocab={V} "
                      f"context={T} batch/GPU={B} precision={a.precision} params={n_params / 1e6:.1f}M")
    x, y = lm_batch(a, rank, dev)

    compute_ms = None

    def measure(name, mb, discard=False):
        nonlocal compute_ms
        model, ddp = fresh_ddp(lambda: TransformerLM(V, T, D, FF, L, H, attn=a.attn), dev, a.seed, mb,
                               not a.no_bucket_view)
        opt = adamw(ddp.parameters(), a, on_cuda)
        params = [p for p in model.parameters() if p.requires_grad]
        grad_bytes = sum(p.numel() * p.element_size() for p in params)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = lm_loss(ddp, x, y, a, dev)
            loss.backward()
            opt.step()
            return loss

        def step_no_sync():
            with ddp.no_sync():
                return step()

        fn = step_no_sync if name == "none" else step
        for _ in range(a.warmup):
            fn()
        sync(dev)
        dist.barrier()
        samples, loss = timed_steps(fn, a.steps, dev)
        peak = reduce_number(torch.cuda.max_memory_allocated(dev), "max", dev) if on_cuda else None
        step_ms = reduce_number(statistics.median(samples), "max", dev)
        final_loss = loss.item()
        del ddp, opt, model
        if discard:
            return
        comm_ms, ncoll = 0.0, 0
        if name != "none":
            sizes = bucket_sizes(params, mb * MiB)
            ncoll = len(sizes)
            buf = torch.zeros(sum(sizes), dtype=params[0].dtype, device=dev)
            views, off = [], 0
            for s in sizes:
                views.append(buf[off:off + s])
                off += s

            def all_reduce_all():
                for v in views:
                    dist.all_reduce(v)
            all_reduce_all()
            sync(dev)
            reps = []
            for _ in range(a.comm_reps):
                dist.barrier()
                reps.append(time_calls(all_reduce_all, 1, dev))
            comm_ms = reduce_number(statistics.median(reps), "max", dev)
            del buf, views
        if name == "none":
            compute_ms = step_ms
        exposed = step_ms - compute_ms if name != "none" and compute_ms is not None else None
        factor = 2 * (n - 1) / n
        rec = dict(facts, impl="pytorch", strategy=name, bucket_mb=mb if name == "bucketed" else None,
                   world_size=n, status="ok", step_ms=step_ms, samples_ms=samples,
                   step_mean_ms=statistics.mean(samples), compute_ms=compute_ms, comm_ms=comm_ms,
                   exposed_ms=exposed,
                   hidden_frac=(1 - exposed / comm_ms) if exposed is not None and comm_ms > 0 else None,
                   collectives_per_step=ncoll, peak_memory_bytes=peak, tokens_per_s=n * B * T / step_ms * 1e3,
                   final_loss=final_loss, grad_bytes=grad_bytes, formula_wire_bytes_per_step=factor * grad_bytes,
                   config=config)
        if rank == 0:
            emit(rec, a.json)

    mbs = sizes_list(a.bucket_mb)
    measure("none", mbs[0], discard=True)
    measure("none", mbs[0])
    for mb in mbs:
        measure("bucketed", mb)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
