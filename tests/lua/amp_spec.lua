-- amp_spec.lua — ember.autocast on CPU tensors: the same rules as on the GPU
-- (matmul/linear in bf16 with f32 accumulation, norms and the loss in f32,
-- parameters and gradients f32), the ToyModel dtype report of CS336 A2
-- §1.1.5, nesting, restoring on error, and the TF32 switch.
local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local nn, F = ember.nn, ember.nn.functional
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local toy = dofile(here .. "../../scripts/lib/amp_toy.lua")

local maxdiff = H.maxdiff

describe("ember.autocast dtype report (CPU)", function()
  it("gives the ToyModel's parameters f32, fc1 bf16, norm f32, logits bf16, loss f32, grads f32", function()
    assert.are.same(toy.expected_report, toy.dtype_report("cpu", "bf16"))
  end)

  it("gives fc1 and logits f16 (the rest f32) under f16 autocast, the assignment's case", function()
    assert.are.same(toy.expected("f16"), toy.dtype_report("cpu", "f16"))
  end)

  it("reports each parameter f32 with an f32 gradient", function()
    local _, each = toy.dtype_report("cpu", "bf16")
    assert.are.same({"fc1.weight", "ln.weight", "fc2.weight"}, {each[1].name, each[2].name, each[3].name})
    for _, p in ipairs(each) do assert.are.same({"f32", "f32"}, {p.dtype, p.grad}) end
  end)

  it("leaves every dtype f32 outside autocast", function()
    ember.manual_seed(0)
    local m = toy.ToyModel(20, 5)
    local seen = {}
    local logits = m(ember.randn(4, 20), seen)
    assert.are.same({fc1 = "f32", ln = "f32"}, seen)
    assert.are.equal("f32", logits.dtype)
  end)
end)

describe("ember.autocast numerics (CPU)", function()
  it("computes a matmul as the matmul of bf16-rounded inputs, rounded once to bf16", function()
    local a, b = ember.randn(33, 70), ember.randn(70, 45)
    local c = ember.autocast("bf16", function() return a:matmul(b) end)
    local ref = a:to("bf16"):matmul(b:to("bf16"))
    assert.are.equal("bf16", c.dtype)
    assert.are.same({33, 45}, c.shape)
    -- same CPU path (widen, f32 accumulate, one rounding): bit-identical
    assert.are.equal(0, maxdiff(c, ref))
  end)

  it("computes F.linear as the linear of bf16-rounded x and w", function()
    local x, w = ember.randn(4, 6, 32), ember.randn(24, 32)
    local y = ember.autocast("bf16", function() return F.linear(x, w) end)
    assert.are.equal("bf16", y.dtype)
    assert.are.equal(0, maxdiff(y, F.linear(x:to("bf16"), w:to("bf16"))))
  end)

  it("stays within bf16 rounding of the f32 matmul", function()
    local a, b = ember.randn(64, 128), ember.randn(128, 64)
    local c = ember.autocast("bf16", function() return a:matmul(b) end)
    local ref = a:matmul(b)
    -- inputs rounded to 8 bits of mantissa (rel. 2^-9 each) and the output
    -- once more: ~1e-2 of the output's scale, never 10x that
    local scale = ref:abs():max():item()
    assert.is_true(maxdiff(c, ref) / scale < 2e-2)
  end)

  it("uses f16 when asked", function()
    local a, b = ember.randn(8, 16), ember.randn(16, 8)
    local c = ember.autocast("f16", function() return a:matmul(b) end)
    assert.are.equal("f16", c.dtype)
    assert.are.equal(0, maxdiff(c, a:to("f16"):matmul(b:to("f16"))))
  end)

  it("leaves f64 and integer matmuls alone", function()
    local a = ember.randn({5, 7}, {dtype = "f64"})
    local b = ember.randn({7, 3}, {dtype = "f64"})
    local i = ember.randint(0, 5, {4, 4}, {dtype = "i64"})
    ember.autocast("bf16", function()
      assert.are.equal("f64", a:matmul(b).dtype)
      assert.are.equal("i64", i:matmul(i).dtype)
    end)
  end)

  it("computes rmsnorm and cross-entropy in f32 from bf16 inputs", function()
    local x = ember.randn(6, 16):to("bf16")
    local w = ember.ones(16)
    local logits = ember.randn(6, 11):to("bf16")
    local t = ember.randint(0, 11, {6})
    ember.autocast("bf16", function()
      local n = F.rmsnorm(x, w, 1e-5)
      assert.are.equal("f32", n.dtype)
      assert.is_true(maxdiff(n, F.rmsnorm(x:float(), w, 1e-5)) < 1e-6)
      local l = F.cross_entropy(logits, t)
      assert.are.equal("f32", l.dtype)
      assert.is_true(math.abs(l:item() - F.cross_entropy(logits:float(), t):item()) < 1e-6)
    end)
  end)

  it("computes sum, exp, log and rsqrt of bf16 in f32 (PyTorch's f32 list); mean keeps bf16", function()
    local x = (ember.rand({64}) + 0.5):to("bf16")
    local x32 = x:float()
    local got = ember.autocast("bf16", function()
      return {sum = x:sum(), exp = x:exp(), log = x:log(), rsqrt = x:rsqrt(), mean = x:mean()}
    end)
    for _, k in ipairs({"sum", "exp", "log", "rsqrt"}) do
      assert.are.equal("f32", got[k].dtype, k)
      local want = x32[k](x32)
      assert.are.equal(0, (got[k] - want):abs():max():item(), k)
    end
    assert.are.equal("bf16", got.mean.dtype)
    -- and outside a region they stay bf16
    assert.are.equal("bf16", x:sum().dtype)
    assert.are.equal("bf16", x:exp().dtype)
  end)

  it("sends f32 gradients to f32 weights, close to the f32 gradients", function()
    ember.manual_seed(5)
    local w = ember.randn(16, 32)
    w.requires_grad = true
    local x = ember.randn(8, 32)
    local y = ember.autocast("bf16", function() return F.linear(x, w) end)
    assert.are.equal("bf16", y.dtype)
    local l = (y:float() * y:float()):sum()
    l:backward()
    assert.are.equal("f32", w.grad.dtype)
    local g = w.grad:clone()
    w.grad = nil
    local y32 = F.linear(x, w)
    local l32 = (y32 * y32):sum()
    l32:backward()
    local scale = w.grad:abs():max():item()
    assert.is_true(maxdiff(g, w.grad) / scale < 3e-2)
  end)

  it("casts a weight again after it was modified in place inside the region", function()
    local w = ember.randn(64, 64)          -- >= 4096 elements: cached
    w.requires_grad = true
    local x = ember.randn(2, 64)
    ember.autocast("bf16", function()
      local y1 = F.linear(x, w)
      ember.no_grad(function() w:mul_(2) end)
      local y2 = F.linear(x, w)
      -- doubling is exact in bf16, so the recast result is exactly twice
      assert.are.equal(0, maxdiff(y2, y1:float() * 2))
    end)
  end)
end)

