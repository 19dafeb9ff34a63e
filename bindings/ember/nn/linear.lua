--- ember.nn.Linear: y = x Wᵀ + b (torch/nn/modules/linear.py).
-- W is (out, in), as PyTorch stores it, so checkpoints load unchanged;
-- forward is one fused F.linear call (matmul + bias in the core).
-- @module ember.nn.linear

local F = require "ember.functional"
local core = require "ember.core"
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

--- The outputs of `linears` (a list of Linear modules) on one input x, as
-- calling each would give them: one F.linear_group when
-- ember.backends.fused_proj is on and every module is a bias-free Linear
-- of one shape running Linear.forward (not a user's replacement); else
-- each module called in turn. q, k, v = Linear.group(x, {q_proj, k_proj, v_proj}).
function Linear.group(x, linears)
  local first = linears[1]
  local fuse = core.fused_proj()
  for _, m in ipairs(linears) do
    fuse = fuse and getmetatable(m) == Linear and rawget(m, "forward") == nil and m.bias == nil and
      m.in_features == first.in_features and m.out_features == first.out_features
    if not fuse then break end
  end
  if fuse then
    local ws = {}
    for i, m in ipairs(linears) do ws[i] = m.weight end
    return F.linear_group(x, ws)
  end
  local ys = {}
  for i, m in ipairs(linears) do ys[i] = m(x) end
  return table.unpack(ys, 1, #linears)
end

function Linear:extra_repr()
  return fmt("in_features=%d, out_features=%d, bias=%s", self.in_features,
    self.out_features, self.bias ~= nil and "True" or "False")
end

return Linear
