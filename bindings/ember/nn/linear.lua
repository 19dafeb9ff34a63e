--- ember.nn.Linear: y = x Wᵀ + b (torch/nn/modules/linear.py).
-- W is (out, in), as PyTorch stores it, so checkpoints load unchanged;
-- forward is one fused F.linear call (matmul + bias in the core).
-- @module ember.nn.linear

local F = require "ember.functional"
local module = require "ember.nn.module"
local parameter = require "ember.nn.parameter"

local fmt = string.format
local new_param = parameter.new

--- y = x Wᵀ + b, W (out, in) initialised truncated normal with
-- std sqrt(2/(in+out)) cut at ±3 std; b (out) zeros.
-- @type Linear
-- @tparam integer in_features
-- @tparam integer out_features
-- @tparam[opt] table opts `bias` (default true), `dtype`, `device`
local Linear = module.Module:extend("Linear")

function Linear:__init(in_features, out_features, opts)
  opts = module.check_ctor("ember.nn.Linear", opts, "in_features", in_features, "out_features", out_features)
  self.in_features, self.out_features = in_features, out_features
  local std = math.sqrt(2 / (in_features + out_features))
  self.weight = new_param({out_features, in_features}, opts.dtype, opts.device,
    function(t) t:trunc_normal_(0, std, -3 * std, 3 * std) end)
  if opts.bias ~= false then
    self.bias = new_param({out_features}, opts.dtype, opts.device,
      function(t) t:zero_() end)
  end
end

function Linear:forward(x)
  return F.linear(x, self.weight, self.bias)
end

function Linear:extra_repr()
  return fmt("in_features=%d, out_features=%d, bias=%s", self.in_features,
    self.out_features, self.bias ~= nil and "True" or "False")
end

return Linear
