-- linear_group_spec.lua — F.linear_group and nn.Linear.group (engine/ops/linear_group.c):
-- y_i = x W_iᵀ for weights of one shape sharing x, one op when
-- ember.backends.fused_proj is on and the group's operand is one storage
-- (weights that are adjacent rows of one tensor; under autocast, their
-- shadow weights, regrouped by the first call and written by AdamW), and
-- F.linear once per weight otherwise. Checked on the CPU: which path runs
-- (the outputs' grad_fn), forward values against F.linear, gradients by
-- finite differences (both ways the output gradients can arrive: adjacent
-- slices of one buffer, or separate tensors that the op joins), frozen
-- inputs, the fallbacks (autocast on the CPU among them: the shadow
-- grouping is CUDA's, tests/gpu/linear_group_spec.lua) and bad input.
--
-- Tolerances, and why:
--   * f64 forward: 1e-12 absolute on O(10) values: the grouped gemm sums the
--     same K products as F.linear, in BLAS's order for the batched shape.
--   * gradcheck's defaults (eps 1e-6, atol 1e-5, rtol 1e-3) on f64.
--   * autocast on the CPU falls back: the same bits as the switch off.
local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local nn, F = ember.nn, ember.nn.functional
local core = ember.core or require "ember.core"

local N, K = 6, 5

-- n weights (N, K) as adjacent row slices of one f64 tensor, each a leaf requiring grad
local function adjacent_weights(seed, n)
  local base = H.randn(seed, {n * N, K})
  local ws = {}
  for i = 1, n do
    ws[i] = base:narrow(0, (i - 1) * N, N)
    ws[i].requires_grad = true
  end
  return ws, base
end

local function with_switch(on, fn)
  local prev = ember.backends.fused_proj(on)
  local ok, err = pcall(fn)
  ember.backends.fused_proj(prev)
  if not ok then error(err, 0) end
end

describe("F.linear_group", function()
  it("runs F.linear once per weight with the switch off (same values, a linear node each)", function()
    with_switch(false, function()
      local ws = adjacent_weights(1, 3)
      local x = H.randn(2, {4, K})
      local ys = {F.linear_group(x, ws)}
      assert.are.equal(3, #ys)
      for i = 1, 3 do
        assert.are.equal("linear", ys[i].grad_fn)
        assert.are.equal(0, H.maxdiff(ys[i], F.linear(x, ws[i])))
      end
    end)
  end)

  it("falls back to F.linear when the weights are separate tensors", function()
    with_switch(true, function()
      local ws = {}
      for i = 1, 3 do ws[i] = H.randn(10 + i, {N, K}); ws[i].requires_grad = true end
      local x = H.randn(3, {4, K})
      local ys = {F.linear_group(x, ws)}
      for i = 1, 3 do
        assert.are.equal("linear", ys[i].grad_fn)
        assert.are.equal(0, H.maxdiff(ys[i], F.linear(x, ws[i])))
      end
    end)
  end)

  it("fuses weights that are adjacent rows of one tensor: one node, F.linear's values", function()
    with_switch(true, function()
      local ws = adjacent_weights(4, 3)
      local x = H.randn(5, {2, 3, K})
      local ys = {F.linear_group(x, ws)}
      for i = 1, 3 do
        assert.are.equal("linear_group", ys[i].grad_fn)
        assert.same({2, 3, N}, ys[i].shape)
        assert.is_true(ys[i]:is_contiguous())
        assert.is_true(H.maxdiff(ys[i], F.linear(x, ws[i])) <= 1e-12, "output " .. i)
      end
    end)
  end)

  it("backward matches finite differences when the output gradients are one buffer's slices (cat)", function()
    with_switch(true, function()
      local ws = adjacent_weights(6, 3)
      local x = H.randn(7, {4, K}); x.requires_grad = true
      local function fn(x_, a, b, c)
        local q, k, v = F.linear_group(x_, {a, b, c})
        return ember.cat({q, k, v}, -1), q
      end
      assert.are.equal("linear_group", select(2, fn(x, ws[1], ws[2], ws[3])).grad_fn)
      assert.is_true(ember.autograd.gradcheck(fn, {x, ws[1], ws[2], ws[3]}))
    end)
  end)

  it("backward matches finite differences when the output gradients are separate tensors", function()
    with_switch(true, function()
      local ws = adjacent_weights(8, 2)
      local x = H.randn(9, {2, 3, K}); x.requires_grad = true
      local function fn(x_, a, b)
        local g, u = F.linear_group(x_, {a, b})
        return F.silu(g) * u + g * 0.5, g
      end
      assert.are.equal("linear_group", select(2, fn(x, ws[1], ws[2])).grad_fn)
      assert.is_true(ember.autograd.gradcheck(fn, {x, ws[1], ws[2]}))
    end)
  end)

  it("gives gradients only to the inputs that require them, equal to the per-weight path's", function()
    local function grads(on)
      local ws = adjacent_weights(10, 3)
      ws[2].requires_grad = false
      local x = H.randn(11, {4, K})          -- x requires no grad
      with_switch(on, function()
        local q, k, v = F.linear_group(x, ws)
        local loss = (q * q):sum() + (k * v):sum()
        loss:backward()
      end)
      return ws, x
    end
    local wf, xf = grads(true)
    local wu = grads(false)
    assert.is_nil(xf.grad)
    assert.is_nil(wf[2].grad)
    for _, i in ipairs {1, 3} do
      assert.same({N, K}, wf[i].grad.shape)
      assert.is_true(H.maxdiff(wf[i].grad, wu[i].grad) <= 1e-12, "weight " .. i)
    end
  end)

  it("rejects weights of different shapes, too many weights and a non-list", function()
    with_switch(true, function()
      local x = H.randn(12, {4, K})
      assert.error_matches(function() F.linear_group(x, {H.randn(1, {N, K}), H.randn(2, {N + 1, K})}) end,
        "linear_group: expected every weight to have weight 1's shape %[6, 5%], got %[7, 5%] for weight 2")
      local five = {}
      for i = 1, 5 do five[i] = H.randn(i, {N, K}) end
      assert.error_matches(function() F.linear_group(x, five) end, "linear_group: expected 1 to 4 weights, got 5")
      assert.error_matches(function() F.linear_group(x, H.randn(1, {N, K})) end,
        "linear_group: expected a list of weights, got userdata")
      assert.error_matches(function() F.linear_group(x, {H.randn(1, {N, K + 1})}) end, "linear")
    end)
  end)

  it("refuses a bad EMBER_FUSED_PROJ with a message naming the accepted values", function()
    local script = H.temp_file([[
local ember = require "ember"
ember.nn.functional.linear_group(ember.randn({2, 3}), {ember.randn({4, 3})})
]], ".lua")
    H.switch_refuses(script, "EMBER_FUSED_PROJ", "3", "expected EMBER_FUSED_PROJ to be 0, 1 or 2, got '3'")
    H.remove_temps()
  end)

  it("takes EMBER_FUSED_PROJ=1 and 2 (2: no join in backward) as on, 0 as off", function()
    local script = H.temp_file([[
local ember = require "ember"
local base = ember.randn({8, 3}, {dtype = "f64"})
local a, b = base:narrow(0, 0, 4), base:narrow(0, 4, 4)
a.requires_grad = true; b.requires_grad = true
local y = ember.nn.functional.linear_group(ember.randn({2, 3}, {dtype = "f64"}), {a, b})
print(tostring(ember.backends.fused_proj()) .. " " .. y.grad_fn)
]], ".lua")
    for mode, want in pairs({["0"] = "false linear", ["1"] = "true linear_group", ["2"] = "true linear_group"}) do
      local out, err = H.ember({"run", script}, {env = {EMBER_FUSED_PROJ = mode}})
      assert.are.equal("", err or "", "stderr with EMBER_FUSED_PROJ=" .. mode)
      assert.are.equal(want, (out:gsub("%s+$", "")), "EMBER_FUSED_PROJ=" .. mode)
    end
    H.remove_temps()
  end)

  it("ember.backends.fused_proj returns the previous setting and checks its argument", function()
    local prev = ember.backends.fused_proj(true)
    assert.is_true(ember.backends.fused_proj(prev))
    assert.are.equal(prev, ember.backends.fused_proj())
    assert.error_matches(function() ember.backends.fused_proj("yes") end,
      "ember.backends.fused_proj: expected argument 1 %(on%) to be a boolean, got string")
  end)
end)

-- a small attention + SwiGLU block trained with AdamW under bf16 autocast
local D, HEADS, FF, T = 16, 2, 24, 5

local function block()
  ember.manual_seed(21)
  local m = nn.Module()
  m.attn = nn.CausalSelfAttention(D, HEADS, {attn_impl = "naive"})
  m.ffn = nn.SwiGLU(D, FF)
  return m
end

local function train(on, steps)
  local m = block()
  local opt = ember.optim.AdamW(m:parameters(), {lr = 1e-3})
  ember.manual_seed(22)
  local x, target = ember.randn({2, T, D}), ember.randn({2, T, D})
  local losses = {}
  with_switch(on, function()
    for s = 1, steps do
      opt:zero_grad()
      local loss = ember.autocast("bf16", function()
        local y = m.ffn(m.attn(x))
        return F.mse_loss(y:to("f32"), target)
      end)
      loss:backward()
      opt:step()
      losses[s] = loss:item()
    end
  end)
  return losses, m, x
end

describe("nn.Linear.group under autocast with AdamW (CPU)", function()
  it("takes the per-projection path on the CPU: the same bits as with the switch off", function()
    local lf, mf, x = train(true, 3)
    local lu, mu = train(false, 3)
    assert.same(lu, lf)
    local pu = mu:named_parameters()
    for i, np in ipairs(mf:named_parameters()) do
      assert.are.equal(pu[i][1], np[1])
      assert.are.equal(0, H.maxdiff(np[2], pu[i][2]), np[1])
    end
    with_switch(true, function()
      ember.autocast("bf16", function()
        local a = mf.attn
        local q = nn.Linear.group(x, {a.q_proj, a.k_proj, a.v_proj})
        assert.are.equal("linear", q.grad_fn)
      end)
    end)
    -- the shadows were not regrouped: each is still the cast of its own weight
    for _, lin in ipairs {mf.attn.q_proj, mf.attn.k_proj, mf.attn.v_proj, mf.ffn.w1, mf.ffn.w3} do
      assert.are.equal(0, H.maxdiff(core.shadow_weight(lin.weight):to("f32"), lin.weight:to("bf16"):to("f32")))
    end
  end)

  it("keeps parameter names and the state_dict round trip", function()
    local _, mf, x = train(true, 3)
    local mu = block()
    local names_f, names_u = {}, {}
    for k in pairs(mf:state_dict()) do names_f[#names_f + 1] = k end
    for k in pairs(mu:state_dict()) do names_u[#names_u + 1] = k end
    table.sort(names_f); table.sort(names_u)
    assert.same(names_u, names_f)
    mu:load_state_dict(mf:state_dict())
    with_switch(true, function()
      local yf = mf.ffn(mf.attn(x))
      local yu = mu.ffn(mu.attn(x))
      assert.are.equal(0, H.maxdiff(yf, yu))
    end)
  end)

  it("calls a user's replacement forward instead of fusing", function()
    with_switch(true, function()
      local m = block()
      local called = 0
      m.attn.k_proj.forward = function(self, x)
        called = called + 1
        return F.linear(x, self.weight)
      end
      m.attn(ember.randn({1, T, D}))
      assert.are.equal(1, called)
    end)
  end)
end)
