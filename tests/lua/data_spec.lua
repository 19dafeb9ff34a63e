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

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

describe("ember.data.open", function()
  after_each(function() H.remove_temps() end)

  it("memory-maps a 1-D token .npy (the tokens read back as saved)", function()
    local path = H.temp(".npy")
    ember.manual_seed(3)
    local t = ember.randint(0, 60000, {1234}):to("u16")
    ember.save_npy(path, t)
    local m = ember.data.open(path)
    assert.are.equal("u16", m.dtype)
    assert.same({1234}, m.shape)
    assert.same(t:tolist(), m:tolist())
    assert.same(t:tolist(), ember.data.open(path, {mmap = false}):tolist())
  end)

  it("refuses a missing file, a 2-D or float array and unknown options, naming ember.data.open", function()
    assert.error_matches(function() ember.data.open("/nonexistent/x.npy") end,
      "ember.data.open: cannot open '/nonexistent/x.npy'", 1, true)
    local path = H.temp(".npy")
    ember.save_npy(path, ember.zeros(2, 3))
    assert.error_matches(function() ember.data.open(path) end,
      "ember.data.open: expected a 1-D array of integer token ids (i64, i32, u16 or u8) in '" .. path ..
      "', got f32 [2, 3]", 1, true)
    assert.error_matches(function() ember.data.open(path, {mmpa = true}) end,
      "ember.data.open: unknown option 'mmpa' (expected: mmap)", 1, true)
  end)
end)

describe("ember.data.Loader", function()
  local tokens = arange_tokens(5000, "u16")

  it("draws get_batch's windows under manual_seed(seed), from its own generator", function()
    local loader = ember.data.Loader(tokens, {batch = 6, context = 16, seed = 11})
    ember.manual_seed(99)
    local before = ember.get_rng_state()
    local x1, y1 = loader:next()
    x1, y1 = x1:clone(), y1:clone()
    local x2 = loader:next():clone()
    assert.same(before, ember.get_rng_state())          -- the global generator is left alone
    ember.manual_seed(11)
    local gx1, gy1 = ember.data.get_batch(tokens, 6, 16)
    local gx2 = ember.data.get_batch(tokens, 6, 16)
    assert.same(gx1:tolist(), x1:tolist())
    assert.same(gy1:tolist(), y1:tolist())
    assert.same(gx2:tolist(), x2:tolist())
    assert.are_not.same(x1:tolist(), x2:tolist())
  end)

  it("gives rank r rows [r*B, (r+1)*B) of one process's batch of world_size*B", function()
    local whole = ember.data.Loader(tokens, {batch = 9, context = 8, seed = 4})
    local parts = {}
    for r = 0, 2 do parts[r] = ember.data.Loader(tokens, {batch = 3, context = 8, seed = 4, rank = r, world_size = 3}) end
    for _ = 1, 3 do
      local w = whole:next():tolist()
      for r = 0, 2 do
        local got = parts[r]:next():tolist()
        for i = 1, 3 do assert.same(w[r * 3 + i], got[i]) end
      end
    end
  end)

  it("resumes exactly from state_dict (random and sequential)", function()
    for _, order in ipairs({"random", "sequential"}) do
      local a = ember.data.Loader(tokens, {batch = 5, context = 100, order = order, seed = 7})
      for _ = 1, 4 do a:next() end
      local s = a:state_dict()
      local want = {}
      for i = 1, 12 do want[i] = a:next():tolist() end   -- past the end: a sequential loader wraps
      local b = ember.data.Loader(tokens, {batch = 5, context = 100, order = order, seed = 1234})
      b:load_state_dict(s)
      for i = 1, 12 do assert.same(want[i], b:next():tolist(), order .. " batch " .. i) end
    end
  end)

  it("walks non-overlapping windows in order with order 'sequential', then starts an epoch again", function()
    local t = arange_tokens(41)              -- (41 - 1) // 4 = 10 windows of 4 (+1 target)
    local a = ember.data.Loader(t, {batch = 2, context = 4, order = "sequential", rank = 1, world_size = 2})
    local starts = {}
    for _ = 1, 3 do
      local x, y = a:next()
      local xs = x:tolist()
      starts[#starts + 1] = xs[1][1]
      starts[#starts + 1] = xs[2][1]
      assert.are.equal(xs[2][4] + 1, y:tolist()[2][4])
    end
    -- global batches of 4 windows: [0..3], [4..7], then [8, 9] is too short -> epoch 1 from 0
    assert.same({8, 12, 24, 28, 8, 12}, starts)
    assert.are.equal(1, a:state_dict().epoch)
  end)

  it("fills its slots in turn: the views of one slot are the same tensors every `slots` calls", function()
    local a = ember.data.Loader(tokens, {batch = 2, context = 4, slots = 2})
    local x1 = a:next()
    local x2 = a:next()
    local x3 = a:next()
    assert.are.equal(x1, x3)
    assert.are_not.equal(x1, x2)
    assert.are_not.equal(x1:data_ptr(), x2:data_ptr())
  end)

  it("refuses bad options and states with the expectation named", function()
    assert.error_matches(function() ember.data.Loader(tokens, {batch = 2, context = 4, order = "shuffled"}) end,
      "ember.data.Loader: expected order 'random' or 'sequential', got shuffled", 1, true)
    assert.error_matches(function() ember.data.Loader(tokens, {batch = 2, context = 4, rank = 2, world_size = 2}) end,
      "ember.data.Loader: expected rank in [0, world_size = 2), got 2", 1, true)
    assert.error_matches(function() ember.data.Loader(tokens, {batch = 2, contxt = 4}) end,
      "ember.data.Loader: unknown option 'contxt'", 1, true)
    -- (16 - 1) // 4 = 3 windows of 4 (+1 target) for a global batch of 4
    assert.error_matches(function() ember.data.Loader(arange_tokens(16), {batch = 4, context = 4, order = "sequential"}) end,
      "ember.data.Loader: expected at least batch * world_size = 4 windows of context + 1 tokens for order " ..
      "'sequential', got 3 (16 tokens)", 1, true)
    assert.has_no.errors(function() ember.data.Loader(arange_tokens(17), {batch = 4, context = 4, order = "sequential"}) end)
    local a = ember.data.Loader(tokens, {batch = 2, context = 4})
    assert.error_matches(function() a:load_state_dict({order = "sequential", seed = 0, offset = 0, position = 0, epoch = 0}) end,
      "ember.data.Loader.load_state_dict: the state is of order 'sequential', this loader's is 'random'", 1, true)
    assert.error_matches(function() a:load_state_dict({order = "random", seed = 0, offset = "x", position = 0, epoch = 0}) end,
      "ember.data.Loader.load_state_dict: expected offset to be an integer, got x", 1, true)
  end)
end)
