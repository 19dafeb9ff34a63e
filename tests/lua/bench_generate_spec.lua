-- bench_generate_spec.lua — scripts/bench_generate.lua on the CPU with the
-- tiny model: the header, the table, one JSON line per mode, refusals.
local cjson = require "cjson"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local SCRIPT = "scripts/bench_generate.lua"

describe("scripts/bench_generate.lua", function()
  after_each(function() H.remove_temps() end)

  it("times cache and nocache decoding and writes a JSON line per mode", function()
    local json = H.temp(".jsonl")
    local out, err, status = H.ember({"run", SCRIPT, "--model", "tiny", "--vocab", "128", "--device", "cpu",
      "--context", "32", "--prompt-len", "4", "--tokens", "6", "--warmup", "0", "--reps", "2", "--json", json})
    assert.are.equal(0, status, err)
    assert.matches("device: cpu", out, 1, true)
    assert.matches("config: tiny d_model=64 d_ff=192 layers=2 heads=4 vocab=128 context=32", out, 1, true)
    assert.matches("| cache | [%d.]+ | [%d.]+ | [%d.]+ | %- | %- | %- |", out)
    assert.matches("| nocache | [%d.]+ | [%d.]+ | [%d.]+ | %- | %- | %- |", out)
    local modes = {}
    for line in H.slurp(json):gmatch("[^\n]+") do
      local rec = cjson.decode(line)
      modes[#modes + 1] = rec.mode
      assert.are.equal("ok", rec.status)
      assert.are.equal("generate", rec.study)
      assert.is_true(rec.decode_tokens_per_s > 0)
      assert.are.equal(2, #rec.samples_tokens_per_s)
      assert.are.equal(6, rec.config.tokens)
      assert.are.equal("bf16", rec.config.precision)
      assert.is_string(rec.commit)
    end
    assert.are.same({"cache", "nocache"}, modes)
  end)

  it("refuses a graph on the CPU, unknown modes and a prompt that does not fit", function()
    for _, c in ipairs({
      {{"--device", "cpu", "--modes", "graph"}, "bench_generate.lua: --modes graph needs --device cuda"},
      {{"--device", "cpu", "--modes", "cache,fast"},
        "bench_generate.lua: --modes expects a comma list of graph, cache, nocache, got 'fast'"},
      {{"--device", "cpu", "--context", "16", "--prompt-len", "10", "--tokens", "10"},
        "bench_generate.lua: --prompt-len + --tokens (20) must fit in --context (16)"},
    }) do
      local argv = {"run", SCRIPT, "--model", "tiny"}
      for _, a in ipairs(c[1]) do argv[#argv + 1] = a end
      local _, err, status = H.ember(argv)
      assert.are.equal(2, status)
      assert.matches(c[2], err, 1, true)
    end
  end)
end)
