-- layer_norm_spec.lua — F.layer_norm and nn.LayerNorm on the CPU: PyTorch's
-- layer_norm over the last dim (biased variance, eps 1e-5), checked against
-- the formula written with elementwise ops, gradients against finite
-- differences (f64), autocast (computes in f32) and the argument checks.

local ember = require "ember"
local F, nn = ember.nn.functional, ember.nn

-- (x - mean) / sqrt(var + eps) * w + b with the engine's elementwise ops
local function reference(x, w, b, eps)
  local m = x:mean(-1, {keepdim = true})
  local d = x - m
  local y = d / ((d * d):mean(-1, {keepdim = true}) + (eps or 1e-5)):sqrt()
  if w then y = y * w end
  if b then y = y + b end
  return y
end

local function max_diff(a, b) return (a - b):abs():max():item() end

describe("F.layer_norm", function()
  it("matches the formula over (2,3,8) in f64 (weight and bias)", function()
    local x, w, b = ember.randn({2, 3, 8}, {dtype = "f64"}), ember.randn({8}, {dtype = "f64"}),
      ember.randn({8}, {dtype = "f64"})
    assert.is_true(max_diff(F.layer_norm(x, 8, w, b), reference(x, w, b)) < 1e-12)
  end)

  it("matches the formula in f32 without weight or bias (tolerance: f32 rounding)", function()
    local x = ember.randn({4, 16})
    local y = F.layer_norm(x, {16})
    assert.are.equal("f32", y.dtype)
    assert.is_true(max_diff(y, reference(x)) < 1e-5)
  end)

  it("normalizes over several trailing dims with a longer normalized_shape", function()
    local x = ember.randn({2, 3, 4}, {dtype = "f64"})
    local y = F.layer_norm(x, {3, 4})
    local r = reference(x:reshape({2, 12})):reshape({2, 3, 4})
    assert.is_true(max_diff(y, r) < 1e-12)
  end)

  it("has gradients that agree with finite differences (f64)", function()
    local x = ember.randn({3, 5}, {dtype = "f64", requires_grad = true})
    local w = ember.randn({5}, {dtype = "f64", requires_grad = true})
    local b = ember.randn({5}, {dtype = "f64", requires_grad = true})
    assert.is_true(ember.autograd.gradcheck(function(a, c, d) return F.layer_norm(a, 5, c, d) end, {x, w, b}))
    assert.is_true(ember.autograd.gradcheck(function(a, d) return F.layer_norm(a, 5, nil, d) end, {x, b}))
  end)

  it("computes in f32 under autocast and returns f32", function()
    local x = ember.randn({2, 8}):to("bf16")
    local y = ember.autocast("bf16", function() return F.layer_norm(x, 8) end)
    assert.are.equal("f32", y.dtype)
  end)

  it("names the op and the shapes when weight does not match the last dim", function()
    local x = ember.randn({2, 8})
    assert.error_matches(function() F.layer_norm(x, 8, ember.ones({7})) end,
      "layer_norm: expected weight of shape [8] (x's last dim), got [7] (x has shape [2, 8])", 1, true)
    assert.error_matches(function() F.layer_norm(x, 6) end, "does not match x's trailing dims", 1, true)
  end)
end)

describe("nn.LayerNorm", function()
  it("starts as weight ones, bias zeros and normalizes each row", function()
    local m = nn.LayerNorm(6)
    local x = ember.randn({3, 6})
    assert.is_true(max_diff(m(x), reference(x)) < 1e-5)
    assert.are.equal(2, #m:parameters())
  end)

  it("drops the bias with {bias = false}", function()
    local m = nn.LayerNorm(4, {bias = false})
    assert.is_nil(m.bias)
  end)
end)
