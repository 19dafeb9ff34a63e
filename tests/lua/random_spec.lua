-- random_spec.lua — bernoulli, bernoulli_, randperm and multinomial
-- (engine/ops/random.c): the exact draws against the Lua Philox reference
-- (philox_ref.lua, the stream layout of ember/rng.h), their distributions,
-- and the errors. uniform_/normal_ are specified in rng_spec.lua.
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/random_spec.lua
--
-- Statistical checks use a fixed seed and allow 6 standard errors (the
-- binomial sigma sqrt(N p (1-p)) of a count): a correct sampler fails one
-- with probability ~2e-9, a wrong frequency of a few percent fails it.
local ember = require "ember"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local H = dofile(here .. "helpers.lua")
local R = dofile(here .. "philox_ref.lua")
local flat = H.flat

local function within_6sigma(count, n, p, what)
  local sigma = math.sqrt(n * p * (1 - p))
  assert.is_true(math.abs(count - n * p) <= 6 * sigma,
    ("%s: %d of %d, expected %.1f +- %.1f (6 sigma)"):format(what, count, n, n * p, 6 * sigma))
end

local function raises(fn, pattern)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error matching " .. pattern)
  assert.is_truthy(tostring(err):find(pattern, 1, true), ("error %q does not contain %q"):format(tostring(err), pattern))
end

describe("ember.bernoulli", function()
  it("element j is u(w_j) < p_j: word j % 4 of block j / 4 (rng.h)", function()
    local p = ember.tensor({0.1, 0.5, 0.9, 0.3, 0.7, 0.2, 0.8, 0.5, 0.5, 0.95}, {dtype = "f64"})
    ember.manual_seed(77)
    local got = flat(ember.bernoulli(p))
    local w, pl = R.words(77, 0, 10), flat(p)
    for j = 1, 10 do assert.equals(R.u24(w[j]) < pl[j] and 1 or 0, got[j], "element " .. j - 1) end
  end)

  it("keeps p's shape and dtype", function()
    local r = ember.bernoulli(ember.full({2, 3}, 0.5, {dtype = "bf16"}))
    assert.same({2, 3}, r.shape)
    assert.equals("bf16", r.dtype)
  end)

  it("draws 1 with probability p (N = 100000, p = 0.3)", function()
    ember.manual_seed(1)
    local n = 100000
    local k = ember.bernoulli(ember.full({n}, 0.3, {dtype = "f64"})):sum():item()
    within_6sigma(k, n, 0.3, "ones")
  end)

  it("p = 0 never and p = 1 always draws 1", function()
    assert.equals(0, ember.bernoulli(ember.zeros(1000)):sum():item())
    assert.equals(1000, ember.bernoulli(ember.ones(1000)):sum():item())
  end)

  it("rejects probabilities outside [0, 1] and non-float p", function()
    raises(function() ember.bernoulli(ember.tensor({0.5, 1.5})) end,
      "bernoulli: expected probabilities in [0, 1], got 1.5 (at flat index 1)")
    raises(function() ember.bernoulli(ember.tensor({0, 1}, {dtype = "i64"})) end,
      "bernoulli: expected p to be a floating-point tensor")
  end)
end)

describe("t:bernoulli_(p)", function()
  it("with a number fills t in place with u(w_j) < p, keeping its dtype", function()
    local t = ember.empty(9, {dtype = "i32"})
    ember.manual_seed(5)
    assert.equals(t, t:bernoulli_(0.4))
    assert.equals("i32", t.dtype)
    local w, got = R.words(5, 0, 9), flat(t)
    for j = 1, 9 do assert.equals(R.u24(w[j]) < 0.4 and 1 or 0, got[j]) end
  end)

  it("defaults to p = 0.5 and accepts a tensor p broadcast along t", function()
    ember.manual_seed(6)
    local t = ember.zeros(3, 4):bernoulli_(ember.tensor({0, 1, 0, 1}))
    assert.same({{0, 1, 0, 1}, {0, 1, 0, 1}, {0, 1, 0, 1}}, t:tolist())
    ember.manual_seed(7)
    local k = ember.zeros(100000):bernoulli_():sum():item()
    within_6sigma(k, 100000, 0.5, "ones")
  end)

  it("fills a non-contiguous view in its logical row-major order", function()
    local base = ember.zeros(4, 3)
    ember.manual_seed(8)
    base:t():bernoulli_(0.5)
    ember.manual_seed(8)
    local ref = ember.zeros(3, 4):bernoulli_(0.5)
    assert.same(ref:tolist(), base:t():tolist())
  end)

  it("rejects a p outside [0, 1] and a p that does not broadcast", function()
    raises(function() ember.zeros(3):bernoulli_(-0.1) end, "bernoulli_: expected p in [0, 1], got -0.1")
    raises(function() ember.zeros(3):bernoulli_(ember.full({4}, 0.5)) end, "bernoulli_:")
  end)
end)

