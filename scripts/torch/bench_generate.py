"""scripts/bench_generate.lua in PyTorch: decode tokens/s of the reference TransformerLM
(bench/torch_lm.py) at batch 1, greedy, one .item() per token, in the same three modes:

  graph    a static KV cache; the one-token decode step reads its position from a device
           tensor and is captured once with torch.cuda.graph, then replayed per token
  cache    the same static KV cache, the step run eagerly
  nocache  the whole sequence through model(ids) for every token

  python3 scripts/torch/bench_generate.py --model small --precision bf16
  (bench_generate.lua --torch runs this and prints its figures beside Ember's)

The cached attention is Ember's: prefill is causal SDPA on the prompt's own q, k, v; a decode
step scatters k, v into the cache at `pos` (index_copy_) and attends to all max_len keys with
the keys after `pos` masked. --precision bf16: bf16 weights under torch.autocast(bf16) (the
reference model's RMSNorm returns f32, which autocast casts for the next matmul); amp: f32
weights under autocast; fp32: neither. Prints one JSON line per mode:
{"tool": "torch", "mode":, "decode_tokens_per_s":, "ms_per_token":, "prefill_ms":, ...}.
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
from common import runinfo  # noqa: E402
from torch_lm import CONFIGS, TransformerLM, count_parameters, rope  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Decode tokens/s of the reference TransformerLM at batch 1 in PyTorch.")
    p.add_argument("--model", default="small", choices=list(CONFIGS))
    p.add_argument("--d-model", type=int)
    p.add_argument("--d-ff", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--precision", default="bf16", choices=["bf16", "amp", "fp32"])
    p.add_argument("--modes", default=None, help="comma list of graph, cache, nocache")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--device", default=None)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if a.prompt_len + a.tokens > a.context:
        p.error("--prompt-len + --tokens must fit in --context")
    a.modes = (a.modes or ("graph,cache,nocache" if a.device.startswith("cuda") else "cache,nocache")).split(",")
    for m in a.modes:
        if m not in ("graph", "cache", "nocache"):
            p.error(f"--modes: unknown mode {m!r}")
        if m == "graph" and not a.device.startswith("cuda"):
            p.error("--modes graph needs --device cuda")
    return a


class StaticCache:
    """k, v (1, H, max_len, d_head) per layer; pos: the next position, an i64 device tensor (1)."""

    def __init__(self, model, max_len, dtype, dev):
        blk = model.layers[0].attn
        H, dh = blk.num_heads, blk.q_proj.weight.shape[0] // blk.num_heads
        self.k = [torch.zeros(1, H, max_len, dh, dtype=dtype, device=dev) for _ in model.layers]
        self.v = [torch.zeros(1, H, max_len, dh, dtype=dtype, device=dev) for _ in model.layers]
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.key_index = torch.arange(max_len, device=dev)
        self.len = 0


def cached_forward(model, ids, cache, decode):
    """ids (1, T) appended to the cache: prefill (cache empty, T tokens) or decode (T = 1, position from
    cache.pos, which it moves on; nothing depends on a host value, so it can be captured)."""
    B, T = ids.shape
    x = model.token_embeddings(ids)
    if decode:
        pos = cache.pos
        visible = (cache.key_index <= cache.pos).view(1, 1, 1, -1)   # (1, 1, 1, max_len): keys up to pos (SDPA wants >= 2-D masks)
    else:
        pos = torch.arange(T, device=ids.device)
    for i, blk in enumerate(model.layers):
        a = blk.attn
        h = blk.ln1(x)
        D, H = h.shape[-1], a.num_heads

        def heads(t):
            return t.view(B, T, H, D // H).transpose(1, 2)

        q, k, v = heads(a.q_proj(h)), heads(a.k_proj(h)), heads(a.v_proj(h))
        q, k = rope(q, pos, a.theta), rope(k, pos, a.theta)
        ck, cv = cache.k[i], cache.v[i]
        if decode:
            ck.index_copy_(2, pos, k.to(ck.dtype))
            cv.index_copy_(2, pos, v.to(cv.dtype))
            y = F.scaled_dot_product_attention(q.to(ck.dtype), ck, cv, attn_mask=visible)
        else:
            ck[:, :, :T] = k.to(ck.dtype)
            cv[:, :, :T] = v.to(cv.dtype)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + a.output_proj(y.transpose(1, 2).reshape(B, T, D))
        x = x + blk.ffn(blk.ln2(x))
    if decode:
        cache.pos += 1
    cache.len += T
    return model.lm_head(model.ln_final(x))


def generate(model, prompt, n, mode, autocast, dev):
    """Greedy generation of n tokens: (prefill s, decode s, capture s)."""
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    # no autocast weight cache across a graph capture (PyTorch's advice for graphs)
    ac = (torch.autocast(dev.type, dtype=torch.bfloat16, cache_enabled=mode != "graph") if autocast
          else contextlib.nullcontext())
    cache_dtype = torch.bfloat16 if autocast else model.lm_head.weight.dtype
    capture_s = 0.0
    with torch.no_grad(), ac:
        sync()
        t0 = time.perf_counter()
        ids = torch.tensor([prompt], device=dev)
        if mode == "nocache":
            all_ids = list(prompt)
            nxt_t = model(ids)[:, -1:].argmax(-1)
        else:
            cache = StaticCache(model, len(prompt) + n, cache_dtype, dev)
            nxt_t = cached_forward(model, ids, cache, False)[:, -1:].argmax(-1)   # (1, 1) on the device
            cache.pos.fill_(cache.len)
        nxt = nxt_t.item()
        t1 = time.perf_counter()
        if mode == "graph":
            static_ids = torch.zeros(1, 1, dtype=torch.long, device=dev)
            start = cache.len
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):                          # warm-up on a side stream, as PyTorch advises
                cached_forward(model, static_ids, cache, True)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static_logits = cached_forward(model, static_ids, cache, True)
            cache.pos.fill_(start)
            cache.len = start
            sync()
            capture_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        for _ in range(n - 1):                                  # as ember.generate: feed the device id, read it
            if mode == "nocache":
                all_ids.append(nxt)
                nxt_t = model(torch.tensor([all_ids], device=dev))[:, -1:].argmax(-1)
            elif mode == "graph":
                static_ids.copy_(nxt_t)
                g.replay()
                nxt_t = static_logits[:, -1:].argmax(-1)
            else:
                nxt_t = cached_forward(model, nxt_t, cache, True)[:, -1:].argmax(-1)
            nxt = nxt_t.item()
        t3 = time.perf_counter()
    return t1 - t0, t3 - t2, capture_s


def main(argv=None):
    a = parse_args(argv)
    dev = torch.device(a.device)
    D, FF, L, H = CONFIGS[a.model]
    D, FF, L, H = a.d_model or D, a.d_ff or FF, a.layers or L, a.heads or H
    torch.manual_seed(a.seed)
    model = TransformerLM(a.vocab, a.context, D, FF, L, H).to(dev).eval()
    if a.precision == "bf16":
        model = model.to(torch.bfloat16)
    autocast = a.precision in ("bf16", "amp")
    prompt = torch.randint(0, a.vocab, (a.prompt_len,)).tolist()
    facts = runinfo(dev)
    config = dict(model=a.model, d_model=D, d_ff=FF, layers=L, heads=H, vocab=a.vocab, context=a.context,
                  params=count_parameters(a.vocab, D, FF, L), batch=1, prompt_len=a.prompt_len, tokens=a.tokens,
                  precision=a.precision, warmup=a.warmup, reps=a.reps, seed=a.seed, device_kind=dev.type)
    for mode in a.modes:
        rec = dict(tool="torch", study="generate", mode=mode, config=config, **facts)
        try:
            for _ in range(a.warmup):
                generate(model, prompt, a.tokens, mode, autocast, dev)
            runs = [generate(model, prompt, a.tokens, mode, autocast, dev) for _ in range(a.reps)]
            decode = statistics.median(r[1] for r in runs)
            rec.update(status="ok", decode_tokens_per_s=(a.tokens - 1) / decode,
                       ms_per_token=decode * 1e3 / (a.tokens - 1),
                       prefill_ms=statistics.median(r[0] for r in runs) * 1e3,
                       capture_ms=statistics.median(r[2] for r in runs) * 1e3,
                       samples_tokens_per_s=[(a.tokens - 1) / r[1] for r in runs])
        except torch.cuda.OutOfMemoryError as e:
            rec.update(status="OOM", error=str(e))
        except Exception as e:  # a result line either way: the Lua side prints it
            ours = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.endswith((".py",))
                    and "site-packages" not in f.filename]
            where = f" (at {ours[-1].filename.rsplit('/', 1)[-1]}:{ours[-1].lineno}: {ours[-1].line})" if ours else ""
            rec.update(status="error", error=f"{type(e).__name__}: {e}{where}")
        print(json.dumps(rec), flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
