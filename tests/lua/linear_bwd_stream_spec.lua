-- linear_bwd_stream_spec.lua — EMBER_LINEAR_BWD_STREAM on the CPU: the switch's parsing (0, 1, unset or empty,
-- and a bad value as a clear error naming the accepted ones), ember.backends.linear_bwd_stream (read-only), and
-- CPU training left alone by it (the side stream is for CUDA autocast linears only). What the switch does on a
-- GPU is tests/gpu/linear_bwd_stream_spec.lua's.
local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

-- Run a script in a fresh ember with EMBER_LINEAR_BWD_STREAM set to value (nil: unset).
local function fresh(value, body)
  local script = H.temp_file('local ember = require "ember"\n' .. body .. "\n", ".lua")
  local opts = value == nil and {unset = {"EMBER_LINEAR_BWD_STREAM"}} or {env = {EMBER_LINEAR_BWD_STREAM = value}}
  local out, err, status = H.ember({"run", script}, opts)
  os.remove(script)
  return out, err, status
end

describe("EMBER_LINEAR_BWD_STREAM", function()
  it("is off in a process without it", function()
    local out, err, status = fresh(nil, "print(ember.backends.linear_bwd_stream())")
    assert.equals(0, status, err)
    assert.equals("false\n", out)
  end)

  for value, want in pairs({["0"] = "false", ["1"] = "true", [""] = "false"}) do
    it(("reads '%s' as %s"):format(value, want), function()
      local out, err, status = fresh(value, "print(ember.backends.linear_bwd_stream())")
      assert.equals(0, status, err)
      assert.equals(want .. "\n", out)
    end)
  end

  for _, bad in ipairs({"2", "yes", "on", "true", " 1", "1 ", "01"}) do
    it(("names a bad value '%s' and what it expects"):format(bad), function()
      local _, err, status = fresh(bad, "print(ember.backends.linear_bwd_stream())")
      assert.are_not.equal(0, status)
      assert.truthy(err:find(("ember.backends.linear_bwd_stream: expected EMBER_LINEAR_BWD_STREAM to be 0 or 1, "
        .. "got '%s'"):format(bad), 1, true), err)
    end)
  end

  it("is read-only: an argument is an error naming the variable", function()
    assert.error_matches(function() ember.backends.linear_bwd_stream(true) end,
      "ember.backends.linear_bwd_stream: expected no argument (the switch is EMBER_LINEAR_BWD_STREAM, read once), got 1",
      1, true)
  end)

  it("leaves CPU training alone: the same losses and weights with 1 as with 0", function()
    local body = [[
local nn, F = ember.nn, ember.nn.functional
ember.manual_seed(3)
local model = nn.TransformerLM(nn.configs.tiny{vocab_size = 64, context_length = 16})
local opt = ember.optim.AdamW(model:parameters(), {lr = 1e-2})
local data = ember.randint(0, 64, {2, 17})
local x, y = data:narrow(1, 0, 16), data:narrow(1, 1, 16)
local out = {}
for s = 1, 2 do
  opt:zero_grad()
  local loss = ember.autocast("bf16", function() return F.cross_entropy(model(x), y) end)
  loss:backward()
  opt:step()
  out[#out + 1] = ("%a"):format(loss:item())
end
for _, p in ipairs(model:parameters()) do
  local v = p:detach():reshape(-1):to("f64"):tolist()
  for i = 1, #v, 97 do out[#out + 1] = ("%a"):format(v[i]) end
end
print(table.concat(out, " "))
]]
    local out0, err0, s0 = fresh("0", body)
    assert.equals(0, s0, err0)
    local out1, err1, s1 = fresh("1", body)
    assert.equals(0, s1, err1)
    assert.truthy(#out0 > 100, out0)
    assert.equals(out0, out1)
  end)
end)
