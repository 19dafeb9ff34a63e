--- ember.nn.GPT2: a GPT-2-style decoder (post-2019 layout: pre-norm
-- LayerNorm, learned positions, GELU (tanh) MLP, dropout, weights tied
-- between the token embedding and the output head), built only from public
-- modules and ops — the proof that the op set composes beyond the LLaMA-style
-- TransformerLM. Parameter names follow Hugging Face's GPT-2 (wte, wpe,
-- h.{i}.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}, ln_f),
-- with nn.Linear's (out, in) weights where GPT-2's Conv1D stores (in, out).
--
--   local m = nn.GPT2{vocab_size = 50257, context_length = 1024, d_model = 768,
--                     num_layers = 12, num_heads = 12, dropout = 0.1}
--   local logits = m(ids)          -- ids (B, T) integer -> (B, T, vocab)
--
-- Initialisation as GPT-2: N(0, 0.02) weights, zero biases, the residual
-- projections (attn.c_proj, mlp.c_proj) at 0.02 / sqrt(2 · num_layers).
-- Attention dropout is not applied (the flash kernels have none); dropout
-- acts on the embeddings and on each residual branch, in train() mode only.
-- @module ember.nn.gpt2

local util = require "ember.util"
local F = require "ember.functional"
local module = require "ember.nn.module"
local ModuleList = require("ember.nn.container").ModuleList
local Linear = require "ember.nn.linear"
local Embedding = require "ember.nn.embedding"
local LayerNorm = require "ember.nn.layer_norm"
local Dropout = require "ember.nn.dropout"

local fmt = string.format
local Module, CTOR_LEVEL = module.Module, module.CTOR_LEVEL
local M = {}

--- Causal self-attention with one fused q/k/v projection (c_attn) and its
-- output projection (c_proj).
local GPT2Attention = Module:extend("GPT2Attention")
M.GPT2Attention = GPT2Attention

function GPT2Attention:__init(d_model, num_heads, opts)
  self.num_heads, self.d_head = num_heads, d_model // num_heads
  self.c_attn = Linear(d_model, 3 * d_model, opts)
  self.c_proj = Linear(d_model, d_model, opts)
end

function GPT2Attention:forward(x)
  local B, T, D = x.shape[1], x.shape[2], x.shape[3]
  local H, dh = self.num_heads, self.d_head
  local qkv = self.c_attn(x):view(B, T, 3, H, dh)
  local q, k, v = qkv:select(2, 0), qkv:select(2, 1), qkv:select(2, 2)        -- (B, T, H, dh)
  local o = F.scaled_dot_product_attention(q:transpose(1, 2), k:transpose(1, 2), v:transpose(1, 2),
                                           {causal = true})                   -- (B, H, T, dh)
  return self.c_proj(o:transpose(1, 2):reshape(B, T, D))
end

--- The MLP: c_fc (d -> d_ff), GELU with the tanh approximation, c_proj back.
local GPT2MLP = Module:extend("GPT2MLP")
M.GPT2MLP = GPT2MLP

function GPT2MLP:__init(d_model, d_ff, opts)
  self.c_fc = Linear(d_model, d_ff, opts)
  self.c_proj = Linear(d_ff, d_model, opts)
end

function GPT2MLP:forward(x) return self.c_proj(F.gelu(self.c_fc(x), {approximate = "tanh"})) end

--- One block: x + drop(attn(ln_1(x))), then x + drop(mlp(ln_2(x))).
local GPT2Block = Module:extend("GPT2Block")
M.GPT2Block = GPT2Block

function GPT2Block:__init(d_model, num_heads, d_ff, dropout, opts)
  local nopts = {eps = opts.eps, dtype = opts.dtype, device = opts.device}
  self.ln_1 = LayerNorm(d_model, nopts)
  self.attn = GPT2Attention(d_model, num_heads, opts)
  self.ln_2 = LayerNorm(d_model, nopts)
  self.mlp = GPT2MLP(d_model, d_ff, opts)
  self.drop = Dropout(dropout)
