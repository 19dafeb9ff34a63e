-- dropout_spec.lua — F.dropout and nn.Dropout (engine/ops/dropout.c): the
-- mask is the Philox stream's (element j kept when u(w_j) < 1 - p, word j % 4
-- of block j / 4: checked against the Lua reference), kept values are scaled
-- by 1/(1-p), backward applies the same mask, eval mode is the identity.
-- Gradients by finite differences are in gradcheck_spec.lua (registry).
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/dropout_spec.lua
local ember = require "ember"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local H = dofile(here .. "helpers.lua")
local R = dofile(here .. "philox_ref.lua")
local F, nn = ember.nn.functional, ember.nn
local flat = H.flat

local function raises(fn, pattern)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error matching " .. pattern)
  assert.is_truthy(tostring(err):find(pattern, 1, true), ("error %q does not contain %q"):format(tostring(err), pattern))
end

describe("F.dropout", function()
  it("keeps element j when u(w_j) < 1 - p and scales it by 1/(1-p) (f64, exact)", function()
    local x = ember.randn(13, {dtype = "f64"})
    ember.manual_seed(100)
    local y = flat(F.dropout(x, 0.3))
    local w, xl = R.words(100, 0, 13), flat(x)
    for j = 1, 13 do
      local want = R.u24(w[j]) < 0.7 and xl[j] * (1 / 0.7) or 0
      assert.equals(want, y[j], "element " .. j - 1)
    end
  end)

  it("f32 multiplies by the scale rounded to f32; bf16 rounds the f32 product once", function()
    local x = ember.randn(64)
    ember.manual_seed(1); local y = flat(F.dropout(x, 0.25))
    local s = H.f32(1 / 0.75)
    for j, v in ipairs(flat(x)) do assert.is_true(y[j] == 0 or y[j] == H.f32(v * s)) end
    local xb = x:to("bf16")
    ember.manual_seed(1); local yb = F.dropout(xb, 0.25)
    assert.equals("bf16", yb.dtype)
    ember.manual_seed(1)
    assert.same(flat(F.dropout(xb:float(), 0.25):to("bf16")), flat(yb))
  end)

  it("drops a fraction p of the elements (N = 100000, 6 sigma)", function()
    ember.manual_seed(2)
    local n, p = 100000, 0.1
    local dropped = F.dropout(ember.ones(n), p):eq(0):sum():item()
    assert.is_true(math.abs(dropped - n * p) <= 6 * math.sqrt(n * p * (1 - p)), "dropped " .. dropped)
  end)

  it("backward multiplies the gradient by the same mask and scale", function()
    local x = ember.randn(4, 5, {requires_grad = true})
    ember.manual_seed(3)
    local y = F.dropout(x, 0.5)
    local g = ember.randn(4, 5)
    y:backward(g)
    local gl, yl, xl, gx = flat(g), flat(y), flat(x), flat(x.grad)
    for j = 1, 20 do
      local kept = yl[j] ~= 0 or xl[j] == 0
      assert.equals(kept and H.f32(gl[j] * 2) or 0, gx[j], "element " .. j - 1)
    end
  end)

  it("draws a new mask each call, the same mask after manual_seed", function()
    local x = ember.ones(256)
    ember.manual_seed(4)
    local a, b = flat(F.dropout(x, 0.5)), flat(F.dropout(x, 0.5))
    assert.are_not.same(a, b)
    ember.manual_seed(4)
    assert.same(a, flat(F.dropout(x, 0.5)))
  end)

  it("reads a non-contiguous input in its logical row-major order", function()
    local x = ember.randn(6, 5)
    ember.manual_seed(5); local a = F.dropout(x:t(), 0.4)
    ember.manual_seed(5); local b = F.dropout(x:t():contiguous(), 0.4)
    assert.same(b:tolist(), a:tolist())
  end)

  it("is the identity (the same tensor) when not training or p = 0; p = 1 zeroes everything", function()
    local x = ember.randn(3, 4)
    assert.equals(x, F.dropout(x, 0.5, false))
    assert.equals(x, F.dropout(x, 0))
    assert.equals(0, F.dropout(x, 1):abs():sum():item())
  end)

  it("defaults to p = 0.5 in training mode", function()
    ember.manual_seed(6)
    local y = flat(F.dropout(ember.ones(8)))
    for _, v in ipairs(y) do assert.is_true(v == 0 or v == 2) end
  end)

  it("rejects p outside [0, 1] and integer inputs, naming the op", function()
    raises(function() F.dropout(ember.ones(3), 1.5) end, "dropout: expected p in [0, 1], got 1.5")
    raises(function() ember.dropout(ember.ones(3), -0.5) end, "dropout: expected p in [0, 1], got -0.5")
    raises(function() F.dropout(ember.ones(3, {dtype = "i64"}), 0.5) end,
      "dropout: expected input to be a floating-point tensor (f32, f64, bf16, f16), got i64")
  end)
end)

describe("nn.Dropout", function()
  it("draws masks in train mode and passes x through in eval mode", function()
    local m = nn.Dropout(0.5)
    local x = ember.ones(64)
    assert.is_true(m(x):eq(0):sum():item() > 0)
    m:eval()
    assert.equals(x, m(x))
    m:train()
    assert.is_true(m(x):eq(0):sum():item() > 0)
  end)

  it("works inside nn.Sequential, and eval() on the container reaches it", function()
    local net = nn.Sequential(nn.Linear(4, 8), nn.GELU({approximate = "tanh"}), nn.Dropout(0.25), nn.Linear(8, 2))
    local x = ember.randn(3, 4)
    net:eval()
    local a, b = net(x), net(x)
    assert.same(a:tolist(), b:tolist())
    net:train()
    ember.manual_seed(7)
    local c = net(x)
    c:sum():backward()
    assert.is_not_nil(net[1].weight.grad)
    assert.equals("Dropout(p=0.25)", tostring(net[3]))
  end)

  it("rejects a bad p at construction", function()
    raises(function() nn.Dropout(2) end, "ember.nn.Dropout: expected p in [0, 1], got 2")
  end)
end)
