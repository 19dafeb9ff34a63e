-- loss_spec.lua — the VALUES of F.cross_entropy (engine/ops/loss.c): the mean
-- over all targets of −log_softmax(logits)[target], for 2-D and 3-D logits,
-- every integer target dtype, f64/f32/bf16 logits, and logits large enough to
-- overflow a naive exp. Gradients live in gradcheck_spec.lua, errors in
-- bad_input_spec.lua.
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/loss_spec.lua
--
-- The reference is computed here in plain Lua doubles: for each row,
-- loss_i = logsumexp(row) − row[t_i] with the row maximum subtracted first;
-- the result is the mean of loss_i. Tolerances, and why:
--   * f64 logits: 1e-13 relative (order of additions differs; ~1e-16 each).
--   * f32 logits: 2^-20 relative (8 ulps): the per-row exp and log run in f32
--     (expf/logf within 1-2 ulps), the mean is then rounded to f32 once.
--   * bf16 logits: the loss is computed in f32 and rounded once to bf16, so it
--     is within 1 bf16 ulp (2^-8 relative) of the Lua value of the same inputs.

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local F = ember.nn.functional

local flat = H.flat

-- mean over rows of logsumexp(row) - row[t]; rows: list of lists; targets 0-based
local function xent_ref(rows, targets)
  local total = 0.0
  for i, row in ipairs(rows) do
    local m = -math.huge
    for _, v in ipairs(row) do m = math.max(m, v) end
    local s = 0.0
    for _, v in ipairs(row) do s = s + math.exp(v - m) end
    total = total + (m + math.log(s)) - row[targets[i] + 1]
  end
  return total / #rows
end

