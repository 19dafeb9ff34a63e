"""What scripts/torch/bench_*.py share: the process group from torchrun's
environment (NCCL for cuda, gloo for cpu), the runinfo facts every JSON line
carries (as ember.runinfo: commit, device, driver, date, host), and the JSON
output. The Lua studies (scripts/bench_allreduce.lua, bench_ddp.lua,
bench_zero.lua) run these under torchrun in their driver mode and pass
EMBER_COMMIT, so both sides carry Ember's commit.
"""
import datetime
import json
import os
import socket
import subprocess

import torch
import torch.distributed as dist

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
    import time
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
