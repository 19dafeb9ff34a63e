--- ember.nn.CausalSelfAttention: multi-head causal self-attention with RoPE
-- (the reference model's attention), and how an attention function is chosen.
--
-- The attention itself is a plain function attn_fn(q, k, v) on (B, H, T,
-- d_head) tensors, chosen once at construction ("auto", "naive", "flash" or
-- the user's own), so a forward pass calls it directly and a benchmark can
-- swap it (TransformerLM:set_attn_fn).
-- @module ember.nn.attention

local F = require "ember.functional"
local core = require "ember.core"
local util = require "ember.util"
local module = require "ember.nn.module"
local Linear = require "ember.nn.linear"
local RotaryEmbedding = require "ember.nn.rope"

local fmt = string.format
local CTOR_LEVEL = module.CTOR_LEVEL
local M = {}

local ATTN_IMPLS = {}
for _, impl in ipairs({"auto", "naive", "flash"}) do
  local opts = {causal = true, impl = impl}
  ATTN_IMPLS[impl] = function(q, k, v) return F.scaled_dot_product_attention(q, k, v, opts) end
end

-- EMBER_ATTN_ROPE=fused: where the attention is flash (attn_impl "flash", or
-- "auto" where flash applies) and the rope the stock RotaryEmbedding, q and k
-- go un-rotated into F.flash_attention's rope option (the rotation inside
-- flash's loads where its fused kernels run: docs/flash.md, "RoPE inside");
-- "separate" (the default) rotates them first (F.rope_qk). The same values.
-- Read once, at the first attention module built.
local ROPE_MODES = {fused = true, separate = true}
local rope_mode
local function attn_rope_mode()
  if rope_mode == nil then
    local v = os.getenv("EMBER_ATTN_ROPE") or "separate"
    if not ROPE_MODES[v] then
      error(fmt("ember.nn: EMBER_ATTN_ROPE must be 'fused' or 'separate', got '%s'", v), 0)
    end
    rope_mode = v
  end
  return rope_mode
end
-- The built-in attention functions that can take the rope inside: whether
-- flash runs for these inputs
local FUSED_ROPE_OK = {
  [ATTN_IMPLS.flash] = function() return true end,
  [ATTN_IMPLS.auto] = function(q, k, v) return core.flash_applies(q, k, v) end,
}

--- The attention function opts asks for: opts.attn_fn (any callable), else
-- the causal SDPA of opts.attn_impl ("auto" by default). `level` is error()'s.
function M.resolve_attn_fn(fname, opts, level)
  if opts.attn_fn ~= nil then
    if not util.is_callable(opts.attn_fn) then
      error(fmt("%s: expected attn_fn to be a function(q, k, v), got %s", fname,
        type(opts.attn_fn)), level)
    end
    return opts.attn_fn
  end
  local fn = ATTN_IMPLS[opts.attn_impl or "auto"]
  if fn then return fn end
  error(fmt("%s: expected attn_impl 'auto', 'naive' or 'flash', got %s", fname,
    tostring(opts.attn_impl)), level)
end

--- Multi-head causal self-attention with RoPE, no biases. Heads are
-- contiguous slices of d_model. The attention itself is `self.attn_fn(q, k,
-- v)` on (B, H, T, d_head) tensors (swap it to benchmark kernels).
-- @type CausalSelfAttention
-- @tparam integer d_model
-- @tparam integer num_heads
-- @tparam[opt] table opts `rope_theta` (default 10000; false turns RoPE
--   off), `max_len`, `attn_fn` or `attn_impl` ("auto", the default: flash on
--   CUDA in bf16/f16 or autocast, naive elsewhere; "naive"; "flash"), `dtype`, `device`
local CausalSelfAttention = module.Module:extend("CausalSelfAttention")
M.CausalSelfAttention = CausalSelfAttention

function CausalSelfAttention:__init(d_model, num_heads, opts)
  local fname = "ember.nn.CausalSelfAttention"
  util.check_positive_int(fname, "d_model", d_model, CTOR_LEVEL)
  util.check_positive_int(fname, "num_heads", num_heads, CTOR_LEVEL)
  if d_model % num_heads ~= 0 then
    error(fmt("%s: expected d_model divisible by num_heads, got %d and %d", fname, d_model,
      num_heads), 3)
  end
  opts = util.check_opts(fname, opts, CTOR_LEVEL)
  self.d_model, self.num_heads, self.d_head = d_model, num_heads, d_model // num_heads
  self.attn_fn = M.resolve_attn_fn(fname, opts, CTOR_LEVEL)
  attn_rope_mode()                                    -- a bad EMBER_ATTN_ROPE fails here, not mid-step
  local lopts = {bias = false, dtype = opts.dtype, device = opts.device}
  self.q_proj = Linear(d_model, d_model, lopts)
  self.k_proj = Linear(d_model, d_model, lopts)
  self.v_proj = Linear(d_model, d_model, lopts)
  self.output_proj = Linear(d_model, d_model, lopts)
  if opts.rope_theta ~= false then
    self.rope = RotaryEmbedding(self.d_head, {theta = opts.rope_theta or 10000,
      max_len = opts.max_len})
  end
end

--- x (..., T, d_model) -> (..., T, d_model); pos optional (T) positions;
-- kv optional: this layer's slot of an nn.KVCache (nn/kv_cache.lua), which
-- stores k and v and attends over the cached keys.
function CausalSelfAttention:forward(x, pos, kv)
  local shape = x.shape
  local nd = #shape
  if nd < 2 or shape[nd] ~= self.d_model then
    error(fmt("ember.nn.CausalSelfAttention: expected input (..., T, %d), got shape %s",
      self.d_model, util.shape_str(shape)), 2)
  end
  local T, H, dh = shape[nd - 1], self.num_heads, self.d_head
  local split = table.move(shape, 1, nd - 1, 1, {})   -- (..., T)
  split[nd], split[nd + 1] = H, dh                    -- (..., T, H, dh)
  local function heads(t)                             -- -> (..., H, T, dh)
    return t:view(table.unpack(split)):transpose(-3, -2)
  end
  local q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
  local rope = self.rope
  if rope then
    pos = pos or rope:positions(T, x.device)
    local fused_ok = not kv and rope_mode == "fused" and rope.forward == RotaryEmbedding.forward
      and FUSED_ROPE_OK[self.attn_fn]
    if fused_ok and fused_ok(q, k, v) then             -- rotated inside flash
      local y = F.flash_attention(q, k, v, true, {rope = {pos = pos, theta = rope.theta}})
      return self.output_proj(y:transpose(-3, -2):reshape(table.unpack(shape)))
    end
    if rope.forward == RotaryEmbedding.forward then
      q, k = rope(q, pos, k)                          -- one node, one launch for both
    else                                              -- a user's rope module: its own forward, once each
      q, k = rope(q, pos), rope(k, pos)
    end
  end
  local y                                             -- (..., H, T, dh)
  if kv then y = kv:attend(q, k, v, self.attn_fn) else y = self.attn_fn(q, k, v) end
  y = y:transpose(-3, -2):reshape(table.unpack(shape))
  return self.output_proj(y)
end

function CausalSelfAttention:extra_repr()
  return fmt("d_model=%d, num_heads=%d", self.d_model, self.num_heads)
end

return M