-- (N, V) logits and (N) targets as Lua lists from tensors of any shape (..., V) / (...)
local function rows_of(logits, targets)
  local V = logits.shape[#logits.shape]
  local vals, rows = flat(logits), {}
  for i = 0, #vals // V - 1 do
    local r = {}
    for j = 1, V do r[j] = vals[i * V + j] end
    rows[#rows + 1] = r
  end
  return rows, flat(targets:long())
end

local function close(got, want, rtol, what)
  assert.is_true(math.abs(got - want) <= rtol * math.abs(want),
    string.format("%s: got %.17g, expected %.17g (rtol %g)", what or "loss", got, want, rtol))
end

local function inputs(seed, lshape, V, dtype, tdtype)
  ember.manual_seed(seed)
  local logits = (ember.randn(lshape, {dtype = "f64"}) * 3):to(dtype or "f64")
  local tshape = {}
  for i = 1, #lshape - 1 do tshape[i] = lshape[i] end
  local targets = ember.randint(0, V, tshape, {dtype = tdtype or "i64"})
  return logits, targets
end

describe("F.cross_entropy", function()
  it("equals the mean of -log_softmax[target] over rows (2-D, f64)", function()
    local logits, targets = inputs(1, {8, 11}, 11)
    local r = F.cross_entropy(logits, targets)
    assert.equals(0, r:dim())
    assert.equals("f64", r.dtype)
    close(r:item(), xent_ref(rows_of(logits, targets)), 1e-13)
  end)

  it("averages over every target of 3-D logits (B, T, V)", function()
    local logits, targets = inputs(2, {2, 3, 7}, 7)
    close(F.cross_entropy(logits, targets):item(), xent_ref(rows_of(logits, targets)), 1e-13)
  end)

  it("gives the same value for 3-D logits as for the same rows flattened to 2-D", function()
    local logits, targets = inputs(3, {2, 4, 5}, 5)
    local a = F.cross_entropy(logits, targets):item()
    local b = F.cross_entropy(logits:reshape(8, 5), targets:reshape(8)):item()
    close(a, b, 1e-15, "3-D vs 2-D")
  end)

  it("f32 logits: within 8 ulps of the double value", function()
    local logits, targets = inputs(4, {16, 33}, 33, "f32")
    local r = F.cross_entropy(logits, targets)
    assert.equals("f32", r.dtype)
    close(r:item(), xent_ref(rows_of(logits, targets)), 2 ^ -20)
  end)

  it("bf16 logits are computed in f32 and the loss rounded once to bf16", function()
    local logits, targets = inputs(5, {12, 9}, 9, "bf16")
    local r = F.cross_entropy(logits, targets)
    assert.equals("bf16", r.dtype)
    close(r:item(), xent_ref(rows_of(logits, targets)), 2 ^ -8, "bf16 loss")
    -- and it is the f32 loss of the same values, rounded: exact
    assert.equals(F.cross_entropy(logits:float(), targets):to("bf16"):item(), r:item())
  end)

  for _, tdt in ipairs({"u8", "i32", "i64"}) do
    it("accepts " .. tdt .. " targets with the same result", function()
      local logits, targets = inputs(6, {6, 4}, 4)
      local want = F.cross_entropy(logits, targets):item()
      assert.equals(want, F.cross_entropy(logits, targets:to(tdt)):item())
      close(want, xent_ref(rows_of(logits, targets)), 1e-13)
    end)
  end

  it("uniform logits give log(V) whatever the targets", function()
    local V = 10
    local logits = ember.zeros(5, V, {dtype = "f64"})
    local targets = ember.tensor({0, 3, 9, 9, 4}, {dtype = "i64"})
    close(F.cross_entropy(logits, targets):item(), math.log(V), 1e-15)
  end)

  it("is stable for logits of 1000: no overflow, exact small and large losses", function()
    local logits = ember.tensor({{1000, 0}, {1000, 0}})                 -- f32
    local right = F.cross_entropy(logits, ember.tensor({0, 0}, {dtype = "i64"})):item()
    local wrong = F.cross_entropy(logits, ember.tensor({1, 1}, {dtype = "i64"})):item()
    assert.is_true(right >= 0 and right < 1e-30, tostring(right))      -- log(1 + e^-1000)
    close(wrong, 1000, 2 ^ -23, "wrong class")
    local mixed = F.cross_entropy(ember.tensor({{-1000, 1000, 999}}), ember.tensor({2}, {dtype = "i64"})):item()
    close(mixed, 1 + math.log(1 + math.exp(-1)), 2 ^ -20, "mixed")
  end)

  it("matches -mean(log_softmax gathered at the targets) computed with ember ops", function()
    local logits, targets = inputs(7, {5, 6}, 6)
    local ls = logits:log_softmax(-1):tolist()
    local tl, s = targets:tolist(), 0.0
    for i = 1, 5 do s = s - ls[i][tl[i] + 1] end
    close(F.cross_entropy(logits, targets):item(), s / 5, 1e-13)
  end)

  it("reads non-contiguous logits by their logical layout", function()
    ember.manual_seed(8)
    local lt = ember.randn(6, 4, {dtype = "f64"}):t()     -- (4, 6) logits, strides (1, 4)
    assert.is_false(lt:is_contiguous())
    local t2 = ember.tensor({5, 0, 2, 3}, {dtype = "i64"})
    close(F.cross_entropy(lt, t2):item(), xent_ref(rows_of(lt, t2)), 1e-13)
  end)

  it("a single row equals logsumexp - logit[target] (1-D logits, 0-d target)", function()
    local logits = ember.tensor({1, 2, 3}, {dtype = "f64"})
    local r = F.cross_entropy(logits, ember.tensor(0, {dtype = "i64"}))
    close(r:item(), math.log(math.exp(1) + math.exp(2) + math.exp(3)) - 1, 1e-15)
  end)
end)

---------------------------------------------------------------------------
-- issue 12: cross_entropy's options, mse/l1/nll/BCE-with-logits, gelu tanh,
-- the loss modules. References in plain Lua doubles; f64 inputs, so the
-- tolerance is 1e-12 relative (sums in a different order) unless stated.
---------------------------------------------------------------------------

local nn = ember.nn

local function raises(fn, pattern)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error matching " .. pattern)
  assert.is_truthy(tostring(err):find(pattern, 1, true), ("error %q does not contain %q"):format(tostring(err), pattern))
end

-- per-row losses with PyTorch's label smoothing: (1-eps)(lse - x_t) + eps (lse - mean x); nil for ignored rows
local function xent_rows(rows, targets, eps, ignore)
  local out = {}
  for i, row in ipairs(rows) do
    if targets[i] == ignore then out[i] = false else
      local m = -math.huge
      for _, v in ipairs(row) do m = math.max(m, v) end
      local s, sx = 0.0, 0.0
      for _, v in ipairs(row) do s = s + math.exp(v - m); sx = sx + v end
      local lse = m + math.log(s)
      out[i] = (1 - eps) * (lse - row[targets[i] + 1]) + eps * (lse - sx / #row)
    end
  end
  return out
end

describe("F.cross_entropy options", function()
  local function setup(seed)
    ember.manual_seed(seed)
    local logits = ember.randn(6, 5, {dtype = "f64"}) * 2
    local targets = ember.tensor({0, -100, 4, 2, -100, 1}, {dtype = "i64"})
    return logits, targets, rows_of(logits, targets)
  end

  it("ignores targets equal to ignore_index (default -100): mean over the other rows", function()
    local logits, targets, rows, tl = setup(11)
    local l = xent_rows(rows, tl, 0, -100)
    close(F.cross_entropy(logits, targets):item(), (l[1] + l[3] + l[4] + l[6]) / 4, 1e-12)
  end)

  it("label_smoothing eps: (1-eps)(lse - x_t) + eps (lse - mean_j x_j) per row", function()
    local logits, targets, rows, tl = setup(12)
    local l = xent_rows(rows, tl, 0.2, -100)
    close(F.cross_entropy(logits, targets, {label_smoothing = 0.2}):item(), (l[1] + l[3] + l[4] + l[6]) / 4, 1e-12)
  end)

  it("reduction sum and none (0 at ignored rows, targets' shape)", function()
    local logits, targets, rows = setup(13)
    local t2 = targets:clone():masked_fill(targets:eq(-100), 0)
    local _, tl2 = rows_of(logits, t2)
    local l = xent_rows(rows, tl2, 0.1, 4)
    local none = flat(F.cross_entropy(logits, t2, {reduction = "none", label_smoothing = 0.1, ignore_index = 4}))
    local sum = 0
    for i = 1, 6 do
      if l[i] then close(none[i], l[i], 1e-12, "row " .. i) ; sum = sum + l[i] else assert.equals(0, none[i]) end
    end
    close(F.cross_entropy(logits, t2, {reduction = "sum", label_smoothing = 0.1, ignore_index = 4}):item(), sum, 1e-12)
    local r = F.cross_entropy(logits:view(2, 3, 5), t2:view(2, 3), {reduction = "none"})
    assert.same({2, 3}, r.shape)
  end)

  it("a mean over only ignored targets is NaN, and its gradient is zero", function()
    local x = ember.randn(2, 3, {dtype = "f64", requires_grad = true})
    local l = F.cross_entropy(x, ember.tensor({-100, -100}, {dtype = "i64"}))
    assert.is_true(l:item() ~= l:item())
    l:backward()
    assert.equals(0, x.grad:abs():sum():item())
  end)

  it("gradient of an ignored row is zero, of the others softmax - (1-eps) onehot - eps/V, over M", function()
    local x = ember.randn(3, 4, {dtype = "f64", requires_grad = true})
    local t = ember.tensor({1, -100, 3}, {dtype = "i64"})
    F.cross_entropy(x, t, {label_smoothing = 0.3}):backward()
    local sm, g = F.softmax(x:detach(), -1):tolist(), x.grad:tolist()
    for j = 1, 4 do assert.equals(0, g[2][j]) end
    for _, i in ipairs({1, 3}) do
      local ti = ({1, -100, 3})[i]
      for j = 1, 4 do
        local want = (sm[i][j] - 0.3 / 4 - (j - 1 == ti and 0.7 or 0)) / 2
        assert.is_true(math.abs(g[i][j] - want) < 1e-14, ("grad[%d][%d] %g vs %g"):format(i, j, g[i][j], want))
      end
    end
  end)

  it("rejects bad options and out-of-range targets, naming ignore_index", function()
    local x, t = ember.randn(2, 3), ember.tensor({0, 1}, {dtype = "i64"})
    raises(function() F.cross_entropy(x, t, {label_smoothing = 1.5}) end,
      "cross_entropy: expected label_smoothing in [0, 1], got 1.5")
    raises(function() F.cross_entropy(x, t, {reduction = "avg"}) end,
      "cross_entropy: expected reduction \"mean\", \"sum\" or \"none\", got avg")
    raises(function() F.cross_entropy(x, t, {weight = x}) end, "cross_entropy: unknown option 'weight'")
    raises(function() F.cross_entropy(x, ember.tensor({0, 3}, {dtype = "i64"})) end,
      "cross_entropy: target 3 (at flat index 1) is out of range for 3 classes (expected 0..2, or ignore_index -100)")
  end)
end)

describe("F.mse_loss and F.l1_loss", function()
  it("are the mean, sum or elementwise (x - y)^2 and |x - y|, y broadcast", function()
    local x = ember.tensor({{1, -2, 3}, {0.5, 4, -1}}, {dtype = "f64"})
    local y = ember.tensor({0, 1, 2}, {dtype = "f64"})
    -- differences: {1, -3, 1}, {0.5, 3, -3}
    assert.equals((1 + 9 + 1 + 0.25 + 9 + 9) / 6, F.mse_loss(x, y):item())
    assert.equals(1 + 3 + 1 + 0.5 + 3 + 3, F.l1_loss(x, y, {reduction = "sum"}):item())
    assert.same({{1, 9, 1}, {0.25, 9, 9}}, F.mse_loss(x, y, {reduction = "none"}):tolist())
  end)

  -- fused (engine/ops/loss_diff.c): one op, the same values as the composition it replaced
  local function composed(name, a, b, r)
    local d = name == "mse_loss" and (a - b):square() or (a - b):abs()
    if r == "mean" then return d:mean() elseif r == "sum" then return d:sum() end
    return d
  end

  for _, name in ipairs({"mse_loss", "l1_loss"}) do
    it(name .. " in f32 is the composition's bits (f32 difference, double sum), every reduction", function()
      ember.manual_seed(5)
      local x, y = ember.randn(300, 257), ember.randn(257)
      for _, r in ipairs({"mean", "sum"}) do
        assert.equals(composed(name, x, y, r):item(), F[name](x, y, {reduction = r}):item())
      end
      assert.equals(0, (F[name](x, y, {reduction = "none"}) - composed(name, x, y, "none")):abs():max():item())
    end)

    it(name .. ": dx = f'(x - y) g / n and dy = -dx, summed to a broadcast target", function()
      local x = ember.tensor({{1, -2, 3}, {0.5, 4, -1}}, {dtype = "f64", requires_grad = true})
      local y = ember.tensor({0, 1, 3}, {dtype = "f64", requires_grad = true})
      F[name](x, y):backward(ember.tensor(3, {dtype = "f64"}))
      -- differences {1, -3, 0}, {0.5, 3, -4}; g / n = 0.5
      local want = name == "mse_loss" and {{1, -3, 0}, {0.5, 3, -4}} or {{0.5, -0.5, 0}, {0.5, 0.5, -0.5}}
      assert.same(want, x.grad:tolist())
      local dy = name == "mse_loss" and {-1.5, 0, 4} or {-1, 0, 0.5}
      assert.same(dy, y.grad:tolist())
    end)

    it(name .. ": bf16 result in bf16, bf16 with f32 promotes, an integer pair keeps the composition", function()
      local x, y = ember.tensor({1.5, -2, 0.25}), ember.tensor({0.5, 1, -0.75})
      local b = F[name](x:to("bf16"), y:to("bf16"))
      assert.equals("bf16", b.dtype)
      assert.equals(composed(name, x, y, "mean"):to("bf16"):item(), b:item())   -- rounded once
      assert.equals("f32", F[name](x:to("bf16"), y).dtype)
      local xi, yi = ember.tensor({1, 2, 3}, {dtype = "i64"}), ember.tensor({0, 0, 5}, {dtype = "i64"})
      local s = F[name](xi, yi, {reduction = "sum"})
      assert.equals("i64", s.dtype)
      assert.equals(name == "mse_loss" and 9 or 5, s:item())
    end)

    it(name .. ": bad input is an error naming the op and what was expected", function()
      local x = ember.randn(2, 3)
      raises(function() F[name](x, ember.randn(4)) end, name .. ": cannot broadcast shapes [2, 3] and [4]")
      raises(function() F[name](x, 1) end, "ember.nn.functional." .. name .. ": expected a tensor for 'target', got number")
      raises(function() F[name](x, x, {reduction = "avg"}) end,
        "ember.nn.functional." .. name .. ": expected reduction \"mean\", \"sum\" or \"none\", got avg")
      raises(function() F[name](x, x, {weight = x}) end, "ember.nn.functional." .. name .. ": unknown option 'weight'")
    end)
  end

  it("the CPU sums in blocks of 32768 combined in order: the same bits at 1 and 2 threads", function()
    ember.manual_seed(9)
    local x, y = ember.randn(1000, 300), ember.randn(300)
    local saved, got = ember.get_num_threads(), {}
    for _, nt in ipairs({1, 2}) do
      ember.set_num_threads(nt)
      local xl = x:detach(); xl.requires_grad = true
      local l = F.mse_loss(xl, y)
      l:backward()
      got[nt] = {l:item(), xl.grad, F.l1_loss(x, y, {reduction = "sum"}):item()}
    end
    ember.set_num_threads(saved)
    assert.equals(got[1][1], got[2][1])
    assert.equals(got[1][3], got[2][3])
    assert.equals(0, (got[1][2] - got[2][2]):abs():max():item())
  end)

  it("the mean of no elements is NaN", function()
    local v = F.mse_loss(ember.zeros(0), ember.zeros(0)):item()
    assert.is_true(v ~= v)
  end)
end)

describe("F.nll_loss", function()
  it("(N, C) with weight and ignore_index: -sum w[t] x[t] / sum w[t] over counted rows", function()
    local x = ember.tensor({{-1, -2, -3}, {-0.5, -1.5, -2.5}, {-2, -0.1, -3}, {-1, -1, -1}}, {dtype = "f64"})
    local w = ember.tensor({1, 2, 0.5}, {dtype = "f64"})
    local t = ember.tensor({2, 0, 1, 1}, {dtype = "i64"})
    local num = 0.5 * 3 + 1 * 0.5 + 2 * 0.1   -- row 3 (target 1) ignored below
    local den = 0.5 + 1 + 2
    close(F.nll_loss(x, t, {weight = w, ignore_index = 1}):item(), (num - 2 * 0.1 + 0) / (den - 2), 1e-15)
    close(F.nll_loss(x, t):item(), (3 + 0.5 + 0.1 + 1) / 4, 1e-15)
    assert.same({3, 0.5, 0.1, 1}, F.nll_loss(x, t, {reduction = "none"}):tolist())
  end)

  it("(N, C, d) takes the class from dim 1, and equals cross_entropy of the logits", function()
    ember.manual_seed(21)
    local logits = ember.randn(2, 4, 3, {dtype = "f64"})
    local t = ember.randint(0, 4, {2, 3})
    local a = F.nll_loss(F.log_softmax(logits, 1), t):item()
    local b = F.cross_entropy(logits:permute(0, 2, 1), t):item()
    close(a, b, 1e-13)
  end)

  it("rejects a target out of range and a shape mismatch", function()
    local x = ember.randn(2, 3)
    raises(function() F.nll_loss(x, ember.tensor({0, 5}, {dtype = "i64"})) end,
      "nll_loss: expected targets in [0, 3) or ignore_index -100, got 5")
    raises(function() F.nll_loss(x, ember.tensor({0, 1, 2}, {dtype = "i64"})) end,
      "nll_loss: expected target of shape [2] for input of shape [2, 3], got [3]")
  end)
end)

describe("F.binary_cross_entropy_with_logits", function()
  -- -(pw y log s(x) + (1 - y) log(1 - s(x))), stable form: (1-y)x + (1 + (pw-1)y) softplus(-x)
  local function ref(x, y, pw)
    local sp = math.max(-x, 0) + math.log(1 + math.exp(-math.abs(x)))
    return (1 - y) * x + (1 + ((pw or 1) - 1) * y) * sp
  end

  it("matches the formula, finite for |x| = 100 where exp overflows nothing", function()
    local xs, ys = {-100, -3, -0.5, 0, 0.7, 5, 100}, {0, 1, 0.3, 1, 0, 0.5, 1}
    local got = F.binary_cross_entropy_with_logits(ember.tensor(xs, {dtype = "f64"}), ember.tensor(ys, {dtype = "f64"}),
      {reduction = "none"}):tolist()
    for i = 1, #xs do close(got[i] + 1, ref(xs[i], ys[i]) + 1, 1e-14, "x = " .. xs[i]) end
  end)

  it("pos_weight weighs the positive term along the last dim; weight scales the loss", function()
    local x = ember.tensor({{0.2, -1.3}, {2.0, 0.4}}, {dtype = "f64"})
    local y = ember.tensor({{1, 0}, {0.5, 1}}, {dtype = "f64"})
    local pw, w = ember.tensor({2, 3}, {dtype = "f64"}), ember.tensor({{1, 0.5}, {2, 1}}, {dtype = "f64"})
    local want = 1 * ref(0.2, 1, 2) + 0.5 * ref(-1.3, 0, 3) + 2 * ref(2.0, 0.5, 2) + 1 * ref(0.4, 1, 3)
    close(F.binary_cross_entropy_with_logits(x, y, {pos_weight = pw, weight = w, reduction = "sum"}):item(), want, 1e-14)
  end)

  it("has the gradient sigmoid(x) - y at x = 0 too (no kink from |x|)", function()
    local x = ember.zeros(3, {dtype = "f64", requires_grad = true})
    local y = ember.tensor({0, 1, 0.25}, {dtype = "f64"})
    F.binary_cross_entropy_with_logits(x, y, {reduction = "sum"}):backward()
    assert.same({0.5, -0.5, 0.25}, x.grad:tolist())
  end)
end)

describe("F.binary_cross_entropy_with_logits, fused (engine/ops/loss_bce.c)", function()
  local function sig(x) return 1 / (1 + math.exp(-x)) end

  it("has the gradient sigmoid(x) - y for |x| = 100 too: no overflow, no NaN, exact in f64", function()
    local xs, ys = {-100, -30, 30, 100}, {0.25, 1, 0, 0.5}
    local x = ember.tensor(xs, {dtype = "f64", requires_grad = true})
    F.binary_cross_entropy_with_logits(x, ember.tensor(ys, {dtype = "f64"}), {reduction = "sum"}):backward()
    local g = x.grad:tolist()
    for i = 1, 4 do close(g[i] + 2, sig(xs[i]) - ys[i] + 2, 1e-15, "x = " .. xs[i]) end
  end)

  it("with pos_weight: d/dx = (1 - y) - (1 + (pw - 1) y) sigmoid(-x), d/dy = (pw - 1) softplus(-x) - x", function()
    local xs, ys, pws = {-2, 0, 0.5, 40}, {0.2, 1, 0.7, 0.4}, {3, 0.5, 2, 1.5}
    local x = ember.tensor(xs, {dtype = "f64", requires_grad = true})
    local y = ember.tensor(ys, {dtype = "f64", requires_grad = true})
    F.binary_cross_entropy_with_logits(x, y, {pos_weight = ember.tensor(pws, {dtype = "f64"}), reduction = "sum"}):backward()
    local gx, gy = x.grad:tolist(), y.grad:tolist()
    for i = 1, 4 do
      local sp = math.max(-xs[i], 0) + math.log(1 + math.exp(-math.abs(xs[i])))
      close(gx[i] + 4, (1 - ys[i]) - (1 + (pws[i] - 1) * ys[i]) * sig(-xs[i]) + 4, 1e-15, "dx " .. i)
      close(gy[i] + 4, (pws[i] - 1) * sp - xs[i] + 4, 1e-15, "dy " .. i)
    end
  end)

  it("reads weight and pos_weight as a row, a scalar or full-size: all equal the expanded form", function()
    ember.manual_seed(41)
    local x, y = ember.randn(3, 4, {dtype = "f64"}), ember.rand(3, 4, {dtype = "f64"})
    local row, one = ember.rand(4, {dtype = "f64"}) + 0.5, ember.tensor({1.7}, {dtype = "f64"})
    local function full(t) return t:expand(3, 4):contiguous() end
    for _, r in ipairs({"none", "sum", "mean"}) do
      local want = F.binary_cross_entropy_with_logits(x, y, {weight = full(one), pos_weight = full(row), reduction = r})
      local got = F.binary_cross_entropy_with_logits(x, y, {weight = one, pos_weight = row, reduction = r})
      assert.same(want.shape, got.shape)
      assert.same(want:tolist(), got:tolist())
      local got2 = F.binary_cross_entropy_with_logits(x, y, {weight = row:view(1, 4), pos_weight = one, reduction = r})
      local want2 = F.binary_cross_entropy_with_logits(x, y, {weight = full(row), pos_weight = full(one), reduction = r})
      assert.same(want2:tolist(), got2:tolist())
    end
  end)

  it("broadcasts target and weight like the composition did; their gradients sum back", function()
    local x = ember.tensor({{0.5, -1}, {2, 0.1}, {-0.3, 1.2}}, {dtype = "f64", requires_grad = true})
    local y = ember.tensor({0.25, 0.75}, {dtype = "f64", requires_grad = true})
    local w = ember.tensor({{2}, {1}, {0.5}}, {dtype = "f64", requires_grad = true})   -- a column: the full-size path
    local l = F.binary_cross_entropy_with_logits(x, y, {weight = w, reduction = "sum"})
    local xl, yl, wl = x:tolist(), y:tolist(), w:tolist()
    local want, gy = 0, {0, 0}
    for i = 1, 3 do for j = 1, 2 do
      local xv = xl[i][j]
      local sp = math.max(-xv, 0) + math.log(1 + math.exp(-math.abs(xv)))
      want = want + wl[i][1] * ((1 - yl[j]) * xv + sp)
      gy[j] = gy[j] - wl[i][1] * xv
    end end
    close(l:item(), want, 1e-14)
    l:backward()
    assert.same({2}, y.grad.shape)
    assert.same({3, 1}, w.grad.shape)
    for j = 1, 2 do close(y.grad:tolist()[j], gy[j], 1e-14, "dy " .. j) end
  end)

  it("f32 computes in double and rounds once; bf16 is the f32 loss of the same values, rounded", function()
    ember.manual_seed(42)
    local x, y = ember.randn(64, {dtype = "f64"}) * 4, ember.rand(64, {dtype = "f64"})
    local want = F.binary_cross_entropy_with_logits(x:float():double(), y:float():double()):item()
    local got = F.binary_cross_entropy_with_logits(x:float(), y:float())
    assert.equals("f32", got.dtype)
    close(got:item(), want, 2 ^ -23)
    local b = F.binary_cross_entropy_with_logits(x:to("bf16"), y:to("bf16"))
    assert.equals("bf16", b.dtype)
    assert.equals(F.binary_cross_entropy_with_logits(x:to("bf16"):float(), y:to("bf16"):float()):to("bf16"):item(), b:item())
  end)

  it("mean of no elements is NaN, their sum 0", function()
    local x, y = ember.zeros(0, 3), ember.zeros(0, 3)
    local m = F.binary_cross_entropy_with_logits(x, y):item()
    assert.is_true(m ~= m)
    assert.equals(0, F.binary_cross_entropy_with_logits(x, y, {reduction = "sum"}):item())
  end)

  it("rejects an integer target and shapes that do not broadcast, naming the op", function()
    raises(function() F.binary_cross_entropy_with_logits(ember.randn(2, 3), ember.ones(2, 3, {dtype = "i64"})) end,
      "binary_cross_entropy_with_logits: expected target to be a floating-point tensor")
    raises(function() F.binary_cross_entropy_with_logits(ember.randn(2, 3), ember.rand(2, 4)) end,
      "binary_cross_entropy_with_logits: cannot broadcast shapes [2, 3] and [2, 4]")
  end)
end)

describe("F.nll_loss, fused (engine/ops/loss_nll.c)", function()
  it("takes a (C) input with a 0-d target", function()
    local x = ember.tensor({-1.5, -0.25, -3}, {dtype = "f64"})
    assert.equals(0.25, F.nll_loss(x, ember.tensor(1, {dtype = "i64"})):item())
    local w = ember.tensor({1, 4, 1}, {dtype = "f64"})
    assert.equals(1, F.nll_loss(x, ember.tensor(1, {dtype = "i64"}), {weight = w, reduction = "sum"}):item())
  end)

  it("accepts u8, i32 and i64 targets with the same result", function()
    ember.manual_seed(43)
    local x = F.log_softmax(ember.randn(7, 5, {dtype = "f64"}), -1)
    local t = ember.randint(0, 5, {7})
    local want = F.nll_loss(x, t):item()
    for _, dt in ipairs({"u8", "i32"}) do assert.equals(want, F.nll_loss(x, t:to(dt)):item()) end
  end)

  it("d input is -w[t] g at the target and zero elsewhere; d weight sums (-x - L) / W per class (mean)", function()
    local x = ember.tensor({{-1, -2, -3}, {-0.5, -1.5, -2.5}, {-2, -0.1, -3}}, {dtype = "f64", requires_grad = true})
    local w = ember.tensor({1, 2, 0.5}, {dtype = "f64", requires_grad = true})
    local t = ember.tensor({2, 0, 2}, {dtype = "i64"})
    local l = F.nll_loss(x, t, {weight = w})
    local W = 0.5 + 1 + 0.5
    local L = (0.5 * 3 + 1 * 0.5 + 0.5 * 3) / W
    close(l:item(), L, 1e-15)
    l:backward()
    assert.same({{0, 0, -0.5 / W}, {-1 / W, 0, 0}, {0, 0, -0.5 / W}}, x.grad:tolist())
    local gw = w.grad:tolist()
    close(gw[1], (0.5 - L) / W, 1e-15, "dw[0]")
    assert.equals(0, gw[2])
    close(gw[3], 2 * (3 - L) / W, 1e-15, "dw[2]")
  end)

  it("(N, C, d): the gradient through the permuted view equals cross_entropy's", function()
    ember.manual_seed(44)
    local a = ember.randn(2, 4, 3, {dtype = "f64", requires_grad = true})
    local b = a:detach():clone()
    b.requires_grad = true
    local t = ember.randint(0, 4, {2, 3})
    F.nll_loss(F.log_softmax(a, 1), t, {reduction = "sum"}):backward()
    F.cross_entropy(b:permute(0, 2, 1), t, {reduction = "sum"}):backward()
    local ga, gb = flat(a.grad), flat(b.grad)
    for i = 1, #ga do assert.is_true(math.abs(ga[i] - gb[i]) < 1e-14, "element " .. i) end
  end)

  it("names the first bad target and its flat index; checks weight's shape", function()
    local x = ember.randn(3, 4)
    raises(function() F.nll_loss(x, ember.tensor({0, -100, -2}, {dtype = "i64"})) end,
      "nll_loss: expected targets in [0, 4) or ignore_index -100, got -2 (at flat index 2)")
    raises(function() F.nll_loss(x, ember.tensor({0, 1, 2}, {dtype = "i64"}), {weight = ember.ones(3)}) end,
      "nll_loss: expected weight of shape [4] (one per class), got [3]")
  end)
end)

describe("F.gelu approximate tanh", function()
  it("is 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))", function()
    local xs = {-3, -1, -0.1, 0, 0.5, 2, 6}
    local got = F.gelu(ember.tensor(xs, {dtype = "f64"}), {approximate = "tanh"}):tolist()
    for i, x in ipairs(xs) do
      local want = 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ^ 3)))
      assert.is_true(math.abs(got[i] - want) <= 1e-15 * math.max(1, math.abs(want)), "x = " .. x)
    end
    -- and differs from the exact (erf) form
    assert.is_true(math.abs(F.gelu(ember.tensor({1.0}, {dtype = "f64"})):item() - got[5 - 1 + 1]) > 0)
  end)

  it("rejects an unknown approximation", function()
    raises(function() F.gelu(ember.ones(2), {approximate = "fast"}) end,
      "gelu: expected approximate \"none\" or \"tanh\", got fast")
    raises(function() nn.GELU({approximate = "fast"}) end, "ember.nn.GELU: expected approximate")
  end)
end)

