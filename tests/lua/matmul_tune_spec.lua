-- matmul_tune_spec.lua — the plumbing of CUDA matmul tuning, on the CPU:
-- ember.backends.matmul_tune (switch, previous value, bad arguments), the
-- EMBER_MATMUL_TUNE start value (0, 1, unset, and a bad value as a clear
-- error), ember.core.matmul_tune_force_splitk (the GPU spec's hook: its
-- values and errors), and ember.core.matmul_tune_table(), which CPU matmuls
-- never fill.
-- What tuning does on a GPU is tests/gpu/matmul_tune_spec.lua's.
local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

-- Run a two-line script in a fresh ember with EMBER_MATMUL_TUNE set to value (nil: unset).
local function fresh(value, body)
  local script = H.temp_file('local ember = require "ember"\n' .. body .. "\n", ".lua")
  local opts = value == nil and {unset = {"EMBER_MATMUL_TUNE"}} or {env = {EMBER_MATMUL_TUNE = value}}
  local out, err, status = H.ember({"run", script}, opts)
  os.remove(script)
  return out, err, status
end

describe("ember.backends.matmul_tune", function()
  it("switches, returns the previous setting, and reads without an argument", function()
    local start = ember.backends.matmul_tune()
    assert.equals(start, ember.backends.matmul_tune(true))
    assert.is_true(ember.backends.matmul_tune())
    assert.is_true(ember.backends.matmul_tune(false))
    assert.is_false(ember.backends.matmul_tune())
    ember.backends.matmul_tune(start)
  end)

  it("rejects a non-boolean", function()
    assert.error_matches(function() ember.backends.matmul_tune("yes") end,
      "ember.backends.matmul_tune: expected argument 1 (on) to be a boolean, got string", 1, true)
    assert.error_matches(function() ember.backends.matmul_tune(1) end,
      "ember.backends.matmul_tune: expected argument 1 (on) to be a boolean, got number", 1, true)
  end)

  it("is off in a process without EMBER_MATMUL_TUNE", function()
    local out, err, status = fresh(nil, "print(ember.backends.matmul_tune())")
    assert.equals(0, status, err)
    assert.equals("false\n", out)
  end)

  for value, want in pairs({["0"] = "false", ["1"] = "true", [""] = "false"}) do
    it(("starts %s with EMBER_MATMUL_TUNE='%s'"):format(want, value), function()
      local out, err, status = fresh(value, "print(ember.backends.matmul_tune())")
      assert.equals(0, status, err)
      assert.equals(want .. "\n", out)
    end)
  end

  it("lets a script override EMBER_MATMUL_TUNE=1", function()
    local out, err, status = fresh("1", "print(ember.backends.matmul_tune(false), ember.backends.matmul_tune())")
    assert.equals(0, status, err)
    assert.equals("true\tfalse\n", out)
  end)

  for _, bad in ipairs({"yes", "2", "on", " 1"}) do
    it(("names a bad EMBER_MATMUL_TUNE='%s' and what it expects"):format(bad), function()
      local _, err, status = fresh(bad, "print(ember.backends.matmul_tune())")
      assert.are_not.equal(0, status)
      assert.truthy(err:find(("ember.backends.matmul_tune: expected EMBER_MATMUL_TUNE to be 0 or 1, got '%s'")
        :format(bad), 1, true), err)
    end)
  end
end)

describe("ember.core.matmul_tune_force_splitk (the GPU spec's hook)", function()
  it("takes 0, 2, 3 or 4 and returns the previous value", function()
    local start = ember.core.matmul_tune_force_splitk(0)
    assert.equals(0, start)
    for _, k in ipairs({2, 3, 4}) do
      ember.core.matmul_tune_force_splitk(k)
      assert.equals(k, ember.core.matmul_tune_force_splitk(0))
    end
  end)

  for _, bad in ipairs({1, 5, -2, 64}) do
    it(("names a bad split count %d and what it expects"):format(bad), function()
      assert.error_matches(function() ember.core.matmul_tune_force_splitk(bad) end,
        ("matmul_tune_force_splitk: expected a split count of 0 (choose by time), 2, 3 or 4, got %d"):format(bad),
        1, true)
      assert.equals(0, ember.core.matmul_tune_force_splitk(0), "a refused value changes nothing")
    end)
  end

  it("rejects a non-integer", function()
    assert.error_matches(function() ember.core.matmul_tune_force_splitk(2.5) end,
      "matmul_tune_force_splitk: expected argument 1 (k) to be an integer, got 2.5", 1, true)
    assert.error_matches(function() ember.core.matmul_tune_force_splitk(true) end,
      "matmul_tune_force_splitk: expected argument 1 (k) to be an integer, got boolean", 1, true)
  end)

  it("changes nothing on CPU matmuls: the table stays empty", function()
    local before = #ember.core.matmul_tune_table()
    local prev = ember.backends.matmul_tune(true)
    ember.core.matmul_tune_force_splitk(2)
    local ok, err = pcall(function() return ember.randn({8, 64}):matmul(ember.randn({64, 4})) end)
    ember.core.matmul_tune_force_splitk(0)
    ember.backends.matmul_tune(prev)
    assert.is_true(ok, tostring(err))
    assert.equals(before, #ember.core.matmul_tune_table())
  end)
end)

describe("ember.core.matmul_tune_table", function()
  it("stays empty through CPU matmuls and linears with tuning on", function()
    local prev = ember.backends.matmul_tune(true)
    local before = #ember.core.matmul_tune_table()
    local ok, err = pcall(function()
      local a, b = ember.randn({8, 16}), ember.randn({16, 4})
      a:matmul(b)
      ember.nn.functional.linear(a, ember.randn({4, 16}), ember.randn({4}))
    end)
    ember.backends.matmul_tune(prev)
    assert.is_true(ok, tostring(err))
    assert.equals("table", type(ember.core.matmul_tune_table()))
    assert.equals(before, #ember.core.matmul_tune_table())
  end)
end)
