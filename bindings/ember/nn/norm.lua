--- ember.nn.RMSNorm (torch/nn/modules/normalization.py): one fused F.rmsnorm
-- call, computed in f32 whatever the input dtype (engine/ops/norm.c).
-- @module ember.nn.norm

local F = require "ember.functional"
local util = require "ember.util"
local module = require "ember.nn.module"
local parameter = require "ember.nn.parameter"

local fmt = string.format
local CTOR_LEVEL = module.CTOR_LEVEL

--- x / sqrt(mean(x²) + eps) * weight over the last dim, in f32; weight ones.
-- @type RMSNorm
local RMSNorm = module.Module:extend("RMSNorm")

function RMSNorm:__init(d, opts)
  util.check_positive_int("ember.nn.RMSNorm", "d", d, CTOR_LEVEL)
  opts = util.check_opts("ember.nn.RMSNorm", opts, CTOR_LEVEL)
  self.d, self.eps = d, opts.eps or 1e-5
  self.weight = parameter.new({d}, opts.dtype, opts.device, function(t) t:fill_(1) end)
end

function RMSNorm:forward(x)
  return F.rmsnorm(x, self.weight, self.eps)
end

function RMSNorm:extra_repr()
  return fmt("(%d,), eps=%s", self.d, util.float_repr(self.eps))
end

return RMSNorm
