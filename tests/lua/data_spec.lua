-- data_spec.lua — ember.data: random training windows (get_batch) and
-- sequential evaluation windows (batches) over a 1-D token array.
local ember = require "ember"

local function arange_tokens(n, dtype) return ember.arange(n):to(dtype or "i64") end

describe("ember.data.get_batch", function()
  it("gives (B, T) i64 windows with y the next tokens of x, inside the array", function()
    local tokens = arange_tokens(1000, "u16")      -- token i is i: a window is a run of consecutive ids
    ember.manual_seed(0)
    local x, y = ember.data.get_batch(tokens, 16, 32)
    assert.same({16, 32}, x.shape)
    assert.same({16, 32}, y.shape)
    assert.are.equal("i64", x.dtype)
    local xs, ys = x:tolist(), y:tolist()
    for b = 1, 16 do
      local s = xs[b][1]
      assert.is_true(s >= 0 and s + 32 <= 999, "window out of range: " .. s)
      for t = 1, 32 do
        assert.are.equal(s + t - 1, xs[b][t])
        assert.are.equal(s + t, ys[b][t])
      end
    end
  end)

  it("is reproducible under manual_seed and differs between draws", function()
    local tokens = arange_tokens(5000)
    ember.manual_seed(42)
    local a = ember.data.get_batch(tokens, 8, 16):tolist()
    local b = ember.data.get_batch(tokens, 8, 16):tolist()
    ember.manual_seed(42)
    local c = ember.data.get_batch(tokens, 8, 16):tolist()
    assert.same(a, c)
    assert.are_not.same(a, b)
  end)

  it("reaches every start position: [0, N - T) over many draws", function()
    local tokens = arange_tokens(12)
    ember.manual_seed(1)
    local seen = {}
    for _ = 1, 50 do
      for _, row in ipairs(ember.data.get_batch(tokens, 8, 4):tolist()) do seen[row[1]] = true end
    end
    for s = 0, 7 do assert.is_true(seen[s], "start " .. s .. " never drawn") end
    assert.is_nil(seen[8], "a window would run past the last target")
  end)

  it("refuses bad tokens, sizes and options with the expectation named", function()
    local tokens = arange_tokens(10)
    assert.error_matches(function() ember.data.get_batch(ember.randn(10), 2, 4) end,
      "ember.data.get_batch: expected 1-D integer tokens (i64, i32, u16 or u8), got f32", 1, true)
    assert.error_matches(function() ember.data.get_batch(tokens:view(2, 5), 2, 4) end,
      "expected 1-D integer tokens", 1, true)
    assert.error_matches(function() ember.data.get_batch(tokens, 0, 4) end,
      "ember.data.get_batch: expected batch to be a positive integer, got 0", 1, true)
    assert.error_matches(function() ember.data.get_batch(tokens, 2, 10) end,
      "ember.data.get_batch: expected at least context + 1 = 11 tokens, got 10", 1, true)
    assert.error_matches(function() ember.data.get_batch(tokens, 2, 4, {devcie = "cpu"}) end,
      "ember.data.get_batch: unknown option 'devcie' (expected: device)", 1, true)
  end)
end)

describe("ember.data.batches", function()
  it("walks every window once, in order, with a short last batch", function()
    local tokens = arange_tokens(23)                -- (23 - 1) // 4 = 5 windows of 4 (+1 target)
    local got = {}
    for x, y in ember.data.batches(tokens, 2, 4) do
      local xs, ys = x:tolist(), y:tolist()
      for b = 1, #xs do
        got[#got + 1] = xs[b][1]
        assert.are.equal(xs[b][4] + 1, ys[b][4])
      end
    end
    assert.same({0, 4, 8, 12, 16}, got)
  end)
end)
