--- ember.nn.LayerNorm (torch/nn/modules/normalization.py): one fused
-- F.layer_norm call over the last dim, computed in f32 whatever the input
-- dtype (engine/ops/norm.c).
-- @module ember.nn.layer_norm

local F = require "ember.functional"
local util = require "ember.util"
local module = require "ember.nn.module"
local parameter = require "ember.nn.parameter"

local fmt = string.format
local CTOR_LEVEL = module.CTOR_LEVEL

--- (x - mean) / sqrt(var + eps) * weight + bias over the last dim; weight
-- ones, bias zeros. opts: eps (1e-5), bias (true), dtype, device.
-- @type LayerNorm
local LayerNorm = module.Module:extend("LayerNorm")

function LayerNorm:__init(d, opts)
  util.check_positive_int("ember.nn.LayerNorm", "d", d, CTOR_LEVEL)
  opts = util.check_opts("ember.nn.LayerNorm", opts, CTOR_LEVEL)
  self.d, self.eps = d, opts.eps or 1e-5
  self.weight = parameter.new({d}, opts.dtype, opts.device, function(t) t:fill_(1) end)
  if opts.bias ~= false then
    self.bias = parameter.new({d}, opts.dtype, opts.device, function(t) t:fill_(0) end)
  end
end

function LayerNorm:forward(x)
  return F.layer_norm(x, self.d, self.weight, self.bias, self.eps)
end

function LayerNorm:extra_repr()
  return fmt("(%d,), eps=%s", self.d, util.float_repr(self.eps))
end

return LayerNorm
