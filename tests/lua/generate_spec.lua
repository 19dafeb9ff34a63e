-- generate_spec.lua — generation with a KV cache (nn.KVCache, TransformerLM's
-- cached forward), the sampling filters (temperature → top-k → top-p),
-- ember.generate (greedy against the uncached model run step by step,
-- seeding, stopping, streaming, option checks) and generate.load on a
-- checkpoint folder in train.lua's layout, on the CPU with tiny models.
-- The script (scripts/generate.lua) is run end to end in generate_script_spec.lua.
local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local nn = ember.nn
local G = ember.generate

-- A tiny LM: V tokens, context C, in dtype dt (f64: cached vs uncached differ
-- only by summation order, so 1e-12 holds them together).
local function tiny(seed, dt, V, C)
  ember.manual_seed(seed)
  return nn.TransformerLM{vocab_size = V or 64, context_length = C or 24, d_model = 16, d_ff = 40,
    num_layers = 2, num_heads = 2, dtype = dt or "f64"}
end

-- Bytes as tokens (ids 0..255): a tokenizer with no training to wait for.
local BYTES = {
  encode = function(_, s) return {s:byte(1, -1)} end,
  decode = function(_, ids)
    local t = {}
    for i, id in ipairs(ids) do t[i] = string.char(id) end
    return table.concat(t)
  end,
  vocab_size = function() return 256 end,
}

local function uncached(model, ids)
  return ember.no_grad(function() return model(ids) end)
end

