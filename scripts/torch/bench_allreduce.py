#!/usr/bin/env python3
"""scripts/bench_allreduce.lua's measurement in PyTorch (torch.distributed:
NCCL for cuda, gloo for cpu), with the same flags, method and JSON fields.

  torchrun --standalone --nproc_per_node 2 scripts/torch/bench_allreduce.py --sizes 1,10,100,1000

Per size (MiB): a tensor of zeros, --warmup all-reduces, a barrier, then
--iters back-to-back synchronous all-reduces between two CUDA events on the
current stream (CPU: wall clock); time = the slowest rank's elapsed / iters;
algbw = bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests), GB = 1e9 B.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import DTYPES, MiB, emit, header, init, reduce_number, runinfo, sizes_list, time_calls  # noqa: E402


def main():
    p = argparse.ArgumentParser(description="All-reduce time, algbw and busbw over sizes (PyTorch).")
    p.add_argument("--sizes", default="1,10,100,1000", help="MiB, a comma list")
    p.add_argument("--dtype", default="f32", choices=list(DTYPES))
    p.add_argument("--op", default="sum", choices=["sum", "avg", "max", "min"])
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", help="append one JSON line per size")
    a = p.parse_args()
    rank, n, dev = init(a.device)
    on_cuda = dev.type == "cuda"
    backend = "nccl" if on_cuda else "gloo"
    if a.op == "avg" and not on_cuda:
        op = None                      # gloo has no AVG: sum, as the timing is what counts
    else:
        op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
              "avg": getattr(dist.ReduceOp, "AVG", dist.ReduceOp.SUM)}[a.op]
    op = op or dist.ReduceOp.SUM
    facts = runinfo(dev)
    sizes = sizes_list(a.sizes)
    if rank == 0:
        header(facts, f"torch all_reduce dtype={a.dtype} op={a.op} ranks={n} backend={backend} "
                      f"sizes={a.sizes} MiB warmup={a.warmup} iters={a.iters}")
    dtype = DTYPES[a.dtype]
    esize = torch.tensor([], dtype=dtype).element_size()
    config = dict(study="allreduce", dtype=a.dtype, op=a.op, warmup=a.warmup, iters=a.iters,
                  sizes_mib=sizes, device_kind=dev.type)
    for mib in sizes:
        numel = max(1, int(mib * MiB // esize))
        nbytes = numel * esize
        t = torch.zeros(numel, dtype=dtype, device=dev)
        for _ in range(a.warmup):
            dist.all_reduce(t, op=op)
        dist.barrier()
        ms = time_calls(lambda: dist.all_reduce(t, op=op), a.iters, dev)
        ms_max = reduce_number(ms, "max", dev)
        ms_avg = reduce_number(ms, "avg", dev)
        del t
        if rank == 0:
            algbw = nbytes / (ms_max * 1e-3) / 1e9
            busbw = algbw * 2 * (n - 1) / n
            rec = dict(facts, impl="pytorch", size_mib=mib, bytes=nbytes, numel=numel, dtype=a.dtype, op=a.op,
                       world_size=n, backend=backend, time_us=ms_max * 1e3, time_avg_us=ms_avg * 1e3,
                       algbw_gbs=algbw, busbw_gbs=busbw, status="ok", config=config)
            emit(rec, a.json)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
