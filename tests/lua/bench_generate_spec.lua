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
      assert.are.equal("masked", rec.config.kv_decode)   -- the CPU's caches: the masked composition
      assert.is_string(rec.commit)
    end
    assert.are.same({"cache", "nocache"}, modes)
  end)

  it("--batch 2 decodes two prompts at once: tokens/s of the batch, each sequence as ember.generate's alone", function()
    local json = H.temp(".jsonl")
    local out, err, status = H.ember({"run", SCRIPT, "--model", "tiny", "--vocab", "128", "--device", "cpu",
      "--context", "32", "--prompt-len", "4", "--tokens", "8", "--warmup", "0", "--reps", "2", "--batch", "2",
      "--precision", "fp32", "--check", "--json", json})
    assert.are.equal(0, status, err)
    assert.matches("params=0.1M batch=2 prompt=4 tokens=8", out, 1, true)
    assert.matches("| mode | decode tokens/s (batch 2) | tokens/s per sequence | ms/step | prefill ms |", out, 1, true)
    assert.matches("| cache | [%d.]+ | [%d.]+ | [%d.]+ | [%d.]+ | %- |", out)
    assert.matches("| nocache | [%d.]+ | [%d.]+ | [%d.]+ | [%d.]+ | %- |", out)
    assert.matches("  cache    rep 2/2: +[%d.]+ tokens/s decode %(2 x [%d.]+%)", out)
    -- greedy in f32 on the CPU is deterministic: the batched loop's sequences are exactly batch 1's
    assert.matches("ids: cache and nocache generate the same 2 x 8 tokens", out, 1, true)
    assert.matches("check: cache: all 2 sequences equal ember.generate's, one prompt at a time", out, 1, true)
    assert.matches("check: nocache: all 2 sequences equal ember.generate's, one prompt at a time", out, 1, true)
    local n = 0
    for line in H.slurp(json):gmatch("[^\n]+") do
      local rec = cjson.decode(line)
      n = n + 1
      assert.are.equal("ok", rec.status)
      assert.are.equal(2, rec.config.batch)
      assert.is_true(rec.seq_tokens_per_s > 0)
      -- the batch's rate counts both sequences
      assert.is_true(math.abs(rec.decode_tokens_per_s - 2 * rec.seq_tokens_per_s) <= 1e-9 * rec.decode_tokens_per_s)
      assert.is_true(math.abs(rec.ms_per_token - 1e3 / rec.seq_tokens_per_s) <= 1e-9 * rec.ms_per_token)  -- per step
    end
    assert.are.equal(2, n)
  end)

  it("refuses a graph on the CPU, unknown modes, a prompt that does not fit, --batch 0 and --torch with a batch", function()
    for _, c in ipairs({
      {{"--device", "cpu", "--modes", "graph"}, "bench_generate.lua: --modes graph needs --device cuda"},
      {{"--device", "cpu", "--modes", "cache,fast"},
        "bench_generate.lua: --modes expects a comma list of graph, cache, nocache, got 'fast'"},
      {{"--device", "cpu", "--context", "16", "--prompt-len", "10", "--tokens", "10"},
        "bench_generate.lua: --prompt-len + --tokens (20) must fit in --context (16)"},
      {{"--device", "cpu", "--batch", "0"}, "bench_generate.lua: --batch must be a positive integer"},
      {{"--device", "cpu", "--batch", "2", "--torch"},
        "bench_generate.lua: --torch compares batch 1 only (scripts/torch/bench_generate.py has no batch)"},
    }) do
      local argv = {"run", SCRIPT, "--model", "tiny"}
      for _, a in ipairs(c[1]) do argv[#argv + 1] = a end
      local _, err, status = H.ember(argv)
      assert.are.equal(2, status)
      assert.matches(c[2], err, 1, true)
    end
  end)
end)
