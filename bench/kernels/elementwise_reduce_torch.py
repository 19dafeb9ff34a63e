"""The PyTorch side of elementwise_reduce.lua: the same ops, sizes, byte
counts and timing (CUDA events, median of `reps` after 3 warm-ups).

    python3 bench/kernels/elementwise_reduce_torch.py [reps]
"""
import sys
import torch

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
dev = "cuda"
M = 1024 * 1024
rows, ceiling = [], None


def time_ms(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(reps):
        t0.record(); fn(); t1.record(); t1.synchronize()
        samples.append(t0.elapsed_time(t1))
    samples.sort()
    k = len(samples)
    return samples[k // 2] if k % 2 else (samples[k // 2 - 1] + samples[k // 2]) / 2


def bench(name, nbytes, fn):
    global ceiling
    ms = time_ms(fn)
    gbs = nbytes / (ms * 1e-3) / 1e9
    ceiling = ceiling or gbs
    rows.append("| %-52s | %9.3f | %7.0f | %5.0f%% |" % (name, ms, gbs, 100 * gbs / ceiling))
    print(rows[-1], file=sys.stderr)


n = 64 * M
a, b, c = torch.randn(n, device=dev), torch.randn(n, device=dev), torch.empty(n, device=dev)
bench("copy_ 64M f32 (the ceiling)", 2 * 4 * n, lambda: c.copy_(a))
bench("add 64M f32, out=", 3 * 4 * n, lambda: torch.add(a, b, out=c))
bench("add 64M f32, allocating", 3 * 4 * n, lambda: a + b)
bench("mul by a number 64M f32, out=", 2 * 4 * n, lambda: torch.mul(a, 0.5, out=c))
ah, bh, ch = a.bfloat16(), b.bfloat16(), torch.empty(n, device=dev, dtype=torch.bfloat16)
bench("add 64M bf16, out=", 3 * 2 * n, lambda: torch.add(ah, bh, out=ch))
bench("gelu 64M bf16, out=", 2 * 2 * n, lambda: torch._C._nn.gelu(ah, out=ch))
x2, bias = a.view(8192, 8192), torch.randn(8192, device=dev)
bench("add (8192,8192) + (8192) broadcast f32, out=", 2 * 4 * n + 4 * 8192, lambda: torch.add(x2, bias, out=c.view(8192, 8192)))
bench("lt 64M f32 -> bool", (2 * 4 + 1) * n, lambda: a < b)
del ah, bh, ch, b, x2
s = torch.randn(8192, 10000, device=dev)
e = 8192 * 10000
bench("softmax (8192, 10000) f32", 2 * 4 * e, lambda: s.softmax(-1))
bench("log_softmax (8192, 10000) f32", 2 * 4 * e, lambda: s.log_softmax(-1))
bench("softmax (8192, 10000) f32, again (order check)", 2 * 4 * e, lambda: s.softmax(-1))
sh = s.bfloat16()
bench("softmax (8192, 10000) bf16", 2 * 2 * e, lambda: sh.softmax(-1))
del sh
att = torch.randn(32768, 1024, device=dev)
bench("softmax (32768, 1024) f32", 2 * 4 * 32768 * 1024, lambda: att.softmax(-1))
del att
x = s.clone().requires_grad_(True)
y = x.softmax(-1)
g = torch.randn(8192, 10000, device=dev)


def sm_bwd():
    x.grad = None
    y.backward(g, retain_graph=True)


bench("softmax backward (8192, 10000) f32, via autograd", 3 * 4 * e, sm_bwd)
del x, y, g, s
m = torch.randn(4096, 4096, device=dev)
me = 4096 * 4096
bench("sum over the last dim (4096, 4096) f32", 4 * me, lambda: m.sum(-1))
bench("sum over dim 0 (4096, 4096) f32 (columns)", 4 * me, lambda: m.sum(0))
bench("max + indices over the last dim (4096, 4096) f32", 4 * me, lambda: m.max(-1))
bench("sum of all 64M f32", 4 * n, lambda: a.sum())
mh = a.view(8192, 8192).bfloat16()
bench("mean over the last dim (8192, 8192) bf16", 2 * n, lambda: mh.mean(-1))
print("device: %s (PyTorch %s); %d reps, median" % (torch.cuda.get_device_name(), torch.__version__, reps))
print("| op | ms | GB/s | % copy |")
print("|---|---|---|---|")
for r in rows:
    print(r)