-- Greedy continuation of `ids` (a Lua list) by the uncached model, n tokens.
local function greedy_reference(model, ids, n)
  local all, out = table.move(ids, 1, #ids, 1, {}), {}
  for _ = 1, n do
    local logits = uncached(model, ember.tensor({all}, {dtype = "i64"}))
    local id = logits:select(1, #all - 1):argmax():item()
    all[#all + 1], out[#out + 1] = id, id
  end
  return out
end

describe("nn.KVCache with TransformerLM:forward(ids, {cache = kv})", function()
  it("prefill, then one token at a time, equals the uncached forward at every position (f64)", function()
    local m = tiny(1)
    local ids = ember.randint(0, 64, {2, 20})
    local full = uncached(m, ids)
    local kv = nn.KVCache(m, {batch = 2})
    local got = m:forward(ids:narrow(1, 0, 7), {cache = kv})
    assert.are.same({2, 7, 64}, got.shape)
    assert.is_true(H.maxdiff(got, full:narrow(1, 0, 7)) < 1e-12)
    assert.are.equal(7, kv.len)
    for t = 7, 19 do
      got = m:forward(ids:narrow(1, t, 1), {cache = kv})
      -- 1e-12: the same f64 arithmetic summed in another order (keys masked by -inf add exact zeros)
      assert.is_true(H.maxdiff(got, full:narrow(1, t, 1)) < 1e-12, "position " .. t)
    end
    assert.are.equal(20, kv.len)
    assert.are.equal(20, kv.pos:item())
  end)

  it("a chunk after a prefix (Tq < Tk) sees the keys up to its own position (end-aligned mask)", function()
    local m = tiny(2)
    local ids = ember.randint(0, 64, {1, 18})
    local full = uncached(m, ids)
    local kv = nn.KVCache(m)
    m:forward(ids:narrow(1, 0, 5), {cache = kv})
    local got = m:forward(ids:narrow(1, 5, 6), {cache = kv})         -- Tq 6 against Tk 11
    assert.is_true(H.maxdiff(got, full:narrow(1, 5, 6)) < 1e-12)
    got = m:forward(ids:narrow(1, 11, 1), {cache = kv})
    assert.is_true(H.maxdiff(got, full:narrow(1, 11, 1)) < 1e-12)
    got = m:forward(ids:narrow(1, 12, 6), {cache = kv})
    assert.is_true(H.maxdiff(got, full:narrow(1, 12, 6)) < 1e-12)
  end)

  it("decodes from position 0 (a one-token prompt) and matches in f32", function()
    local m = tiny(3, "f32")
    local ids = ember.randint(0, 64, {1, 10})
    local full = uncached(m, ids)
    local kv = nn.KVCache(m, {max_len = 10})
    for t = 0, 9 do
      local got = m:forward(ids:narrow(1, t, 1), {cache = kv})
      -- f32 with a different summation order: ~1e-6 on O(1) logits
      assert.is_true(H.maxdiff(got, full:narrow(1, t, 1)) < 1e-5, "position " .. t)
    end
  end)

  it("a decode step takes its position from kv.pos only (what lets one CUDA graph serve every step)", function()
    local m = tiny(11)
    local ids = ember.randint(0, 64, {1, 16})
    local full = uncached(m, ids)
    local kv = nn.KVCache(m)
    m:forward(ids:narrow(1, 0, 4), {cache = kv})
    for t = 4, 15 do
      kv.len = 4            -- the host count frozen, as a replayed graph leaves it
      local got = m:forward(ids:narrow(1, t, 1), {cache = kv})
      assert.is_true(H.maxdiff(got, full:narrow(1, t, 1)) < 1e-12, "position " .. t)
      assert.are.equal(t + 1, kv.pos:item())
    end
  end)

  it("keys are rotated at their absolute positions (RoPE): a shifted prompt gives other logits", function()
    local m = tiny(4)
    local ids = ember.randint(0, 64, {1, 6})
    local kv = nn.KVCache(m)
    m:forward(ember.randint(0, 64, {1, 3}), {cache = kv})
    local a = m:forward(ids, {cache = kv})                           -- positions 3..8
    local b = uncached(m, ember.cat({ember.zeros({1, 3}, {dtype = "i64"}), ids}, 1)):narrow(1, 3, 6)
    local c = uncached(m, ids)                                       -- positions 0..5
    assert.is_true(H.maxdiff(a, c) > 1e-3)                           -- not position-blind
    assert.is_true(H.maxdiff(a, b) > 1e-6)                           -- and the prefix matters
  end)

  it("seek rewinds: decoding again from a kept prefix gives the same logits", function()
    local m = tiny(5)
    local ids = ember.randint(0, 64, {1, 12})
    local kv = nn.KVCache(m)
    m:forward(ids:narrow(1, 0, 8), {cache = kv})
    local first = m:forward(ids:narrow(1, 8, 1), {cache = kv})
    m:forward(ids:narrow(1, 9, 3), {cache = kv})
    kv:seek(8)
    assert.are.equal(8, kv.len)
    assert.are.equal(8, kv.pos:item())
    assert.is_true(H.maxdiff(m:forward(ids:narrow(1, 8, 1), {cache = kv}), first) == 0)
    kv:reset()
    assert.are.equal(0, kv.len)
  end)

  it("works under autocast (bf16 cache) within bf16's tolerance", function()
    local m = tiny(6, "f32")
    local ids = ember.randint(0, 64, {1, 9})
    local full = ember.autocast("bf16", uncached, m, ids)
    local kv = ember.autocast("bf16", function() return nn.KVCache(m) end)
    assert.are.equal("bf16", kv.dtype)
    ember.autocast("bf16", function() m:forward(ids:narrow(1, 0, 4), {cache = kv}) end)
    for t = 4, 8 do
      local got = ember.autocast("bf16", function() return m:forward(ids:narrow(1, t, 1), {cache = kv}) end)
      -- bf16 roundings (2^-9 each) through two layers on logits of size ~3: 0.1 absolute
      assert.is_true(H.maxdiff(got, full:narrow(1, t, 1)) < 0.1, "position " .. t)
    end
  end)

  it("refuses to overflow max_len, naming what it holds, and leaves the cache as it was", function()
    local m = tiny(7)
    local kv = nn.KVCache(m, {max_len = 6})
    m:forward(ember.randint(0, 64, {1, 5}), {cache = kv})
    local ok, err = pcall(m.forward, m, ember.randint(0, 64, {1, 2}), {cache = kv})
    assert.is_false(ok)
    assert.matches("ember.nn.TransformerLM: KV cache overflow: it holds 5 of max_len 6 positions, " ..
      "cannot append 2 more", err, 1, true)
    assert.are.equal(5, kv.len)
    m:forward(ember.randint(0, 64, {1, 1}), {cache = kv})           -- the last free position
    ok, err = pcall(m.forward, m, ember.randint(0, 64, {1, 1}), {cache = kv})
    assert.is_false(ok)
    assert.matches("holds 6 of max_len 6", err, 1, true)
  end)

  it("refuses bad caches, options and ids with clear errors", function()
    local m = tiny(8)
    local kv = nn.KVCache(m, {batch = 2})
    local ids = ember.randint(0, 64, {1, 3})
    local cases = {
      {function() return m:forward(ids, {cache = kv}) end,
        "ember.nn.TransformerLM: expected ids of batch 2 (the KV cache's), got batch 1"},
      {function() return m:forward(ids, {cache = {}}) end,
        "ember.nn.TransformerLM: expected opts.cache to be an nn.KVCache, got table"},
      {function() return m:forward(ids, {kv = kv}) end,
        "ember.nn.TransformerLM: unknown option 'kv' (expected cache)"},
      {function() return m:forward(ember.randint(0, 64, {6}), {cache = kv}) end,
        "ember.nn.TransformerLM: expected ids (B, T) as an integer tensor with a KV cache, got shape [6]"},
      {function()
        ember.manual_seed(9)
        local deeper = nn.TransformerLM{vocab_size = 64, context_length = 24, d_model = 16, d_ff = 40,
          num_layers = 3, num_heads = 2, dtype = "f64"}
        return m:forward(ids, {cache = nn.KVCache(deeper)})
      end, "ember.nn.TransformerLM: expected a KV cache of 2 layers (this model's), got 3"},
      {function() return nn.KVCache(m, {max_len = 25}) end,
        "ember.nn.KVCache: expected max_len to be an integer in [1, 24] (the model's context_length), got 25"},
      {function() return nn.KVCache(m, {batch = 0}) end,
        "ember.nn.KVCache: expected batch to be a positive integer, got 0"},
      {function() return nn.KVCache(m, {dtype = "i64"}) end,
        "ember.nn.KVCache: expected a floating-point dtype (f32, f64, bf16, f16), got i64"},
      {function() return nn.KVCache(m, {size = 3}) end,
        "ember.nn.KVCache: unknown option 'size' (expected batch, max_len, dtype, device)"},
      {function() return nn.KVCache(42) end, "ember.nn.KVCache: expected a TransformerLM, got number"},
      {function() return kv:seek(1) end,
        "ember.nn.KVCache.seek: expected an integer in [0, 0] (the positions filled), got 1"},
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok, c[2])
      assert.are.equal(c[2], H.strip_where(err))
    end
  end)

  it("leaves the uncached forward as it was (autograd records, no cache touched)", function()
    local m = tiny(10)
    local ids = ember.randint(0, 64, {2, 5})
    local y = m(ids)
    assert.is_true(y.requires_grad)
    y:sum():backward()
    assert.is_not_nil(m.lm_head.weight.grad)
  end)
end)

describe("sampling: generate.filter_logits and generate.sample", function()
  local function logits_of(probs) return ember.tensor({probs}, {dtype = "f64"}):log() end
  -- which entries survive (not -inf), as a list of 0/1
  local function kept(x)
    local out = {}
    for i, v in ipairs(x:tolist()[1]) do out[i] = v == -math.huge and 0 or 1 end
    return out
  end

  it("top_p keeps the smallest most-likely set whose mass reaches top_p (a hand-made distribution)", function()
    local l = logits_of({0.15, 0.5, 0.1, 0.25})
    assert.are.same({0, 1, 0, 0}, kept(G.filter_logits(l, {top_p = 0.3})))
    assert.are.same({0, 1, 0, 0}, kept(G.filter_logits(l, {top_p = 0.5})))     -- 0.5 reaches 0.5
    assert.are.same({0, 1, 0, 1}, kept(G.filter_logits(l, {top_p = 0.7})))
    assert.are.same({1, 1, 0, 1}, kept(G.filter_logits(l, {top_p = 0.8})))
    assert.are.same({1, 1, 1, 1}, kept(G.filter_logits(l, {top_p = 0.95})))
    assert.are.same({1, 1, 1, 1}, kept(G.filter_logits(l, {top_p = 1})))
    assert.are.same({0, 1, 0, 0}, kept(G.filter_logits(l, {top_p = 1e-9})))   -- never empty
  end)

  it("top_k keeps the k largest; the kept logits are unchanged (temperature 1)", function()
    local l = logits_of({0.15, 0.5, 0.1, 0.25})
    local x = G.filter_logits(l, {top_k = 2})
    assert.are.same({0, 1, 0, 1}, kept(x))
    H.assert_close(x:tolist()[1][2], math.log(0.5), 1e-6)   -- f32 logits
    assert.are.same({1, 1, 1, 1}, kept(G.filter_logits(l, {top_k = 4})))
    assert.are.same({1, 1, 1, 1}, kept(G.filter_logits(l, {top_k = 0})))
  end)

  it("divides by the temperature first, then top-k, then top-p (on what top-k left)", function()
    local l = logits_of({0.4, 0.3, 0.2, 0.1})
    H.assert_close(G.filter_logits(l, {temperature = 2}):tolist()[1], H.map(l:tolist()[1],
      function(v) return v / 2 end), 1e-6)
    -- top-k 2 leaves {0.4, 0.3} -> renormalised 0.571, 0.429: top_p 0.55 keeps one
    -- (top-p first, over the whole row, would keep two: 0.4 < 0.55)
    assert.are.same({1, 0, 0, 0}, kept(G.filter_logits(l, {top_k = 2, top_p = 0.55})))
    -- temperature 0.5 sharpens to {0.533, 0.3, 0.133, 0.033}: top_p 0.5 keeps one
    -- (at temperature 1 it keeps two: 0.4 < 0.5)
    assert.are.same({1, 0, 0, 0}, kept(G.filter_logits(l, {temperature = 0.5, top_p = 0.5})))
    assert.are.same({1, 1, 0, 0}, kept(G.filter_logits(l, {top_p = 0.5})))
  end)

  it("samples only what the filters keep; temperature 0 is the argmax", function()
    local row = {0.15, 0.5, 0.1, 0.25}
    local rows = {}
    for i = 1, 300 do rows[i] = row end
    local l = ember.tensor(rows):log()
    ember.manual_seed(11)
    local s = G.sample(l, {top_p = 0.7})
    assert.are.same({300, 1}, s.shape)
    local counts = {[0] = 0, 0, 0, 0}
    for _, v in ipairs(H.flat(s)) do counts[v] = counts[v] + 1 end
    assert.are.equal(0, counts[0] + counts[2])
    -- kept: 0.5 and 0.25 renormalised to 2/3 and 1/3; 300 draws: 200 ± 3 sd (8.2 each)
    assert.is_true(math.abs(counts[1] - 200) < 25, "count of id 1: " .. counts[1])
    assert.are.same(H.flat(l:argmax(-1)), H.flat(G.sample(l, {temperature = 0})))
  end)

  it("refuses bad options and logits with clear errors", function()
    local l = ember.randn(2, 5)
    local cases = {
      {function() return G.filter_logits(l, {top_p = 0}) end,
        "ember.generate.filter_logits: expected top_p in (0, 1] (1: off), got 0"},
      {function() return G.filter_logits(l, {top_p = 1.5}) end,
        "ember.generate.filter_logits: expected top_p in (0, 1] (1: off), got 1.5"},
      {function() return G.filter_logits(l, {top_k = -1}) end,
        "ember.generate.filter_logits: expected top_k to be an integer >= 0 (0: off), got -1"},
      {function() return G.filter_logits(l, {top_k = 1.5}) end,
        "ember.generate.filter_logits: expected top_k to be an integer >= 0 (0: off), got 1.5"},
      {function() return G.filter_logits(l, {temperature = -1}) end,
        "ember.generate.filter_logits: expected temperature to be a finite number >= 0 (0: greedy), got -1"},
      {function() return G.filter_logits(l, {temperature = 0}) end,
        "ember.generate.filter_logits: expected temperature > 0 (greedy decoding filters nothing), got 0"},
      {function() return G.filter_logits(ember.tensor({1, 2}, {dtype = "i64"})) end,
        "ember.generate.filter_logits: expected logits (..., V) as a floating-point tensor, got i64 of shape [2]"},
      {function() return G.sample(ember.randn(5)) end,
        "ember.generate.sample: expected logits (B, V), got shape [5]"},
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok, c[2])
      assert.are.equal(c[2], H.strip_where(err))
    end
  end)
end)

describe("ember.generate", function()
  it("greedy (temperature 0) equals the argmax of the uncached model run step by step", function()
    local m = tiny(20, "f64", 256, 40)
    local text, info = G(m, BYTES, "hello", {max_tokens = 20, temperature = 0, eos = false})
    local want = greedy_reference(m, {104, 101, 108, 108, 111}, 20)
    assert.are.same(want, info.ids)
    assert.are.equal(BYTES:decode(want), text)
    assert.are.equal("length", info.finish_reason)
    assert.are.equal(20, info.generated_tokens)
    assert.are.equal(5, info.prompt_tokens)
    assert.is_true(info.cache)
    assert.is_false(info.graph)                                     -- no graphs on the CPU
    assert.is_true(info.decode_tokens_per_s > 0 and info.prefill_tokens_per_s > 0)
    -- and without the cache (the whole sequence every step): the same ids
    local _, info2 = G(m, BYTES, "hello", {max_tokens = 20, temperature = 0, eos = false, cache = false})
    assert.are.same(want, info2.ids)
    assert.is_false(info2.cache)
  end)

  it("top_k = 1 is greedy at any temperature", function()
    local m = tiny(21, "f32", 256, 40)
    local _, g = G(m, BYTES, "abc", {max_tokens = 15, temperature = 0})
    local _, k1 = G(m, BYTES, "abc", {max_tokens = 15, temperature = 1.7, top_k = 1, seed = 5})
    assert.are.same(g.ids, k1.ids)
  end)

  it("is reproducible by seed, and another seed gives another text; the caller's stream is untouched", function()
    -- temperature 3 over 256 tokens of a random model: ~uniform draws, so two
    -- seeds giving the same 24 tokens has probability ~256^-24
    local m = tiny(22, "f32", 256, 40)
    ember.manual_seed(123)
    local before = ember.get_rng_state()
    local opts = {max_tokens = 24, temperature = 3, seed = 1}
    local a = G(m, BYTES, "xy", opts)
    local b = G(m, BYTES, "xy", opts)
    local c = G(m, BYTES, "xy", {max_tokens = 24, temperature = 3, seed = 2})
    assert.are.same(before, ember.get_rng_state())
    assert.are.equal(a, b)
    assert.are_not.equal(a, c)
    assert.are.equal(24, #a)
  end)

  it("stops at the end-of-text token (the tokenizer's <|endoftext|> by default), which it does not print", function()
    local m = tiny(23, "f64", 256, 40)
    local _, g = G(m, BYTES, "hi", {max_tokens = 12, temperature = 0})
    local eos = g.ids[4]
    local first = 1
    while g.ids[first] ~= eos do first = first + 1 end
    local tok = setmetatable({id_of = function(_, name) return name == "<|endoftext|>" and eos or nil end},
      {__index = BYTES})
    local text, info = G(m, tok, "hi", {max_tokens = 12, temperature = 0})
    assert.are.equal("eos", info.finish_reason)
    assert.are.same(table.move(g.ids, 1, first, 1, {}), info.ids)        -- the eos id is the last id
    assert.are.equal(BYTES:decode(table.move(g.ids, 1, first - 1, 1, {})), text)
    local _, off = G(m, tok, "hi", {max_tokens = 12, temperature = 0, eos = false})
    assert.are.same(g.ids, off.ids)
  end)

  it("stops at a stop string, cut from the text, and streams exactly the returned text", function()
    local m = tiny(24, "f64", 256, 40)
    local full = G(m, BYTES, "ab", {max_tokens = 16, temperature = 0})
    local stop = full:sub(6, 8)
    local cut = full:sub(1, full:find(stop, 1, true) - 1)
    local pieces, ids = {}, {}
    local text, info = G(m, BYTES, "ab", {max_tokens = 16, temperature = 0, stop = {"\0\0never", stop},
      stream = function(piece, id) pieces[#pieces + 1] = piece; ids[#ids + 1] = id end})
    assert.are.equal("stop", info.finish_reason)
    assert.are.equal(cut, text)
    assert.are.equal(cut, table.concat(pieces))
    -- without stop strings each token streams its own text at once
    pieces, ids = {}, {}
    local text2, info2 = G(m, BYTES, "ab", {max_tokens = 16, temperature = 0,
      stream = function(piece, id) pieces[#pieces + 1] = piece; ids[#ids + 1] = id end})
    assert.are.equal(full, text2)
    assert.are.same(info2.ids, ids)
    for i, id in ipairs(ids) do assert.are.equal(string.char(id), pieces[i]) end
  end)

  it("stops at the context length, takes a prompt of ids, and works without a tokenizer", function()
    local m = tiny(25, "f32", 64, 12)
    local text, info = G(m, nil, {1, 2, 3}, {max_tokens = 50, temperature = 0})
    assert.is_nil(text)
    assert.are.equal("context", info.finish_reason)
    assert.are.equal(9, #info.ids)                                     -- 3 + 9 = context 12
    local _, ref = G(m, nil, {1, 2, 3}, {max_tokens = 9, temperature = 0, cache = false})
    assert.are.same(ref.ids, info.ids)
    local none, i0 = G(tiny(25, "f32", 256, 12), BYTES, "abc", {max_tokens = 0})
    assert.are.equal("", none)
    assert.are.same({}, i0.ids)
  end)

  it("never samples ids the tokenizer cannot decode (model vocab > tokenizer vocab)", function()
    local m = tiny(26, "f32", 300, 40)
    local _, info = G(m, BYTES, "q", {max_tokens = 30, temperature = 5, seed = 3})
    for _, id in ipairs(info.ids) do assert.is_true(id < 256, "id " .. id) end
  end)

  it("refuses bad arguments with clear errors", function()
    local m = tiny(27, "f32", 256, 16)
    local cases = {
      {{m, BYTES, "x", {top_p = 0}}, "ember.generate: expected top_p in (0, 1] (1: off), got 0"},
      {{m, BYTES, "x", {top_k = -2}}, "ember.generate: expected top_k to be an integer >= 0 (0: off), got -2"},
      {{m, BYTES, "x", {temperature = "hot"}},
        "ember.generate: expected temperature to be a finite number >= 0 (0: greedy), got hot"},
      {{m, BYTES, "x", {max_tokens = -1}}, "ember.generate: expected max_tokens to be an integer >= 0, got -1"},
      {{m, BYTES, "x", {seed = 0.5}}, "ember.generate: expected seed to be an integer, got 0.5"},
      {{m, BYTES, "x", {stop = 3}}, "ember.generate: expected stop to be a string or a list of strings, got number"},
      {{m, BYTES, "x", {stop = {""}}},
        'ember.generate: expected stop strings to be non-empty strings, got "" at position 1'},
      {{m, BYTES, "x", {eos = "x"}}, "ember.generate: expected eos to be a token id or false, got x"},
      {{m, BYTES, "x", {stream = 1}}, "ember.generate: expected stream to be a function(text, id), got number"},
      {{m, BYTES, "x", {graph = true}},
        "ember.generate: graph = true needs a model on a CUDA device (this one is on the CPU)"},
      {{m, BYTES, "x", {autocast = "f32"}}, 'ember.generate: expected autocast "bf16", "f16" or false, got f32'},
      {{m, BYTES, "x", {topp = 1}}, "ember.generate: unknown option 'topp' (expected max_tokens, temperature, " ..
        "top_k, top_p, seed, stop, eos, stream, graph, cache, autocast)"},
      {{m, BYTES, "x", 5}, "ember.generate: expected an options table, got number"},
      {{m, BYTES, string.rep("z", 16)},
        "ember.generate: the prompt has 16 tokens, the model's context_length is 16 (at most 15 leaves room to generate)"},
      {{m, BYTES, ""}, "ember.generate: expected a non-empty prompt (there is no end-of-text token to start from)"},
      {{m, BYTES, {1, 256}},
        "ember.generate: expected prompt ids in [0, 256) (the model's vocab_size), got 256 at position 2"},
      {{m, BYTES, {1, 2.5}}, "ember.generate: expected the prompt's ids to be integers, got 2.5 at position 2"},
      {{m, nil, "text"}, "ember.generate: a text prompt needs a tokenizer (argument 2), got nil"},
      {{m, BYTES, 7}, "ember.generate: expected the prompt as a string or a list of token ids, got number"},
      {{"model", BYTES, "x"}, "ember.generate: expected a TransformerLM as argument 1, got string"},
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(function() return G(table.unpack(c[1], 1, 4)) end)
      assert.is_false(ok, c[2])
      assert.are.equal(c[2], H.strip_where(err))
    end
  end)

  it("starts an empty prompt from <|endoftext|> when the tokenizer has one", function()
    local m = tiny(28, "f32", 256, 16)
    local tok = setmetatable({id_of = function(_, name) return name == "<|endoftext|>" and 0 or nil end},
      {__index = BYTES})
    local _, info = G(m, tok, "", {max_tokens = 3, temperature = 0, eos = false})
    assert.are.same({0}, info.prompt_ids)
    assert.are.equal(3, #info.ids)
  end)
end)