describe("ember.autocast regions", function()
  after_each(function()
    -- a failing test must not leak a region into the next one
    while ember.core.autocast_enabled() do ember.core.autocast_exit() end
  end)

  it("returns every result of fn and passes its arguments", function()
    local a, b, c = ember.autocast("bf16", function(p, q) return p + q, "two", nil end, 1, 2)
    assert.are.same({3, "two"}, {a, b})
    assert.is_nil(c)
  end)

  it("is on inside and off after, reporting its dtype", function()
    assert.is_false(ember.core.autocast_enabled())
    ember.autocast("bfloat16", function()
      assert.is_true(ember.core.autocast_enabled())
      assert.are.equal("bf16", ember.core.autocast_dtype())
    end)
    assert.is_false(ember.core.autocast_enabled())
    assert.is_nil(ember.core.autocast_dtype())
  end)

  it("nests with the same dtype and stays on until the outer region ends", function()
    local a, b = ember.randn(4, 4), ember.randn(4, 4)
    ember.autocast("bf16", function()
      ember.autocast("bf16", function() assert.are.equal("bf16", a:matmul(b).dtype) end)
      assert.is_true(ember.core.autocast_enabled())
      assert.are.equal("bf16", a:matmul(b).dtype)
    end)
    assert.are.equal("f32", a:matmul(b).dtype)
  end)

  it("refuses an inner region of another dtype, naming both", function()
    ember.autocast("bf16", function()
      assert.error_matches(function() ember.autocast("f16", function() end) end,
        "autocast: cannot nest a f16 region inside a bf16 region", 1, true)
      assert.is_true(ember.core.autocast_enabled())
    end)
    assert.is_false(ember.core.autocast_enabled())
  end)

  it("restores the state when fn raises, and re-raises the error unchanged", function()
    local ok, err = pcall(ember.autocast, "bf16", function() error({code = 7}) end)
    assert.is_false(ok)
    assert.are.same({code = 7}, err)
    assert.is_false(ember.core.autocast_enabled())
    ember.autocast("bf16", function()
      pcall(ember.autocast, "bf16", function() error("inner") end)
      assert.is_true(ember.core.autocast_enabled())     -- only the inner region closed
    end)
    assert.is_false(ember.core.autocast_enabled())
  end)

  it("turns autocast off inside a region with ember.autocast(false, fn), and back on after", function()
    local a, b = ember.randn(4, 4), ember.randn(4, 4)
    ember.autocast("bf16", function()
      ember.autocast("bf16", function()
        ember.autocast(false, function()
          assert.is_false(ember.core.autocast_enabled())
          assert.are.equal("f32", a:matmul(b).dtype)
        end)
        assert.are.equal("bf16", a:matmul(b).dtype)
      end)
      assert.is_true(ember.core.autocast_enabled())   -- both levels were re-opened
    end)
    assert.is_false(ember.core.autocast_enabled())
    pcall(ember.autocast, "bf16", function() ember.autocast(false, function() error("x") end) end)
    assert.is_false(ember.core.autocast_enabled())
  end)

  it("rejects dtypes other than bf16/f16 and a missing function", function()
    assert.error_matches(function() ember.autocast("f32", function() end) end,
      'ember.autocast: expected dtype "bf16" or "f16", got f32', 1, true)
    assert.error_matches(function() ember.autocast("bf16") end,
      "ember.autocast: expected argument 2 (fn) to be a function, got nil", 1, true)
    assert.error_matches(function() ember.autocast(16, function() end) end,
      "ember.autocast: expected argument 1 (dtype)", 1, true)
    assert.is_false(ember.core.autocast_enabled())
  end)
end)

describe("ember.backends.tf32", function()
  it("is off by default, switches, and returns the previous setting", function()
    assert.is_false(ember.backends.tf32())
    assert.is_false(ember.backends.tf32(true))
    assert.is_true(ember.backends.tf32())
    assert.is_true(ember.backends.tf32(false))
    assert.is_false(ember.backends.tf32())
  end)

  it("rejects a non-boolean", function()
    assert.error_matches(function() ember.backends.tf32("yes") end,
      "ember.backends.tf32: expected argument 1 (on) to be a boolean, got string", 1, true)
  end)
end)