describe("ember.randperm", function()
  it("is a permutation of 0..n-1 (i64 by default)", function()
    ember.manual_seed(0)
    local p = ember.randperm(1000)
    assert.equals("i64", p.dtype)
    local seen = {}
    for _, v in ipairs(flat(p)) do
      assert.is_nil(seen[v]); seen[v] = true
      assert.is_true(v >= 0 and v < 1000)
    end
  end)

  it("sorts 0..n-1 by each index's 64-bit key (block i / 2, two words)", function()
    ember.manual_seed(42)
    local got = flat(ember.randperm(11))
    local idx = {}
    for i = 0, 10 do idx[#idx + 1] = {i = i, k = R.u64(42, 0, i)} end
    table.sort(idx, function(a, b) return math.ult(a.k, b.k) or (a.k == b.k and a.i < b.i) end)
    for i = 1, 11 do assert.equals(idx[i].i, got[i]) end
  end)

  it("takes dtype, gives n = 0 an empty tensor, and replays under the same seed", function()
    assert.equals("i32", ember.randperm(5, {dtype = "i32"}).dtype)
    assert.same({0}, ember.randperm(0).shape)
    ember.manual_seed(3); local a = flat(ember.randperm(50))
    ember.manual_seed(3); local b = flat(ember.randperm(50))
    assert.same(a, b)
  end)

  it("gives each of the 6 permutations of 3 with probability 1/6 (6000 draws)", function()
    ember.manual_seed(9)
    local count = {}
    for _ = 1, 6000 do
      local k = table.concat(flat(ember.randperm(3)), ",")
      count[k] = (count[k] or 0) + 1
    end
    local n = 0
    for k, c in pairs(count) do n = n + 1; within_6sigma(c, 6000, 1 / 6, "permutation " .. k) end
    assert.equals(6, n)
  end)

  it("rejects a negative n and a dtype that cannot hold n - 1", function()
    raises(function() ember.randperm(-1) end, "randperm: expected n >= 0, got -1")
    raises(function() ember.randperm(300, {dtype = "u8"}) end, "randperm: n = 300 does not fit dtype u8")
  end)
end)

describe("ember.multinomial", function()
  -- the race: category j's key p_j / -log(1 - u53) (em_rng_race_key)
  local function key(p, r) return p > 0 and p / -math.log(1 - ((r >> 11) * 2.0 ^ -53)) or 0 end

  it("with replacement: sample s of row r is the argmax of p_j / E over elements (r k + s) C + j", function()
    local probs = ember.tensor({{0.2, 0.5, 0.3}, {0.6, 0.1, 0.3}}, {dtype = "f64"})
    ember.manual_seed(31)
    local got = ember.multinomial(probs, 4, {replacement = true}):tolist()
    local P = probs:tolist()
    for r = 0, 1 do
      for s = 0, 3 do
        local best, bj = -1, -1
        for j = 0, 2 do
          local k = key(P[r + 1][j + 1], R.u64(31, 0, (r * 4 + s) * 3 + j))
          if k > best then best, bj = k, j end
        end
        assert.equals(bj, got[r + 1][s + 1], ("row %d sample %d"):format(r, s))
      end
    end
  end)

  it("samples each category with its probability (unnormalised weights, 20000 samples)", function()
    ember.manual_seed(2)
    local w = {1, 2, 3, 4}
    local s = flat(ember.multinomial(ember.tensor(w), 20000, {replacement = true}))
    local count = {0, 0, 0, 0}
    for _, v in ipairs(s) do count[v + 1] = count[v + 1] + 1 end
    for j = 1, 4 do within_6sigma(count[j], 20000, w[j] / 10, "category " .. j - 1) end
  end)

  it("without replacement: distinct categories, zero weights never drawn, the first by its probability", function()
    ember.manual_seed(4)
    local probs = ember.tensor({0.1, 0, 0.4, 0.2, 0, 0.3})
    local firsts = {}
    for _ = 1, 3000 do
      local s = flat(ember.multinomial(probs, 4))
      local seen = {}
      for _, v in ipairs(s) do
        assert.is_nil(seen[v]); seen[v] = true
        assert.is_true(v ~= 1 and v ~= 4, "a zero-probability category was drawn")
      end
      firsts[s[1]] = (firsts[s[1]] or 0) + 1
    end
    within_6sigma(firsts[2] or 0, 3000, 0.4, "first sample = 2")
    within_6sigma(firsts[0] or 0, 3000, 0.1, "first sample = 0")
  end)

  it("returns (k) for 1-D probs and (N, k) i64 for 2-D; torch's positional replacement flag works", function()
    assert.same({3}, ember.multinomial(ember.ones(5), 3).shape)
    local r = ember.ones(2, 5):multinomial(7, true)
    assert.same({2, 7}, r.shape)
    assert.equals("i64", r.dtype)
  end)

  it("rejects bad probabilities, shapes and sample counts", function()
    raises(function() ember.multinomial(ember.ones(3), 4) end,
      "multinomial: cannot draw 4 samples without replacement from 3 categories")
    raises(function() ember.multinomial(ember.tensor({0.5, 0, 0}), 2) end,
      "multinomial: cannot draw 2 samples without replacement: row 0 has 1 non-zero categories")
    raises(function() ember.multinomial(ember.tensor({0.5, -1}), 1) end,
      "multinomial: expected finite, non-negative probabilities, got -1 (row 0, category 1)")
    raises(function() ember.multinomial(ember.zeros(2, 3), 1, {replacement = true}) end,
      "multinomial: row 0 of probs sums to 0")
    raises(function() ember.multinomial(ember.ones(2, 2, 2), 1) end,
      "multinomial: expected probs with 1 or 2 dims, got 3 dims")
    raises(function() ember.multinomial(ember.ones(3), 0) end, "multinomial: expected num_samples >= 1, got 0")
  end)
end)
