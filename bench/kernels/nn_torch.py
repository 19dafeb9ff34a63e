"""nn_torch.py — the rows of bench/kernels/nn.lua timed in PyTorch the same
way (CUDA events, median of `reps` calls after 3 warm-ups), for the
Ember-vs-PyTorch table on the same GPU.

    python3 bench/kernels/nn_torch.py [reps]
"""
import sys
import torch
import torch.nn.functional as F

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
dev = "cuda"


def time_ms(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    xs = []
    for _ in range(reps):
        t0.record(); fn(); t1.record(); t1.synchronize()
        xs.append(t0.elapsed_time(t1))
    xs.sort()
    return xs[len(xs) // 2]


rows = []


def bench(name, fn, flops=None, nbytes=None):
    ms = time_ms(fn)
    tf = f"{flops / (ms * 1e-3) / 1e12:.1f}" if flops else ""
    gb = f"{nbytes / (ms * 1e-3) / 1e9:.0f}" if nbytes else ""
    rows.append(f"| {name:<58} | {ms:9.4f} | {tf:>7} | {gb:>7} |")
    print(rows[-1], file=sys.stderr, flush=True)


n = 64 << 20
a, c = torch.randn(n, device=dev), torch.empty(n, device=dev)
bench("copy_ 64M f32 (bandwidth ceiling)", lambda: c.copy_(a), None, 8 * n)
del a, c

N = 8192
a, b = torch.randn(N, N, device=dev, dtype=torch.bfloat16), torch.randn(N, N, device=dev, dtype=torch.bfloat16)
bench("matmul bf16 8192x8192x8192", lambda: a @ b, 2 * N ** 3)
del a, b

T, d, ff = 2048, 1600, 6400
x, w1 = torch.randn(T, d, device=dev, dtype=torch.bfloat16), torch.randn(ff, d, device=dev, dtype=torch.bfloat16) * 0.02
h, w2 = torch.randn(T, ff, device=dev, dtype=torch.bfloat16), torch.randn(d, ff, device=dev, dtype=torch.bfloat16) * 0.02
gy = torch.randn(T, ff, device=dev, dtype=torch.bfloat16)
fl = 2 * T * d * ff
bench("linear xl w1: (2048,1600) @ (6400,1600)^T", lambda: F.linear(x, w1), fl)
bench("linear xl w2: (2048,6400) @ (1600,6400)^T", lambda: F.linear(h, w2), fl)
bench("linear xl w1 backward dx: (2048,6400) @ (6400,1600)", lambda: gy @ w1, fl)
bench("linear xl w1 backward dw: (2048,6400)^T @ (2048,1600)", lambda: gy.t() @ x, fl)

for V in (10000, 50257):
    for dt, es in ((torch.bfloat16, 2), (torch.float32, 4)):
        Nr = 2048
        lg = (torch.randn(Nr, V, device=dev) * 2).to(dt)
        t = torch.randint(0, V, (Nr,), device=dev)
        name = "bf16" if dt == torch.bfloat16 else "f32"
        bench(f"cross_entropy fwd ({Nr} x {V}) {name}", lambda: F.cross_entropy(lg, t), None, Nr * V * es)
        lgg = lg.detach().requires_grad_(True)

        def fb():
            lgg.grad = None
            F.cross_entropy(lgg, t).backward()
        bench(f"cross_entropy fwd+bwd ({Nr} x {V}) {name}", fb, None, 3 * Nr * V * es)

for dt, es in ((torch.bfloat16, 2), (torch.float32, 4)):
    Nr, D = 2048, 1600
    xx = torch.randn(Nr, D, device=dev, dtype=dt)
    ww = torch.randn(D, device=dev, dtype=dt)
    name = "bf16" if dt == torch.bfloat16 else "f32"
    bench(f"rmsnorm fwd ({Nr} x {D}) {name}", lambda: F.rms_norm(xx, (D,), ww, 1e-5), None, 2 * Nr * D * es)
    xg, wg = xx.detach().requires_grad_(True), ww.detach().requires_grad_(True)
    g = torch.randn(Nr, D, device=dev, dtype=dt)

    def rb():
        xg.grad = None; wg.grad = None
        F.rms_norm(xg, (D,), wg, 1e-5).backward(g)
    bench(f"rmsnorm fwd+bwd ({Nr} x {D}) {name}", rb, None, 6 * Nr * D * es)

sa, sb = torch.randn(2048, 6400, device=dev, dtype=torch.bfloat16), torch.randn(2048, 6400, device=dev, dtype=torch.bfloat16)
bench("swiglu fwd (2048 x 6400) bf16 (silu(a) * b, 2 kernels)", lambda: F.silu(sa) * sb, None, 3 * 2 * 2048 * 6400)

ew = torch.randn(50257, 768, device=dev)
ids = torch.randint(0, 50257, (8192,), device=dev)
bench("embedding fwd 8192 x 768 f32", lambda: F.embedding(ids, ew), None, 2 * 8192 * 768 * 4)
ewg = ew.detach().requires_grad_(True)
eg = torch.randn(8192, 768, device=dev)


def eb():
    ewg.grad = None
    F.embedding(ids, ewg).backward(eg)
bench("embedding fwd+bwd (dense 50257x768 grad) f32", eb, None, (3 * 8192 * 768 + 50257 * 768) * 4)

ps = [torch.randn(1240000, device=dev, requires_grad=True) for _ in range(100)]
for p in ps:
    p.grad = torch.randn_like(p)
for fused in (True, False):
    opt = torch.optim.AdamW(ps, lr=1e-4, fused=fused, foreach=None if fused else True)
    bench(f"AdamW step 124M f32 params (100 tensors) {'fused' if fused else 'foreach'}", opt.step, None, 28 * 124e6)
bench("clip_grad_norm 124M f32", lambda: torch.nn.utils.clip_grad_norm_(ps, 1e9), None, 4 * 124e6)

print(f"\nPyTorch {torch.__version__} on {torch.cuda.get_device_name()}; median of {reps} calls (ms)\n")
print("| op | ms | TFLOP/s | GB/s |")
print("|---|---|---|---|")
for r in rows:
    print(r)
