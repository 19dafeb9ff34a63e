"""PyTorch's twin of scripts/bench_dispatch.lua: host time of one tiny op (a + b,
a.add_(b), a * w with w requiring grad; and the parts: empty(1), a.fill_(1)) on 1-element f32 tensors, and of a
tiny-LM-sized forward is left out (no shared model here). On CUDA each sample
issues --cuda-reps ops after a synchronisation and stops the clock without
waiting for them, as the Lua side does. Prints one JSON line."""
import argparse
import json
import statistics
import time

import torch

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
p.add_argument("--reps", type=int, default=100000)
p.add_argument("--samples", type=int, default=7)
p.add_argument("--cuda-reps", type=int, default=256)
args = p.parse_args()

dev = torch.device(args.device)
cuda = dev.type == "cuda"


def sync():
    if cuda:
        torch.cuda.synchronize()


def per_call(fn):
    n, samples = args.reps, args.samples
    if cuda:
        n, samples = args.cuda_reps, args.samples * max(1, args.reps // args.cuda_reps)
    fn(n)
    times = []
    for _ in range(samples):
        sync()
        t0 = time.perf_counter()
        fn(n)
        times.append((time.perf_counter() - t0) / n)
    sync()
    return statistics.median(times) * 1e6


a = torch.ones(1, device=dev)
b = torch.ones(1, device=dev)
w = torch.ones(1, device=dev, requires_grad=True)


def add(n):
    for _ in range(n):
        a + b


def add_(n):
    for _ in range(n):
        a.add_(b)


def mul_w(n):
    for _ in range(n):
        a * w


def empty(n):
    for _ in range(n):
        torch.empty(1, device=dev)


def fill_(n):
    for _ in range(n):
        a.fill_(1.0)


print(json.dumps({"torch": torch.__version__, "device": args.device, "add_1elem_us": per_call(add),
                  "add_inplace_1elem_us": per_call(add_), "mul_recorded_1elem_us": per_call(mul_w),
                  "empty_1elem_us": per_call(empty), "fill_1elem_us": per_call(fill_)}))
