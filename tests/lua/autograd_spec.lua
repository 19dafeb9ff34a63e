-- autograd_spec.lua — the tape: what gets recorded, backward with and without
-- an explicit gradient, retain_graph, accumulation, no_grad, detach, the
-- in-place checks, assignable .grad (DDP buckets write through it), post-
-- accumulate-grad hooks and their order, gradients through views and dtype
-- conversions, and ember.autograd.gradcheck itself (it must also FAIL when a
-- gradient is wrong, or the op registry proves nothing).
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/autograd_spec.lua

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local F = ember.nn.functional

-- f32 sums of a few products of O(1) numbers: 1e-5 is ~100 f32 ulps.
local TOL32 = 1e-5

local function approx(want, got, tol, where)
  where = where or ""
  if type(want) == "table" then
    assert.equals(#want, #got, "length differs at " .. where)
    for i = 1, #want do approx(want[i], got[i], tol, where .. "[" .. i .. "]") end
    return
  end
  assert(math.abs(want - got) <= tol, ("at %s: expected %.9g, got %.9g (tol %g)"):format(where, want, got, tol))
end

local function leaf(values, dtype)
  return ember.tensor(values, {dtype = dtype or "f32", requires_grad = true})
end

local strip_where = H.strip_where

describe("recording", function()
  it("a fresh tensor does not require grad and is a leaf", function()
    local t = ember.zeros(2)
    assert.is_false(t.requires_grad)
    assert.is_true(t.is_leaf)
    assert.is_nil(t.grad_fn)
    assert.is_nil(t.grad)
  end)

  it("requires_grad can be switched on a leaf by assignment and by requires_grad_()", function()
    local t = ember.zeros(2)
    t.requires_grad = true
    assert.is_true(t.requires_grad)
    local u = ember.zeros(2)
    assert.is_true(rawequal(u, u:requires_grad_()))
    assert.is_true(u.requires_grad)
    u:requires_grad_(false)
    assert.is_false(u.requires_grad)
  end)

  it("an op on a tensor that requires grad records a grad_fn", function()
    local x = leaf({1, 2})
    local y = x * 2
    assert.is_true(y.requires_grad)
    assert.is_false(y.is_leaf)
    assert.is_string(y.grad_fn)
  end)

  it("an op on tensors that do not require grad records nothing", function()
    local y = ember.ones(2) * ember.ones(2)
    assert.is_false(y.requires_grad)
    assert.is_nil(y.grad_fn)
  end)

  it("a view of a leaf that requires grad is not a leaf", function()
    local x = leaf({1, 2, 3, 4})
    local v = x:view(2, 2)
    assert.is_false(v.is_leaf)
    assert.is_true(v.requires_grad)
  end)
end)

describe("backward", function()
  it("of a scalar needs no gradient (d sum(x*x)/dx = 2x)", function()
    local x = leaf({1, -2, 3})
    local y = (x * x):sum()
    y:backward()
    approx({2, -4, 6}, x.grad:tolist(), TOL32)
  end)

  it("sums bf16 gradients into an f32 input exactly as if each were converted first", function()
    ember.manual_seed(11)
    local x = ember.randn(64); x.requires_grad = true
    local a, b, c = ember.randn(64):bfloat16(), ember.randn(64):bfloat16(), ember.randn(64):bfloat16()
    -- three bf16 uses of one f32 tensor: the second and third bf16 gradients
    -- are added into the f32 sum without a separate conversion
    local total = (x:bfloat16() * a):float():sum() + (x:bfloat16() * b):float():sum() +
      (x:bfloat16() * c):float():sum()
    total:backward()
    assert.are.equal("f32", x.grad.dtype)
    local want = (a:float() + b:float()) + c:float()
    local got, w = x.grad:tolist(), want:tolist()
    for i = 1, 64 do
      -- gradients reach the sum in whichever order backward runs the uses
      assert.is_true(math.abs(got[i] - w[i]) <= 1e-6 * math.max(1, math.abs(w[i])), i .. ": " .. got[i] .. " vs " .. w[i])
    end
  end)

  it("takes an explicit gradient for a non-scalar output", function()
    local x = leaf({1, 2, 3})
    local y = x * 3
    y:backward(ember.tensor({1, 10, 100}))
    approx({3, 30, 300}, x.grad:tolist(), TOL32)
  end)

  it("gives .grad the leaf's shape and dtype", function()
    local x = ember.randn(2, 3, {dtype = "f64", requires_grad = true})
    x:sum():backward()
    assert.same({2, 3}, x.grad.shape)
    assert.equals("f64", x.grad.dtype)
    assert.same({{1, 1, 1}, {1, 1, 1}}, x.grad:tolist())
  end)

  it("of a leaf itself sets its grad to the seed", function()
    local x = leaf({5})
    x:backward()
    assert.same({1}, x.grad:tolist())
  end)

  it("sums gradients over every use of a tensor", function()
    local x = leaf({2})
    local y = x * x + x * 3 + x      -- dy/dx = 2x + 4 = 8
    y:sum():backward()
    approx({8}, x.grad:tolist(), TOL32)
  end)

  it("leaves .grad nil on a leaf that does not require grad", function()
    local x, c = leaf({1, 2}), ember.tensor({3, 4})
    ;(x * c):sum():backward()
    assert.is_nil(c.grad)
    approx({3, 4}, x.grad:tolist(), TOL32)
  end)

  it("accumulates into .grad across two backward calls", function()
    local x = leaf({1, 2})
    ;(x * x):sum():backward()
    ;(x * x):sum():backward()
    approx({4, 8}, x.grad:tolist(), TOL32)
  end)

  it("starts from zero again after p.grad = nil", function()
    local x = leaf({1, 2})
    ;(x * x):sum():backward()
    x.grad = nil
    assert.is_nil(x.grad)
    ;(x * 5):sum():backward()
    approx({5, 5}, x.grad:tolist(), TOL32)
  end)

  it("retain_graph = true allows a second backward through the same graph", function()
    local x = leaf({1, 2})
    local y = (x * x):sum()
    y:backward({retain_graph = true})
    y:backward()
    approx({4, 8}, x.grad:tolist(), TOL32)
  end)

  it("retain_graph also works with an explicit gradient", function()
    local x = leaf({1, 2})
    local y = x * x
    y:backward(ember.ones(2), {retain_graph = true})
    y:backward(ember.ones(2))
    approx({4, 8}, x.grad:tolist(), TOL32)
  end)

  it("a second backward without retain_graph raises, naming retain_graph", function()
    local x = leaf({1, 2})
    local y = (x * x):sum()
    y:backward()
    local ok, err = pcall(function() y:backward() end)
    assert.is_false(ok)
    assert.matches("retain_graph", err)
    assert.matches("^ember%.backward:", strip_where(err))
  end)
end)

describe("grad mode", function()
  it("no_grad records nothing and returns fn's results", function()
    local x = leaf({1, 2})
    local y, extra = ember.no_grad(function() return x * 2, "extra" end)
    assert.is_false(y.requires_grad)
    assert.is_nil(y.grad_fn)
    assert.equals("extra", extra)
  end)

  it("no_grad restores grad mode afterwards", function()
    ember.no_grad(function() assert.is_false(ember.is_grad_enabled()) end)
    assert.is_true(ember.is_grad_enabled())
  end)

  it("no_grad restores grad mode after an error inside and re-raises it", function()
    local ok, err = pcall(ember.no_grad, function() error("inside", 0) end)
    assert.is_false(ok)
    assert.equals("inside", err)
    assert.is_true(ember.is_grad_enabled())
    assert.is_true((leaf({1}) * 2).requires_grad)
  end)

  it("enable_grad inside no_grad records again", function()
    local x = leaf({1})
    local y = ember.no_grad(function() return ember.enable_grad(function() return x * 2 end) end)
    assert.is_true(y.requires_grad)
  end)

  it("set_grad_enabled returns the previous mode", function()
    assert.is_true(ember.set_grad_enabled(false))
    assert.is_false(ember.set_grad_enabled(true))
    assert.is_true(ember.is_grad_enabled())
  end)

  it("detach stops gradients: d/dx (detach(x) * x) = x, not 2x", function()
    local x = leaf({1, 2, 3})
    ;(x:detach() * x):sum():backward()
    approx({1, 2, 3}, x.grad:tolist(), TOL32)
  end)
end)

describe("in-place checks", function()
  it("backward raises when a tensor saved for backward was modified in place", function()
    local x = leaf({1, 2, 3})
    local c = ember.tensor({4, 5, 6})
    local y = (x * c):sum()         -- mul saves c for x's gradient
    c:fill_(0)
    local ok, err = pcall(function() y:backward() end)
    assert.is_false(ok)
    assert.matches("modified by an in%-place operation", err)
  end)

  it("a write through a view of a saved tensor is caught too (views share the version)", function()
    local x = leaf({1, 2, 3})
    local c = ember.tensor({4, 5, 6})
    local y = (x * c):sum()
    c:narrow(0, 1, 1):fill_(0)
    assert.has_error(function() y:backward() end)
  end)

  it("an in-place write into a leaf that requires grad raises", function()
    local x = leaf({1, 2})
    local ok, err = pcall(function() x:fill_(0) end)
    assert.is_false(ok)
    assert.matches("requires grad", err)
    ok = pcall(function() x:add_(1) end)
    assert.is_false(ok)
    assert.same({1, 2}, x:tolist())
  end)

  it("the same write is allowed under no_grad (what optimizers do)", function()
    local x = leaf({1, 2})
    ember.no_grad(function() x:add_(1) end)
    assert.same({2, 3}, x:tolist())
    assert.is_true(x.requires_grad)
  end)
end)

describe("assignable .grad", function()
  it("accepts a tensor of the same shape and dtype, and returns that same object", function()
    local p = leaf({1, 2, 3})
    local g = ember.zeros(3)
    p.grad = g
    assert.is_true(rawequal(g, p.grad))
  end)

  it("rejects a gradient of another shape", function()
    local p = leaf({1, 2, 3})
    local ok, err = pcall(function() p.grad = ember.zeros(2, 2) end)
    assert.is_false(ok)
    assert.matches("shape", err)
    assert.is_nil(p.grad)
  end)

  it("rejects a gradient of another dtype", function()
    local p = leaf({1, 2, 3})
    local ok, err = pcall(function() p.grad = ember.zeros(3, {dtype = "f64"}) end)
    assert.is_false(ok)
    assert.matches("dtype", err)
  end)

  it("backward accumulates in place into an assigned .grad", function()
    local p = leaf({1, 2})
    local g = ember.full({2}, 10)
    p.grad = g
    ;(p * 3):sum():backward()
    assert.is_true(rawequal(g, p.grad))
    approx({13, 13}, g:tolist(), TOL32)
  end)

  it("a .grad that is a view into a flat buffer writes the buffer (DDP buckets)", function()
    local w = leaf({{1, 2}, {3, 4}})
    local b = leaf({5, 6, 7})
    local flat = ember.zeros(9)
    w.grad = flat:narrow(0, 0, 4):view(2, 2)
    b.grad = flat:narrow(0, 5, 3)
    local x = ember.tensor({1, -1})
    local y = (w:matmul(x)):sum() + (b * b):sum()
    y:backward()
    -- dy/dw[i][j] = x[j]; dy/db = 2b; flat[4] belongs to nobody and stays 0
    approx({1, -1, 1, -1, 0, 10, 12, 14, 0}, flat:tolist(), TOL32)
  end)

  it("the bucket keeps accumulating across backward calls", function()
    local b = leaf({1, 2})
    local flat = ember.zeros(3)
    b.grad = flat:narrow(0, 1, 2)
    ;(b * 2):sum():backward()
    ;(b * 2):sum():backward()
    approx({0, 4, 4}, flat:tolist(), TOL32)
  end)
end)

describe("post-accumulate-grad hooks", function()
  it("fire once per backward with the parameter itself, after its grad is final", function()
    local p = leaf({1, 2})
    local calls, seen, grads = 0, nil, nil
    p:register_post_accumulate_grad_hook(function(t)
      calls = calls + 1
      seen = t
      grads = t.grad:tolist()
    end)
    local a, b = ember.tensor({3, 4}), ember.tensor({10, 20})
    ;(p * a + p * b):sum():backward()       -- p used twice: one call, with a + b
    assert.equals(1, calls)
    assert.is_true(rawequal(seen, p))
    approx({13, 24}, grads, TOL32)
    ;(p * a):sum():backward()
    assert.equals(2, calls)
  end)

  it("see the accumulated grad when .grad already held a value", function()
    local p = leaf({1})
    p.grad = ember.tensor({100})
    local got
    p:register_post_accumulate_grad_hook(function(t) got = t.grad:item() end)
    ;(p * 2):sum():backward()
    approx(102, got, TOL32)
  end)

  it("handle:remove() stops a hook", function()
    local p = leaf({1})
    local calls = 0
    local h = p:register_post_accumulate_grad_hook(function() calls = calls + 1 end)
    ;(p * 2):sum():backward()
    h:remove()
    ;(p * 2):sum():backward()
    assert.equals(1, calls)
  end)

  it("several hooks on one parameter fire in registration order", function()
    local p = leaf({1})
    local order = {}
    p:register_post_accumulate_grad_hook(function() order[#order + 1] = "first" end)
    p:register_post_accumulate_grad_hook(function() order[#order + 1] = "second" end)
    ;(p * 2):sum():backward()
    assert.same({"first", "second"}, order)
  end)

  it("an error inside a hook surfaces as a Lua error from backward", function()
    local p = leaf({1})
    p:register_post_accumulate_grad_hook(function() error("boom from hook") end)
    local ok, err = pcall(function() (p * 2):sum():backward() end)
    assert.is_false(ok)
    assert.matches("boom from hook", err)
    assert.matches("^ember%.backward:", strip_where(err))
  end)

  it("fire in reverse order of use for a chain of linear layers (last layer first)", function()
    ember.manual_seed(11)
    local layers = {}
    for i = 1, 3 do
      layers[i] = {w = ember.randn(4, 4, {requires_grad = true}), b = ember.randn(4, {requires_grad = true})}
    end
    local order = {}
    for i, l in ipairs(layers) do
      for _, name in ipairs {"w", "b"} do
        l[name]:register_post_accumulate_grad_hook(function() order[#order + 1] = i end)
      end
    end
    local h = ember.randn(2, 4)
    for _, l in ipairs(layers) do h = F.linear(h, l.w, l.b) end
    h:sum():backward()
    assert.same({3, 3, 2, 2, 1, 1}, order)
  end)
end)

describe("gradients through views", function()
  it("narrow scatters the gradient into its window", function()
    local x = ember.zeros(4, 2, {requires_grad = true})
    x:narrow(0, 1, 2):sum():backward()
    assert.same({{0, 0}, {1, 1}, {1, 1}, {0, 0}}, x.grad:tolist())
  end)

  it("select scatters the gradient into its row", function()
    local x = ember.zeros(3, 2, {requires_grad = true})
    ;(x:select(0, -1) * ember.tensor({5, 7})):sum():backward()
    assert.same({{0, 0}, {0, 0}, {5, 7}}, x.grad:tolist())
  end)

  it("expand sums the gradient over the expanded dims", function()
    local x = ember.zeros(1, 3, {requires_grad = true})
    x:expand(4, 3):sum():backward()
    assert.same({{4, 4, 4}}, x.grad:tolist())
  end)

  it("permute routes each gradient back to its element", function()
    local x = ember.zeros(2, 3, 4, {requires_grad = true})
    local w = ember.arange(24):float():view(4, 2, 3)
    ;(x:permute(2, 0, 1) * w):sum():backward()
    -- x.grad[i][j][k] = w[k][i][j]
    assert.same(w:permute(1, 2, 0):tolist(), x.grad:tolist())
  end)

  it("transpose routes each gradient back to its element", function()
    local x = ember.zeros(2, 3, {requires_grad = true})
    local w = ember.tensor({{1, 2}, {3, 4}, {5, 6}})
    ;(x:transpose(0, 1) * w):sum():backward()
    assert.same({{1, 3, 5}, {2, 4, 6}}, x.grad:tolist())
  end)

  it("view and unsqueeze pass the gradient through reshaped back", function()
    local x = ember.zeros(6, {requires_grad = true})
    ;(x:view(2, 3):unsqueeze(0) * ember.tensor({1, 2, 3})):sum():backward()
    assert.same({1, 2, 3, 1, 2, 3}, x.grad:tolist())
  end)
end)

describe("gradients through dtype conversion", function()
  it("an f32 leaf used in an f64 op gets an f32 gradient", function()
    local x = leaf({1, 2, 3})
    local c = ember.tensor({0.5, 0.25, 2}, {dtype = "f64"})
    local y = (x:to("f64") * c):sum()
    assert.equals("f64", y.dtype)
    y:backward()
    assert.equals("f32", x.grad.dtype)
    assert.same({0.5, 0.25, 2}, x.grad:tolist())     -- exact in both dtypes
  end)

  it("a bf16 round trip passes the gradient straight through", function()
    local x = leaf({1, 2})
    x:to("bf16"):to("f32"):sum():backward()
    assert.same({1, 1}, x.grad:tolist())
  end)
end)

describe("ember.autograd.gradcheck", function()
  it("passes for a composite function of two inputs", function()
    ember.manual_seed(21)
    local x = ember.randn(3, 4, {dtype = "f64", requires_grad = true})
    local y = ember.randn(4, {dtype = "f64", requires_grad = true})
    local fn = function(a, b) return ((a * b):tanh() + a:exp() * 0.1):sum(1) end
    assert.is_true(ember.autograd.gradcheck(fn, {x, y}))
  end)

  it("returns false with a message for a wrong gradient (detach in the middle)", function()
    ember.manual_seed(22)
    local x = ember.randn(5, {dtype = "f64", requires_grad = true})
    -- analytic gradient is x (detach hides one factor); the numeric one is 2x
    local ok, msg = ember.autograd.gradcheck(function(a) return a:detach() * a end, {x}, {raise = false})
    assert.is_false(ok)
    assert.matches("gradient mismatch", msg)
  end)

  it("raises for a wrong gradient unless raise = false", function()
    ember.manual_seed(23)
    local x = ember.randn(3, {dtype = "f64", requires_grad = true})
    assert.has_error(function()
      ember.autograd.gradcheck(function(a) return a:detach() * a end, {x})
    end)
  end)

  it("refuses f32 inputs (finite differences need f64)", function()
    local x = ember.randn(3, {requires_grad = true})
    local ok, msg = ember.autograd.gradcheck(function(a) return a * 2 end, {x}, {raise = false})
    assert.is_false(ok)
    assert.matches("f64", msg)
  end)

  it("ignores inputs that do not require grad", function()
    local x = ember.randn(3, {dtype = "f64", requires_grad = true})
    local c = ember.randn(3, {dtype = "f64"})
    assert.is_true(ember.autograd.gradcheck(function(a, b) return a * b end, {x, c}))
  end)
end)
