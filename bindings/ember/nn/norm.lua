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

function RMSNorm:forward(x)
  return F.rmsnorm(x, self.weight, self.eps)
end

RMSNorm.extra_repr = module.norm_repr

return RMSNorm
