--- ember.nn.RMSNorm (torch/nn/modules/normalization.py): one fused F.rmsnorm
-- call, computed in f32 whatever the input dtype (engine/ops/norm.c).
-- @module ember.nn.norm

local F = require "ember.functional"
local module = require "ember.nn.module"

--- x / sqrt(mean(x²) + eps) * weight over the last dim, in f32; weight ones.
-- @type RMSNorm
local RMSNorm = module.Module:extend("RMSNorm")

function RMSNorm:__init(d, opts)
  module.init_norm(self, "ember.nn.RMSNorm", d, opts)
end

--- norm(x), or with a residual r: s = x + r and norm(s), returned as s, y
-- (F.add_rmsnorm: the add fused into the norm's kernel).
function RMSNorm:forward(x, r)
  if r ~= nil then return F.add_rmsnorm(x, r, self.weight, self.eps) end
  return F.rmsnorm(x, self.weight, self.eps)
end

RMSNorm.extra_repr = module.norm_repr

return RMSNorm
