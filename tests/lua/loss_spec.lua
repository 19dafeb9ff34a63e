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
