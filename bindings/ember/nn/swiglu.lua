--- ember.nn.SwiGLU: the LLaMA feed-forward, w2(silu(w1 x) ⊙ w3 x), with the
-- gate fused in one F.swiglu call (engine/ops/swiglu.c).
-- @module ember.nn.swiglu

local F = require "ember.functional"
local module = require "ember.nn.module"
local Linear = require "ember.nn.linear"

--- SwiGLU feed-forward: w2(silu(w1 x) ⊙ w3 x), no biases.
-- @type SwiGLU
local SwiGLU = module.Module:extend("SwiGLU")

function SwiGLU:__init(d_model, d_ff, opts)
  opts = module.check_ctor("ember.nn.SwiGLU", opts, "d_model", d_model, "d_ff", d_ff)
  local lopts = {bias = false, dtype = opts.dtype, device = opts.device}
  self.w1 = Linear(d_model, d_ff, lopts)
  self.w2 = Linear(d_ff, d_model, lopts)
  self.w3 = Linear(d_model, d_ff, lopts)
end

function SwiGLU:forward(x)
  return self.w2(F.swiglu(self.w1(x), self.w3(x)))
end

return SwiGLU
