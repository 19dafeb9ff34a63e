"""The reference TransformerLM in PyTorch: the parameter names and math of docs/api.md §5 (TransformerLM),
so an Ember safetensors checkpoint loads with no renaming (tests/reference)
and bench/pytorch_baseline.py times the same model Ember runs.

  pre-norm blocks  x = x + attn(ln1(x));  x = x + ffn(ln2(x))
  logits           lm_head(ln_final(x))
  RMSNorm          x / sqrt(mean(x^2) + eps) * weight, in f32 (eps 1e-5)
  attention        heads are contiguous slices of d_model; RoPE on q and k,
                   rotating adjacent pairs (x[2j], x[2j+1]) by
                   pos * theta^(-2j/d_head); softmax(q k^T / sqrt(d_head) + causal) v
  FFN              w2(silu(w1 x) * w3 x)
  no biases; Linear weights are (out, in)

Dtypes under torch.autocast(bf16) follow Ember's autocast: RMSNorm computes
and returns f32, RoPE computes in f32 and returns its input's dtype.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {  # d_model, d_ff, num_layers, num_heads
    "tiny": (64, 192, 2, 4),
    "small": (768, 3072, 12, 12),
    "medium": (1024, 4096, 24, 16),
    "large": (1280, 5120, 36, 20),
    "xl": (1600, 6400, 48, 25),
    "2.7b": (2560, 10240, 32, 32),
}


def count_parameters(vocab, d_model, d_ff, layers):
    """2·V·D + L·(4·D² + 3·D·F + 2·D) + D, as nn.count_parameters in Ember."""
    return 2 * vocab * d_model + layers * (4 * d_model * d_model + 3 * d_model * d_ff + 2 * d_model) + d_model


def _trunc_normal_(w, std):
    nn.init.trunc_normal_(w, mean=0.0, std=std, a=-3 * std, b=3 * std)


class Linear(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        _trunc_normal_(self.weight, math.sqrt(2.0 / (d_in + d_out)))

    def forward(self, x):
        return F.linear(x, self.weight)


class Embedding(nn.Module):
    def __init__(self, n, d):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, d))
        _trunc_normal_(self.weight, 1.0)

    def forward(self, ids):
        return F.embedding(ids, self.weight)


def _compute_dtype(t):
    """f32 for half inputs (autocast), the input's own dtype for f32 / f64."""
    return torch.promote_types(t.dtype, torch.float32)


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        x = x.to(_compute_dtype(x))
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.to(x.dtype)


def rope(x, pos, theta):
    """Rotate adjacent pairs of the last dim of x (..., T, d) by pos·theta^(-2j/d)."""
    d, ct = x.shape[-1], _compute_dtype(x)
    inv = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=ct) / d)
    ang = pos.to(ct)[:, None] * inv[None, :]                     # (T, d/2)
    cos, sin = torch.cos(ang), torch.sin(ang)
    xf = x.to(ct)
    x0, x1 = xf[..., 0::2], xf[..., 1::2]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
    return out.to(x.dtype)


def naive_attention(q, k, v):
    T = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)
    return p.to(v.dtype) @ v


def sdpa_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, num_heads, theta, attn):
        super().__init__()
        self.num_heads, self.theta, self.attn = num_heads, theta, attn
        self.q_proj = Linear(d_model, d_model)
        self.k_proj = Linear(d_model, d_model)
        self.v_proj = Linear(d_model, d_model)
        self.output_proj = Linear(d_model, d_model)

    def forward(self, x, pos):
        B, T, D = x.shape
        H = self.num_heads

        def heads(t):
            return t.view(B, T, H, D // H).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        q, k = rope(q, pos, self.theta), rope(k, pos, self.theta)
        y = self.attn(q, k, v).transpose(1, 2).reshape(B, T, D)
        return self.output_proj(y)


class SwiGLU(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1 = Linear(d_model, d_ff)
        self.w2 = Linear(d_ff, d_model)
        self.w3 = Linear(d_model, d_ff)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, theta, attn):
        super().__init__()
        self.ln1 = RMSNorm(d_model)
        self.attn = CausalSelfAttention(d_model, num_heads, theta, attn)
        self.ln2 = RMSNorm(d_model)
        self.ffn = SwiGLU(d_model, d_ff)

    def forward(self, x, pos):
        x = x + self.attn(self.ln1(x), pos)
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, d_ff, num_layers, num_heads,
                 rope_theta=10000.0, attn="sdpa"):
        super().__init__()
        fn = {"sdpa": sdpa_attention, "naive": naive_attention}[attn]
        self.context_length = context_length
        self.token_embeddings = Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(
            Block(d_model, num_heads, d_ff, rope_theta, fn) for _ in range(num_layers))
        self.ln_final = RMSNorm(d_model)
        self.lm_head = Linear(d_model, vocab_size)

    def forward(self, ids):
        T = ids.shape[-1]
        pos = torch.arange(T, device=ids.device)
        x = self.token_embeddings(ids)
        for block in self.layers:
            x = block(x, pos)
        return self.lm_head(self.ln_final(x))


class WithLoss(nn.Module):
    """model + mean cross-entropy, so torch.compile sees (and fuses) the loss too."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, x, y):
        logits = self.lm(x)
        logits = logits.reshape(-1, logits.shape[-1])
        return F.cross_entropy(logits.to(_compute_dtype(logits)), y.reshape(-1))
