"""What scripts/torch/bench_*.py share: the process group from torchrun's
environment (NCCL for cuda, gloo for cpu), the runinfo facts every JSON line
carries (as ember.runinfo: commit, device, driver, date, host), the JSON
output, and for the model studies (bench_ddp.py, bench_zero.py) the model
and batch options, the seeded batch, a fresh DDP-wrapped model, the autocast
loss and the timed step loop, so both twins measure the same way. The Lua studies (scripts/bench_allreduce.lua, bench_ddp.lua,
bench_zero.lua) run these under torchrun in their driver mode and pass
EMBER_COMMIT, so both sides carry Ember's commit.
"""
import datetime
import json
import os
import socket
import subprocess
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

MiB = 2 ** 20
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}


def sh(cmd):
    try:
        out = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=20).stdout.strip()
        return out or None
    except Exception:
        return None


def init(device):
    """Process group for `device` ("cuda" or "cpu"); returns (rank, world, torch.device)."""
    on_cuda = device.startswith("cuda")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if on_cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    dist.init_process_group("nccl" if on_cuda else "gloo")
    return dist.get_rank(), dist.get_world_size(), dev


def runinfo(dev):
    on_cuda = dev.type == "cuda"
    commit = os.environ.get("EMBER_COMMIT") or sh("git rev-parse --short HEAD") or "unknown"
    if on_cuda:
        name = torch.cuda.get_device_name(dev)
        driver = sh(f"nvidia-smi --query-gpu=driver_version --format=csv,noheader -i {dev.index or 0}")
    else:
        name, driver = "cpu", None
        try:
            for line in open("/proc/cpuinfo"):
                if line.startswith("model name"):
                    name = "cpu (" + line.split(":", 1)[1].strip() + ")"
                    break
        except OSError:
            pass
    return {"commit": commit, "device": name, "driver": driver, "host": socket.gethostname(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "torch": torch.__version__}


def header(facts, config_text):
    print(f"device: {facts['device']}" + (f", driver {facts['driver']}" if facts["driver"] else ""))
    print(f"commit: {facts['commit']}, {facts['date']}, torch {facts['torch']}")
    print("config: " + config_text, flush=True)


def emit(rec, path):
    """Print one JSON line and append it to `path` (when given); flat keys like ember.report."""
    flat = {}
    for k, v in rec.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                flat[f"{k}.{k2}"] = v2
        else:
            flat[k] = v
    line = json.dumps(flat)
    print(line, flush=True)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def reduce_number(v, op, dev):
    t = torch.tensor([v], dtype=torch.float64, device=dev)
    if op == "avg":
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.item() / dist.get_world_size()
    dist.all_reduce(t, op={"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "sum": dist.ReduceOp.SUM}[op])
    return t.item()


def time_calls(fn, reps, dev):
    """ms per call: CUDA events on the current stream around `reps` calls (CPU: wall clock)."""
    if dev.type == "cuda":
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        e.synchronize()
        return s.elapsed_time(e) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1e3 / reps


def sizes_list(text):
    out = []
    for item in text.split(","):
        v = float(item)
        out.append(int(v) if v == int(v) else v)
    return out


# ---------------------------------------------------------------------------
# the model studies (bench_ddp.py, bench_zero.py): the same options, batch and
# step as scripts/lib/model_flags.lua gives their Lua twins


def add_model_args(p, configs):
    """--model and its overrides, --vocab, --batch, --context (bench/pytorch_baseline.py takes them too)."""
    p.add_argument("--model", default="small", choices=list(configs))
    p.add_argument("--d-model", type=int)
    p.add_argument("--d-ff", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=512)


def model_dims(a, configs):
    """(d_model, d_ff, layers, heads) of --model, each overridden when given."""
    D, FF, L, H = configs[a.model]
    return a.d_model or D, a.d_ff or FF, a.layers or L, a.heads or H


def start_study(a, study, configs, count_parameters):
    """One rank of a model study: the process group, the model shape, the runinfo facts and the
    config fields both studies record. Returns rank, world, device, (D, FF, L, H), params, facts, config."""
    rank, n, dev = init(a.device)
    D, FF, L, H = model_dims(a, configs)
    n_params = count_parameters(a.vocab, D, FF, L)
    config = dict(study=study, model=a.model, d_model=D, d_ff=FF, layers=L, heads=H, vocab=a.vocab,
                  context=a.context, batch=a.batch, precision=a.precision, warmup=a.warmup, steps=a.steps,
                  lr=a.lr, seed=a.seed, params=n_params, device_kind=dev.type)
    return rank, n, dev, (D, FF, L, H), n_params, runinfo(dev), config


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def lm_batch(a, rank, dev):
    """This rank's tokens (seed + 1 + rank): inputs x and next-token targets y, (batch, context)."""
    torch.manual_seed(a.seed + 1 + rank)
    data = torch.randint(0, a.vocab, (a.batch, a.context + 1), device=dev)
    return data[:, :a.context], data[:, 1:]


def fresh_ddp(build, dev, seed, bucket_cap_mb, bucket_view):
    """build() afresh with `seed` after the allocator's cache and peak are reset; (model, DDP(model))."""
    sync(dev)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    torch.manual_seed(seed)
    model = build().to(dev)
    ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None, bucket_cap_mb=bucket_cap_mb,
              gradient_as_bucket_view=bucket_view)
    return model, ddp


def lm_loss(model, x, y, a, dev):
    """Forward and cross-entropy under bf16 autocast (--precision bf16) or none."""
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
        logits = model(x)
        return F.cross_entropy(logits.reshape(-1, a.vocab).float(), y.reshape(-1))


def timed_steps(fn, steps, dev):
    """ms of each of `steps` calls of fn (host clock, device synchronised around each), and fn's last result."""
    samples, last = [], None
    for _ in range(steps):
        sync(dev)
        t0 = time.perf_counter()
        last = fn()
        sync(dev)
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples, last
