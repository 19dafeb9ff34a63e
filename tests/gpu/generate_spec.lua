-- generate_spec.lua (GPU) — generation on CUDA: cached decoding against the
-- CPU, the decode step captured as one CUDA graph (its position read from
-- the device tensor kv.pos) against eager decoding and the uncached forward,
-- bf16 weights and bf16 autocast, seeded sampling on the device.
local ember = require "ember"
local C, H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "compare.lua")
local nn = ember.nn
local G = ember.generate

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local V, CTX = 256, 48

-- The same seed gives the same weights on either device (one Philox stream).
local function tiny(device, dtype)
  ember.manual_seed(7)
  return nn.TransformerLM{vocab_size = V, context_length = CTX, d_model = 64, d_ff = 128, num_layers = 2,
    num_heads = 4, device = device, dtype = dtype}
end

local function uncached(model, ids)
  return ember.no_grad(function() return model(ids) end)
end

-- Byte tokens, as in tests/lua/generate_spec.lua.
local BYTES = {
  encode = function(_, s) return {s:byte(1, -1)} end,
  decode = function(_, ids)
    local t = {}
    for i, id in ipairs(ids) do t[i] = string.char(id) end
    return table.concat(t)
  end,
  vocab_size = function() return 256 end,
}

-- f32 through two layers: each op within ~1e-6 of the CPU's (compare.lua),
-- a dozen of them chained, on logits of size ~3: 1e-4 relative to the largest.
local F32_MODEL = 1e-4

describe("cached decoding on CUDA", function()
  it("equals the CPU's cached decoding, step by step (f32)", function()
    local ids = ember.randint(0, V, {2, 30})
    local cpu, gpu = tiny("cpu"), tiny("cuda")
    local kc, kg = nn.KVCache(cpu, {batch = 2}), nn.KVCache(gpu, {batch = 2})
    local idg = ids:cuda()
    C.assert_close(gpu:forward(idg:narrow(1, 0, 10), {cache = kg}), cpu:forward(ids:narrow(1, 0, 10), {cache = kc}),
      F32_MODEL, "prefill")
    for t = 10, 29 do
      C.assert_close(gpu:forward(idg:narrow(1, t, 1), {cache = kg}), cpu:forward(ids:narrow(1, t, 1), {cache = kc}),
        F32_MODEL, "decode position " .. t)
    end
    C.assert_close(gpu:forward(idg:narrow(1, 0, 5), {cache = nn.KVCache(gpu, {batch = 2})}),
      uncached(cpu, ids:narrow(1, 0, 5)), F32_MODEL, "prefill vs uncached")
    assert.are.equal(30, kg.pos:item())
  end)
end)

describe("the decode step as a CUDA graph (generate.Decoder)", function()
  -- Graph and eager run the same kernels on the same data; 1e-6 only admits a
  -- library choosing another reduction order under capture.
  local function graph_vs_eager(model, autocast, tol_uncached)
    local ids = ember.randint(0, V, {1, 40}):cuda()
    local eager = G.Decoder(model, nn.KVCache(model, {dtype = autocast}), {autocast = autocast})
    local graphed = G.Decoder(model, nn.KVCache(model, {dtype = autocast}), {graph = true, autocast = autocast})
    local prompt = ids:narrow(1, 0, 8)
    C.assert_close(graphed:prefill(prompt), eager:prefill(prompt), 1e-6, "prefill")
    assert.is_true(graphed:capture())
    assert.are.equal(8, graphed.kv.len)
    assert.are.equal(8, graphed.kv.pos:item())
    local full = autocast and ember.autocast(autocast, uncached, model, ids) or uncached(model, ids)
    for t = 8, 39 do
      local x = ids:narrow(1, t, 1)
      local a, b = graphed:step(x), eager:step(x)
      C.assert_close(a, b, 1e-6, "graph vs eager at position " .. t)
      -- one graph, every position: the replay reads kv.pos, which it moves on
      C.assert_close(a, full:narrow(1, t, 1), tol_uncached, "graph vs uncached at position " .. t)
    end
    assert.are.equal(40, graphed.kv.len)
    assert.are.equal(40, graphed.kv.pos:item())
    graphed:close()
  end

  it("replays one graph for every position, equal to eager decoding and to the uncached forward (f32)", function()
    graph_vs_eager(tiny("cuda"), nil, F32_MODEL)
  end)

  -- bf16: cached and uncached attention round differently (bf16 scores over
  -- the whole cache vs the flash/naive path): a few bf16 ulps of ~3-sized logits
  it("does so with bf16 weights", function()
    graph_vs_eager(tiny("cuda"):to("bf16"), nil, 5e-2)
  end)

  it("does so under bf16 autocast (f32 weights, bf16 cache)", function()
    graph_vs_eager(tiny("cuda"), "bf16", 5e-2)
  end)
end)

describe("ember.generate on CUDA", function()
  it("greedy equals the argmax of the uncached model step by step, with and without the graph (f32)", function()
    local model = tiny("cuda")
    local _, g = G(model, BYTES, "hello", {max_tokens = 30, temperature = 0, eos = false})
    local _, e = G(model, BYTES, "hello", {max_tokens = 30, temperature = 0, eos = false, graph = false})
    assert.is_true(g.graph)
    assert.is_false(e.graph)
    assert.are.same(e.ids, g.ids)
    local all = {104, 101, 108, 108, 111}
    for i = 1, 30 do
      local logits = uncached(model, ember.tensor({all}, {dtype = "i64", device = "cuda"}))
      all[#all + 1] = logits:select(1, #all - 1):argmax():item()
      assert.are.equal(all[#all], g.ids[i], "token " .. i)
    end
  end)

  it("bf16 weights and bf16 autocast: the graph gives the eager ids; runs to the context length", function()
    for _, case in ipairs({{model = tiny("cuda"):to("bf16")}, {model = tiny("cuda"), autocast = "bf16"}}) do
      local opts = {max_tokens = 100, temperature = 0, eos = false, autocast = case.autocast}
      local _, g = G(case.model, BYTES, "abc", opts)
      opts.graph = false
      local _, e = G(case.model, BYTES, "abc", opts)
      assert.are.same(e.ids, g.ids)
      assert.are.equal("context", g.finish_reason)
      assert.are.equal(CTX - 3, #g.ids)
    end
  end)

  it("samples reproducibly by seed on the device, the same with and without the graph", function()
    local model = tiny("cuda")
    local opts = {max_tokens = 30, temperature = 1.5, top_k = 50, top_p = 0.9, seed = 3}
    local a, ia = G(model, BYTES, "xyz", opts)
    local b = G(model, BYTES, "xyz", opts)
    opts.graph = false
    local c = G(model, BYTES, "xyz", opts)
    opts.seed = 4
    local d = G(model, BYTES, "xyz", opts)
    assert.is_true(ia.graph)
    assert.are.equal(a, b)
    assert.are.equal(a, c)
    assert.are_not.equal(a, d)
  end)

  it("frees the graph and the cache after the call", function()
    local model = tiny("cuda")
    G(model, BYTES, "again", {max_tokens = 20, temperature = 0})    -- lazily made state (workspaces) exists
    collectgarbage(); collectgarbage()
    ember.cuda.synchronize()
    local before = ember.cuda.memory_allocated()
    for _ = 1, 3 do G(model, BYTES, "again", {max_tokens = 20, temperature = 0}) end
    collectgarbage(); collectgarbage()
    ember.cuda.synchronize()
    assert.are.equal(before, ember.cuda.memory_allocated())
  end)
end)
