--- ember.nn.LayerNorm (torch/nn/modules/normalization.py): one fused
-- F.layer_norm call over the last dim, computed in f32 whatever the input
-- dtype (engine/ops/norm.c).
-- @module ember.nn.layer_norm

local F = require "ember.functional"
local module = require "ember.nn.module"
local parameter = require "ember.nn.parameter"

--- (x - mean) / sqrt(var + eps) * weight + bias over the last dim; weight
-- ones, bias zeros. opts: eps (1e-5), bias (true), dtype, device.
-- @type LayerNorm
local LayerNorm = module.Module:extend("LayerNorm")

function LayerNorm:__init(d, opts)
  opts = module.init_norm(self, "ember.nn.LayerNorm", d, opts)
  if opts.bias ~= false then
    self.bias = parameter.new({d}, opts.dtype, opts.device, function(t) t:fill_(0) end)
  end
end

function LayerNorm:forward(x)
  return F.layer_norm(x, self.d, self.weight, self.bias, self.eps)
end

LayerNorm.extra_repr = module.norm_repr

return LayerNorm
