-- flash_decode_spec.lua (CPU) — F.flash_decode, generation's decode attention
-- with the key count a tensor (engine/ops/flash_decode.c): the CPU path
-- against the masked composition nn.KVCache's decode step runs
-- (tests/lua/decode_ref.lua), over counts at and around a tile, grouped-query
-- attention, per-batch counts, rows that see no key, clamped counts; its
-- errors; nn.KVCache's decode step through it (EMBER_KV_DECODE, the switch).
-- The CUDA kernels are checked in tests/gpu/flash_decode_spec.lua.
local ember = require "ember"
local F = ember.nn.functional
local nn = ember.nn
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local R = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "decode_ref.lua")

local randn = H.seeded(7700).randn

local function i64(list) return ember.tensor(list, {dtype = "i64"}) end
-- tensors compared element by element in f64 (H.assert_close on their values)
local function close(got, ref, rtol, atol, what)
  H.assert_close(got:to("f64"):tolist(), ref:to("f64"):tolist(), rtol, atol, what)
end

-- F.flash_decode against the masked composition in f64; counts a list of B (or one for all).
-- f64 inputs: both sides in f64, summation order apart (1e-12); f32: the tiled path's f32 arithmetic (1e-5).
local TOL = {f64 = 1e-12, f32 = 1e-5}
local function check(B, Hq, Hkv, Tq, L, d, counts, dt, scale)
  local q, k, v = randn({B, Hq, Tq, d}, dt), randn({B, Hkv, L, d}, dt), randn({B, Hkv, L, d}, dt)
  local got = F.flash_decode(q, k, v, i64(counts), scale and {scale = scale} or nil)
  local per_b = {}
  for b = 1, B do per_b[b] = counts[#counts == 1 and 1 or b] end
  local ref = R.masked(q, k, v, per_b, scale, true)
  assert.are.same({B, Hq, Tq, d}, got.shape)
  assert.are.equal(dt, got.dtype)
  close(got:to("f64"), ref, TOL[dt], TOL[dt], ("B %d H %d/%d Tq %d L %d n %s %s"):format(B, Hq, Hkv, Tq,
    L, table.concat(counts, ","), dt))
end

describe("F.flash_decode on the CPU", function()
  it("equals the masked composition for counts 1, 63, 64, 65 and max_len, Tq 1 and 4", function()
    for _, n in ipairs({4, 63, 64, 65, 80}) do
      check(1, 2, 2, 4, 80, 16, {n}, "f64")
      check(1, 2, 2, 1, 80, 16, {n}, "f32")
    end
    check(1, 2, 2, 1, 80, 16, {1}, "f64")
  end)

  it("runs grouped-query attention and one count per batch (B 3)", function()
    check(3, 8, 2, 4, 70, 32, {70, 5, 33}, "f64")
    check(3, 4, 1, 1, 70, 64, {1, 64, 65}, "f32")
    check(3, 4, 4, 2, 20, 16, {9}, "f64", 0.3)   -- one count for all, a given scale
  end)

  it("ignores the cache past the count (garbage there changes nothing)", function()
    local q, k, v = randn({1, 2, 1, 16}, "f32"), randn({1, 2, 40, 16}, "f32"), randn({1, 2, 40, 16}, "f32")
    local a = F.flash_decode(q, k, v, i64({25}))
    k:narrow(2, 25, 15):fill_(1e4)
    v:narrow(2, 25, 15):fill_(0 / 0)
    close(F.flash_decode(q, k, v, i64({25})), a, 0, 0, "garbage past n_keys")
  end)

  it("gives 0 for the rows that see no key (n_keys < Tq, 0), clamps n_keys to [0, max_len]", function()
    local q, k, v = randn({2, 2, 4, 16}, "f64"), randn({2, 2, 12, 16}, "f64"), randn({2, 2, 12, 16}, "f64")
    local o = F.flash_decode(q, k, v, i64({2, 0}))
    -- batch 0: rows 0, 1 see nothing; rows 2, 3 are a 2-query decode against 2 keys
    close(o:narrow(0, 0, 1):narrow(2, 0, 2), ember.zeros({1, 2, 2, 16}, {dtype = "f64"}), 0, 0, "unseen rows")
    local tail = R.masked(q:narrow(0, 0, 1):narrow(2, 2, 2), k:narrow(0, 0, 1), v:narrow(0, 0, 1), {2}, nil, true)
    close(o:narrow(0, 0, 1):narrow(2, 2, 2), tail, 1e-12, 1e-12, "rows that see keys")
    close(o:narrow(0, 1, 1), ember.zeros({1, 2, 4, 16}, {dtype = "f64"}), 0, 0, "n_keys 0")
    close(F.flash_decode(q, k, v, i64({99, -3})), F.flash_decode(q, k, v, i64({12, 0})), 0, 0, "clamped")
  end)

  it("keeps bf16 and f16 in their dtype, within their rounding of the f64 composition", function()
    for _, dt in ipairs({"bf16", "f16"}) do
      local q, k, v = randn({1, 4, 2, 32}, dt), randn({1, 2, 50, 32}, dt), randn({1, 2, 50, 32}, dt)
      local got = F.flash_decode(q, k, v, i64({37}))
      assert.are.equal(dt, got.dtype)
      -- f32 arithmetic on the half inputs, one rounding of o to the half dtype: 2^-8 (bf16), 2^-11 (f16)
      local tol = dt == "bf16" and 2 ^ -8 or 2 ^ -11
      close(got:to("f64"), R.masked(q, k, v, {37}, nil, true), tol, tol, dt)
    end
  end)

  it("reports bad input clearly", function()
    local q, k, v = randn({1, 2, 1, 16}, "f32"), randn({1, 2, 8, 16}, "f32"), randn({1, 2, 8, 16}, "f32")
    local n = i64({3})
    local function err(f, msg)
      local ok, e = pcall(f)
      assert.is_false(ok)
      assert.is_truthy(tostring(e):find(msg, 1, true), ("expected %q in %q"):format(msg, tostring(e)))
    end
    err(function() F.flash_decode(q:view(2, 16), k, v, n) end, "expected q of shape (B, H, Tq, D), got [2, 16]")
    err(function() F.flash_decode(q, k:narrow(2, 0, 4), v, n) end,
      "expected q (B, H, Tq, D), k_cache and v_cache (B, Hkv, max_len, D) with H a multiple of Hkv")
    err(function() F.flash_decode(randn({1, 3, 1, 16}, "f32"), k, v, n) end, "with H a multiple of Hkv")
    err(function() F.flash_decode(q, k:to("f64"), v, n) end,
      "expected q, k_cache and v_cache to have the same dtype, got f32, f64 and f32")
    err(function() F.flash_decode(randn({1, 2, 17, 16}, "f32"), k, v, n) end,
      "expected 1 to 16 queries (Tq), got 17")
    err(function() F.flash_decode(randn({1, 2, 1, 48}, "f32"), randn({1, 2, 8, 48}, "f32"), randn({1, 2, 8, 48},
      "f32"), n) end, "no kernel for head dim 48")
    err(function() F.flash_decode(q, k, v, ember.tensor({3}, {dtype = "i32"})) end,
      "expected n_keys to be an i64 tensor of shape (1) or (1) (the batch), got i32 of shape [1]")
    err(function() F.flash_decode(q, k, v, i64({3, 4})) end, "got i64 of shape [2]")
    err(function() F.flash_decode(q, k, v, 3) end, "expected a tensor for 'n_keys', got number")
    err(function() F.flash_decode(q, k, v, n, {scale = 1, causal = true}) end, "unknown option 'causal'")
    err(function() F.flash_decode(q, k, v, n, "x") end, "expected a scale (number) or an options table")
    err(function() F.flash_decode(q, k, v, n, 0 / 0) end, "expected a finite scale, got")
    local ql = q:clone()
    ql.requires_grad = true
    err(function() F.flash_decode(ql, k, v, n) end, "flash_decode: forward only (no gradient")
    ember.no_grad(function() F.flash_decode(ql, k, v, n) end)   -- fine without grad mode
  end)
end)

-- A tiny model and its greedy decode through a KVCache: the ids and the last logits.
local function decode_run(impl, dtype)
  ember.manual_seed(3)
  local m = nn.TransformerLM{vocab_size = 64, context_length = 40, d_model = 64, d_ff = 96, num_layers = 2,
    num_heads = 4, dtype = dtype}
  local kv = nn.KVCache(m, {batch = 2, max_len = 40})
  kv.decode_impl = impl   -- what EMBER_KV_DECODE=flash picks on CUDA; forced here so the CPU runs the same Lua
  local ids = ember.tensor({{1, 5, 9, 2, 7}, {3, 3, 8, 1, 0}}, {dtype = "i64"})
  local out, logits = {}, nil
  ember.no_grad(function()
    logits = m:forward(ids, {cache = kv})
    for _ = 1, 20 do
      local nxt = logits:narrow(1, logits.shape[2] - 1, 1):argmax(-1)   -- (2, 1)
      for _, row in ipairs(nxt:tolist()) do out[#out + 1] = row[1] end
      logits = m:forward(nxt, {cache = kv})
    end
  end)
  return out, logits
end

describe("nn.KVCache's decode step through F.flash_decode", function()
  it("generates what the masked composition does (n_keys = pos + 1 after the scatter)", function()
    local real, calls = F.flash_decode, 0
    F.flash_decode = function(...) calls = calls + 1; return real(...) end
    local ok, a, la = pcall(decode_run, "masked", "f64")
    local masked_calls = calls
    local ok2, b, lb = pcall(decode_run, "flash", "f64")
    F.flash_decode = real
    assert(ok, a)
    assert(ok2, b)
    assert.are.equal(0, masked_calls)
    assert.are.equal(2 * 20, calls)   -- every layer of every decode step
    assert.are.same(a, b)
    close(lb, la, 1e-10, 1e-10, "last step's logits (f64)")
  end)

  it("picks masked unless EMBER_KV_DECODE=flash and CUDA; refuses other values", function()
    local m = nn.TransformerLM{vocab_size = 16, context_length = 8, d_model = 32, d_ff = 32, num_layers = 1,
      num_heads = 2}
    assert.are.equal("masked", nn.KVCache(m).decode_impl)   -- the CPU: masked whatever the switch
    local script = H.temp_file([[
      local ember = require "ember"
      local m = ember.nn.TransformerLM{vocab_size = 16, context_length = 8, d_model = 32, d_ff = 32,
        num_layers = 1, num_heads = 2}
      io.write(ember.nn.KVCache(m).decode_impl)]], ".lua")
    for _, mode in ipairs({"masked", "flash"}) do
      local out, err = H.ember({"run", script}, {env = {EMBER_KV_DECODE = mode}})
      assert.are.equal("", err or "")
      assert.are.equal("masked", out)
    end
    H.switch_refuses(script, "EMBER_KV_DECODE", "fast", "EMBER_KV_DECODE must be 'masked' or 'flash', got 'fast'")
    H.remove_temps()
  end)
end)