end

function GPT2Block:forward(x)
  x = x + self.drop(self.attn(self.ln_1(x)))
  return x + self.drop(self.mlp(self.ln_2(x)))
end

--- The model.
-- @tparam table cfg vocab_size, context_length, d_model, num_layers,
--   num_heads; d_ff (4 · d_model), dropout (0), eps (1e-5), dtype, device
local GPT2 = Module:extend("GPT2")
M.GPT2 = GPT2

local function check_cfg(fname, cfg)
  if type(cfg) ~= "table" then
    error(fmt("%s: expected a config table, got %s", fname, type(cfg)), CTOR_LEVEL + 1)
  end
  for _, k in ipairs({"vocab_size", "context_length", "d_model", "num_layers", "num_heads"}) do
    util.check_positive_int(fname, "cfg." .. k, cfg[k], CTOR_LEVEL + 1)
  end
  if cfg.d_model % cfg.num_heads ~= 0 then
    error(fmt("%s: expected d_model divisible by num_heads, got d_model %d and num_heads %d", fname,
              cfg.d_model, cfg.num_heads), CTOR_LEVEL + 1)
  end
  local p = cfg.dropout or 0
  if type(p) ~= "number" or p < 0 or p >= 1 then
    error(fmt("%s: expected cfg.dropout in [0, 1), got %s", fname, tostring(cfg.dropout)), CTOR_LEVEL + 1)
  end
end

function GPT2:__init(cfg)
  local fname = "ember.nn.GPT2"
  check_cfg(fname, cfg)
  self.cfg = cfg
  local d, L = cfg.d_model, cfg.num_layers
  local opts = {dtype = cfg.dtype, device = cfg.device, eps = cfg.eps}
  self.wte = Embedding(cfg.vocab_size, d, opts)
  self.wpe = Embedding(cfg.context_length, d, opts)
  self.drop = Dropout(cfg.dropout or 0)
  local blocks = {}
  for i = 1, L do blocks[i] = GPT2Block(d, cfg.num_heads, cfg.d_ff or 4 * d, cfg.dropout or 0, opts) end
  self.h = ModuleList(blocks)
  self.ln_f = LayerNorm(d, {eps = cfg.eps, dtype = cfg.dtype, device = cfg.device})
  self:_init_weights(0.02, 0.02 / math.sqrt(2 * L))
end

-- GPT-2's initialisation, in place (the parameters an optimizer will hold).
function GPT2:_init_weights(std, proj_std)
  local ember = require "ember"
  ember.no_grad(function()
    for _, np in ipairs(self:named_parameters()) do
      local name, p = np[1], np[2]
      if name:match("%.bias$") then
        if not name:match("^ln_") and not name:match("%.ln_") then p:zero_() end
      elseif not name:match("ln_") then
        p:normal_(0, name:match("c_proj%.weight$") and proj_std or std)
      end
    end
  end)
end

--- ids (B, T) or (T) integer tensor -> logits (B, T, vocab_size) (or (T, vocab_size)).
function GPT2:forward(ids)
  local ember = require "ember"
  local one = ids.ndim == 1
  if one then ids = ids:unsqueeze(0) end
  local T = ids.shape[2]
  if T > self.cfg.context_length then
    error(fmt("ember.nn.GPT2: expected at most context_length = %d tokens, got %d", self.cfg.context_length, T), 2)
  end
  local pos = ember.arange(T, {device = ids.device})
  local x = self.drop(self.wte(ids) + self.wpe(pos))
  for _, block in ipairs(self.h) do x = block(x) end
  local logits = F.linear(self.ln_f(x), self.wte.weight)     -- tied output head
  return one and logits:squeeze(0) or logits
end

function GPT2:extra_repr()
  local c = self.cfg
  return fmt("vocab_size=%d, context_length=%d, d_model=%d, num_layers=%d, num_heads=%d, dropout=%s",
             c.vocab_size, c.context_length, c.d_model, c.num_layers, c.num_heads, tostring(c.dropout or 0))
end

return M
