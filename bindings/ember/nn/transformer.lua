--- ember.nn.TransformerBlock and the reference TransformerLM (LLaMA-style,
-- pre-norm, RoPE, SwiGLU, untied lm_head), with the parameter names of the
-- reference checkpoints (token_embeddings, layers.{i}.{ln1,attn,ln2,ffn},
-- ln_final, lm_head).
--
-- The RoPE positions are built once per forward pass (cached per length and
-- device in the first block's RotaryEmbedding) and handed to every block.
-- @module ember.nn.transformer

local util = require "ember.util"
local module = require "ember.nn.module"
local ModuleList = require("ember.nn.container").ModuleList
local Linear = require "ember.nn.linear"
local Embedding = require "ember.nn.embedding"
local RMSNorm = require "ember.nn.norm"
local SwiGLU = require "ember.nn.swiglu"
local attention = require "ember.nn.attention"
local configs = require "ember.nn.configs"
local KVCache = require("ember.nn.kv_cache").KVCache
local context = require "ember.context"
local core = require "ember.core"

local fmt = string.format
local Module, CTOR_LEVEL = module.Module, module.CTOR_LEVEL
local CausalSelfAttention, resolve_attn_fn = attention.CausalSelfAttention,
  attention.resolve_attn_fn
local is_tensor, shape_str, no_grad = util.is_tensor, util.shape_str, util.no_grad
local M = {}

--- Pre-norm Transformer block: x + attn(ln1(x)), then x + ffn(ln2(x)).
-- @type TransformerBlock
-- @tparam integer d_model
-- @tparam integer num_heads
-- @tparam integer d_ff
-- @tparam[opt] table opts as CausalSelfAttention's, plus `eps`
local TransformerBlock = Module:extend("TransformerBlock")
M.TransformerBlock = TransformerBlock

-- The norms' out_dtype: under autocast ln1, ln2 and ln_final give y in the
-- region's dtype, written by the norm kernel, since their only consumers are
-- linears (q/k/v_proj, w1/w3, lm_head) that would cast y anyway: no cast
-- pass, half the norm's write. The same values and gradients bit for bit
-- (y's gradient is still summed in f32, F.rmsnorm's out_dtype).
-- EMBER_NORM_OUT16=0 (read at start): f32 y and the linears' casts, as before.
local NORM_OUT = core.norm_out16() and "autocast" or nil

function TransformerBlock:__init(d_model, num_heads, d_ff, opts)
  opts = util.check_opts("ember.nn.TransformerBlock", opts, CTOR_LEVEL)
  local nopts = {eps = opts.eps, dtype = opts.dtype, device = opts.device, out_dtype = NORM_OUT}
  self.ln1 = RMSNorm(d_model, nopts)
  self.attn = CausalSelfAttention(d_model, num_heads, opts)
  self.ln2 = RMSNorm(d_model, nopts)
  self.ffn = SwiGLU(d_model, d_ff, opts)
end

function TransformerBlock:forward(x, pos, kv)
  local s, f = self:forward_residual(x, nil, pos, kv)
  return s + f
end

--- The block on the residual stream x with a branch output r not yet added
-- (nil: none). Returns (s, f), the block's output being s + f: each add that
-- an RMSNorm reads straight back is fused into it (F.add_rmsnorm: r's add
-- into ln1, the attention branch's into ln2), and f's add is left to whoever
-- norms next (the next block's ln1, ln_final). Same values as forward.
function TransformerBlock:forward_residual(x, r, pos, kv)
  local h
  if r == nil then h = self.ln1(x) else x, h = self.ln1(x, r) end
  x, h = self.ln2(x, self.attn(h, pos, kv))
  return x, self.ffn(h)
end

-- block:forward_residual(...) inside the block's module path when a
-- measurement tool tracks paths (as block(...) would be).
local function block_residual(block, ...)
  if context.enabled then return context.call_method(block, block.forward_residual, ...) end
  return block:forward_residual(...)
end

-- ln_final(x + r) (r nil: ln_final(x)), the add fused into the norm.
local function final_norm(lm, x, r)
  if r == nil then return lm.ln_final(x) end
  local _, h = lm.ln_final(x, r)
  return h
end

--- LLaMA-style decoder-only language model with the reference names
-- (token_embeddings, layers.{i}.{ln1,attn,ln2,ffn}, ln_final, lm_head).
-- @type TransformerLM
-- @tparam table cfg vocab_size, context_length, d_model, d_ff, num_layers,
--   num_heads, rope_theta (10000), eps (1e-5); optional attn_fn / attn_impl,
--   dtype, device
local TransformerLM = Module:extend("TransformerLM")
M.TransformerLM = TransformerLM

function TransformerLM:__init(cfg)
  local fname = "ember.nn.TransformerLM"
  if type(cfg) ~= "table" then
    error(fname .. ": expected a config table (see nn.configs), got " .. type(cfg), 3)
  end
  for _, k in ipairs(configs.REQUIRED) do
    if not util.is_positive_int(cfg[k]) then
      error(fmt("%s: expected cfg.%s to be a positive integer, got %s", fname, k,
        tostring(cfg[k])), 3)
    end
  end
  if cfg.d_model % cfg.num_heads ~= 0 or (cfg.d_model // cfg.num_heads) % 2 ~= 0 then
    error(fmt("%s: expected d_model divisible by num_heads with an even head size, " ..
      "got d_model %d and num_heads %d", fname, cfg.d_model, cfg.num_heads), 3)
  end
  local config = {}
  for k, v in pairs(cfg) do config[k] = v end
  config.rope_theta = config.rope_theta or 10000
  self.config = config
  self.vocab_size, self.context_length = cfg.vocab_size, cfg.context_length

  local dev, dt = cfg.device, cfg.dtype
  local bopts = {rope_theta = config.rope_theta, max_len = cfg.context_length,
    attn_fn = resolve_attn_fn(fname, cfg, CTOR_LEVEL), eps = cfg.eps, dtype = dt, device = dev}
  self.token_embeddings = Embedding(cfg.vocab_size, cfg.d_model, {dtype = dt, device = dev})
  local layers = ModuleList()
  for _ = 1, cfg.num_layers do
    layers:append(TransformerBlock(cfg.d_model, cfg.num_heads, cfg.d_ff, bopts))
  end
  self.layers = layers
  self.ln_final = RMSNorm(cfg.d_model, {eps = cfg.eps, dtype = dt, device = dev, out_dtype = NORM_OUT})
  self.lm_head = Linear(cfg.d_model, cfg.vocab_size, {bias = false, dtype = dt, device = dev})
end

--- ids (..., T) integer -> logits (..., T, vocab_size). With opts.cache (an
-- nn.KVCache), ids (B, T) are appended to the cache and attend to what it
-- holds (see cached_forward).
function TransformerLM:forward(ids, opts)
  if opts ~= nil then
    local logits = self:cached_forward(ids, opts)   -- not a tail call: error levels count this frame
    return logits
  end
  if not is_tensor(ids) then
    error("ember.nn.TransformerLM: expected token ids as an integer tensor, got " ..
      type(ids), 2)
  end
  local shape = ids.shape
  local T = shape[#shape]
  if #shape < 1 or T > self.context_length then
    error(fmt("ember.nn.TransformerLM: expected ids (..., T) with T <= context_length %d, " ..
      "got shape %s", self.context_length, shape_str(shape)), 2)
  end
  local x = self.token_embeddings(ids)
  local layers = self.layers
  local pos, r
  for i = 1, #layers do
    local block = layers[i]
    if pos == nil and block.attn.rope then pos = block.attn.rope:positions(T, ids.device) end
    x, r = block_residual(block, x, r, pos)
  end
  return self.lm_head(final_norm(self, x, r))
end

local CACHED_FORWARD_LEVEL = 3   -- error(): the caller of forward (cached_forward <- forward <- caller)

--- forward(ids, {cache = kv}): ids (B, T) appended to the KVCache kv at
-- positions kv.len .. kv.len + T - 1, attending to every cached position;
-- returns logits (B, T, vocab_size) and advances kv. Runs without autograd.
-- The uncached forward above is untouched by this (training path).
function TransformerLM:cached_forward(ids, opts)
  local fname = "ember.nn.TransformerLM"
  if type(opts) ~= "table" then
    error(fmt("%s: expected an options table {cache = KVCache}, got %s", fname, type(opts)), CACHED_FORWARD_LEVEL)
  end
  for k in pairs(opts) do
    if k ~= "cache" then
      error(fmt("%s: unknown option '%s' (expected cache)", fname, tostring(k)), CACHED_FORWARD_LEVEL)
    end
  end
  local kv = opts.cache
  if getmetatable(kv) ~= KVCache then
    error(fmt("%s: expected opts.cache to be an nn.KVCache, got %s", fname, type(kv)), CACHED_FORWARD_LEVEL)
  end
  if #kv.layers ~= #self.layers then
    error(fmt("%s: expected a KV cache of %d layers (this model's), got %d", fname, #self.layers,
      #kv.layers), CACHED_FORWARD_LEVEL)
  end
  local shape = is_tensor(ids) and ids.shape
  if not shape or #shape ~= 2 or shape[2] < 1 then
    error(fmt("%s: expected ids (B, T) as an integer tensor with a KV cache, got %s", fname,
      shape and ("shape " .. shape_str(shape)) or type(ids)), CACHED_FORWARD_LEVEL)
  end
  kv:check_append(fname, shape[1], shape[2], CACHED_FORWARD_LEVEL)
  local logits = no_grad(function()
    local pos = kv:begin_step(shape[2])
    local x = self.token_embeddings(ids)
    local layers, r = self.layers, nil
    for i = 1, #layers do x, r = block_residual(layers[i], x, r, pos, kv.layers[i]) end
    return self.lm_head(final_norm(self, x, r))
  end)
  kv:end_step()
  return logits
end

--- Replace the attention function of every block (e.g. a flash kernel).
-- @param fn function(q, k, v) on (B, H, T, d_head), or "auto" / "naive" / "flash"
-- @return self
function TransformerLM:set_attn_fn(fn)
  local fname = "ember.nn.TransformerLM.set_attn_fn"
  local f = resolve_attn_fn(fname, type(fn) == "string" and {attn_impl = fn} or {attn_fn = fn}, 3)
  for _, m in ipairs(self:modules()) do
    if getmetatable(m) == CausalSelfAttention then m.attn_fn = f end
  end
  return self
end

return M