describe("loss modules", function()
  it("equal their functional forms with the same options", function()
    ember.manual_seed(31)
    local x, y = ember.randn(4, 3, {dtype = "f64"}), ember.randn(4, 3, {dtype = "f64"})
    local t = ember.tensor({0, 2, -100, 1}, {dtype = "i64"})
    local p = ember.rand(4, 3, {dtype = "f64"})
    assert.equals(F.mse_loss(x, y):item(), nn.MSELoss()(x, y):item())
    assert.equals(F.l1_loss(x, y, {reduction = "sum"}):item(), nn.L1Loss({reduction = "sum"})(x, y):item())
    assert.equals(F.cross_entropy(x, t, {label_smoothing = 0.1}):item(),
      nn.CrossEntropyLoss({label_smoothing = 0.1})(x, t):item())
    local w = ember.tensor({1, 2, 3}, {dtype = "f64"})
    assert.equals(F.nll_loss(x, t, {weight = w}):item(), nn.NLLLoss({weight = w})(x, t):item())
    assert.equals(F.binary_cross_entropy_with_logits(x, p, {pos_weight = w}):item(),
      nn.BCEWithLogitsLoss({pos_weight = w})(x, p):item())
  end)

  it("keep class weights as buffers (state_dict) and refuse unknown options", function()
    local m = nn.NLLLoss({weight = ember.ones(3)})
    assert.is_not_nil(m:state_dict().weight)
    raises(function() nn.MSELoss({ignore_index = 1}) end, "ember.nn.MSELoss: unknown option 'ignore_index'")
    raises(function() nn.L1Loss({reduction = "avg"}) end, "ember.nn.L1Loss: expected reduction")
  end)
end)
