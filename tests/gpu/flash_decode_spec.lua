-- flash_decode_spec.lua (GPU) — F.flash_decode on CUDA: the split-key decode
-- kernels with the key count read on the device (kernels/flash_decode.cu,
-- engine/ops/flash_decode.c), as nn.KVCache's decode step runs them under
-- EMBER_KV_DECODE=flash.
--
-- Reference: the masked composition (tests/lua/decode_ref.lua) in f64 on the
-- CPU from the same inputs. Error measure: ‖got − ref‖ / ‖ref‖ (compare.lua).
-- Bound, the flash specs' (tests/gpu/flash_spec.lua): bf16/f16 no more than
-- twice the error of the masked composition run on the GPU in the same dtype,
-- plus 1e-4, under a cap (1e-2 bf16, 2e-3 f16); f32 1e-5 (the decode kernel
-- is f32 arithmetic throughout, no TF32 step). The cache past the count holds
-- garbage (1000s): a kernel that reads past n_keys is far off.
local ember = require "ember"
local F = ember.nn.functional
local nn = ember.nn
local G = ember.generate

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local C, H = dofile(here .. "compare.lua")
local R = dofile(here .. "../lua/decode_ref.lua")
local rel = C.rel_error

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local CAP = {bf16 = 1e-2, f16 = 2e-3}
local F32_TOL = 1e-5
local randn = H.seeded(9300).randn

local function i64(list) return ember.tensor(list, {dtype = "i64", device = "cuda"}) end
local function per_batch(counts, B)
  local t = {}
  for b = 1, B do t[b] = counts[#counts == 1 and 1 or b] end
  return t
end

-- q, k, v on CUDA; the cache past each batch's count filled with 1000
local function inputs(B, Hq, Hkv, Tq, L, d, counts, dt)
  local q, k, v = randn({B, Hq, Tq, d}, dt), randn({B, Hkv, L, d}, dt), randn({B, Hkv, L, d}, dt)
  for b, n in ipairs(per_batch(counts, B)) do
    if n < L then
      k:narrow(0, b - 1, 1):narrow(2, n, L - n):fill_(1000)
      v:narrow(0, b - 1, 1):narrow(2, n, L - n):fill_(1000)
    end
  end
  return q:cuda(), k:cuda(), v:cuda()
end

-- F.flash_decode vs the f64 masked composition, within the flash specs' bound
local function check(B, Hq, Hkv, Tq, L, d, counts, dt)
  local q, k, v = inputs(B, Hq, Hkv, Tq, L, d, counts, dt)
  local n = per_batch(counts, B)
  local got = F.flash_decode(q, k, v, i64(counts))
  local ref = R.masked(q, k, v, n, nil, true)
  local what = ("%s B %d H %d/%d Tq %d max_len %d d %d n_keys %s"):format(dt, B, Hq, Hkv, Tq, L, d,
    table.concat(counts, ","))
  assert.are.equal(dt, got.dtype, what)
  assert.are.same({B, Hq, Tq, d}, got.shape, what)
  local bound = F32_TOL
  if dt ~= "f32" then bound = math.min(2 * rel(R.masked(q, k, v, n), ref) + 1e-4, CAP[dt]) end
  local e = rel(got, ref)
  assert.is_true(e <= bound, ("%s: error %.3g > %.3g"):format(what, e, bound))
end

describe("F.flash_decode on CUDA", function()
  it("matches the masked composition for n_keys 1, 63, 64, 65, a split's end and max_len (Tq 1 and 4)", function()
    -- B 1, Hkv 2, max_len 2048: 8 splits of 256 keys, those past n_keys empty
    for _, n in ipairs({1, 4, 63, 64, 65, 256, 257, 1000, 2048}) do
      check(1, 2, 2, 1, 2048, 64, {n}, "bf16")
      if n >= 4 then check(1, 2, 2, 4, 2048, 128, {n}, "f16") end
    end
  end)

  it("runs grouped-query attention, one count per batch (B 3), every dtype", function()
    for _, dt in ipairs({"bf16", "f16", "f32"}) do
      check(3, 8, 2, 1, 1024, 64, {1, 700, 1024}, dt)
      check(3, 8, 2, 4, 1024, 128, {65, 4, 513}, dt)
      check(3, 4, 4, 1, 512, 64, {300}, dt)          -- one count for all
    end
    check(33, 8, 8, 1, 64, 32, {40}, "bf16")          -- 264 blocks: one split, o written directly
    for _, d in ipairs({16, 80, 96, 256}) do check(1, 4, 2, 2, 600, d, {333}, "bf16") end
  end)

  it("gives 0 for rows that see no key, and clamps a count past max_len (no host read to check it)", function()
    local q, k, v = inputs(2, 2, 2, 4, 300, 64, {300}, "bf16")
    local o = F.flash_decode(q, k, v, i64({2, 0}))
    assert.are.equal(0, o:narrow(0, 0, 1):narrow(2, 0, 2):abs():max():item())   -- rows 0, 1 of batch 0
    assert.are.equal(0, o:narrow(0, 1, 1):abs():max():item())                   -- batch 1: n_keys 0
    assert.are.equal(0, o:isnan():sum():item())
    local tail = R.masked(q:narrow(0, 0, 1):narrow(2, 2, 2), k:narrow(0, 0, 1), v:narrow(0, 0, 1), {2}, nil, true)
    assert.is_true(rel(o:narrow(0, 0, 1):narrow(2, 2, 2), tail) < CAP.bf16)
    C.assert_equal(F.flash_decode(q, k, v, i64({5000, -7})), F.flash_decode(q, k, v, i64({300, 0})), "clamped")
  end)

  it("agrees with the CPU path (the tiled reference) and repeats bit for bit", function()
    local q, k, v = inputs(2, 8, 2, 3, 777, 128, {777}, "bf16")
    local n = i64({500, 777})
    local a, b = F.flash_decode(q, k, v, n), F.flash_decode(q, k, v, n)
    C.assert_equal(b, a, "repeat")
    local cpu = F.flash_decode(q:cpu():float(), k:cpu():float(), v:cpu():float(), n:cpu())
    assert.is_true(rel(a, cpu) < 8e-3, "vs the CPU path")
  end)

  it("serves every count from one captured CUDA graph, the count changed between replays", function()
    local q, k, v = inputs(2, 8, 2, 1, 1024, 64, {1024}, "bf16")
    local n = i64({1, 1})
    local g, out = ember.cuda.graph(function() return F.flash_decode(q, k, v, n) end, {warmup = 1})
    for _, c in ipairs({{1, 700}, {64, 65}, {1024, 300}, {513, 2}, {1, 1}}) do
      n:copy_(ember.tensor(c, {dtype = "i64"}))
      g:replay()
      ember.cuda.synchronize()
      C.assert_equal(out, F.flash_decode(q, k, v, n), "replay vs eager, n_keys " .. table.concat(c, ","))
      local e = rel(out, R.masked(q, k, v, c, nil, true))
      assert.is_true(e < CAP.bf16, ("replay n_keys %s: error %.3g"):format(table.concat(c, ","), e))
    end
    g:close()
  end)
end)

-- A tiny model, the same weights on every run (one Philox stream)
local function tiny(dtype)
  ember.manual_seed(7)
  return nn.TransformerLM{vocab_size = 256, context_length = 96, d_model = 64, d_ff = 128, num_layers = 2,
    num_heads = 4, device = "cuda", dtype = dtype}
end

describe("nn.KVCache's decode step through F.flash_decode on CUDA", function()
  -- the graphed decode with kv.decode_impl forced to flash against eager masked decoding: f32 both exact-ish
  -- (the kernel's f32 against the composition's f32 matmuls: 1e-5 of ~3-sized logits); bf16 the cached
  -- forward's bf16 rounding (masked rounds the scores and probabilities to bf16, flash keeps them f32)
  local function graph_flash_vs_masked(model, tol)
    local ids = ember.randint(0, 256, {2, 90}):cuda()
    local flash_kv = nn.KVCache(model, {batch = 2})
    flash_kv.decode_impl = "flash"
    local masked = G.Decoder(model, nn.KVCache(model, {batch = 2}))
    local flash = G.Decoder(model, flash_kv, {graph = true})
    local prompt = ids:narrow(1, 0, 8)
    C.assert_close(flash:prefill(prompt), masked:prefill(prompt), 1e-6, "prefill")
    assert.is_true(flash:capture())
    for t = 8, 89 do
      local x = ids:narrow(1, t, 1)
      local a, b = flash:step(x), masked:step(x)
      C.assert_rel(a, b, tol, "flash (graph) vs masked at position " .. t)
    end
    flash:close()
  end

  it("replays one graph for every position, close to masked decoding (f32, bf16)", function()
    graph_flash_vs_masked(tiny(), 1e-5)
    graph_flash_vs_masked(tiny():to("bf16"), 2e-2)
  end)

  it("gives ember.generate's greedy tokens of EMBER_KV_DECODE=masked with =flash (children: read once)", function()
    local script = H.temp_file([[
      local ember = require "ember"
      ember.manual_seed(7)
      local m = ember.nn.TransformerLM{vocab_size = 256, context_length = 96, d_model = 64, d_ff = 128,
        num_layers = 2, num_heads = 4, device = "cuda"}
      local bytes = {encode = function(_, s) return {s:byte(1, -1)} end, vocab_size = function() return 256 end,
        decode = function(_, ids) return "" end}
      local _, info = ember.generate(m, bytes, "hello", {max_tokens = 80, temperature = 0, eos = false})
      io.write(ember.nn.KVCache(m).decode_impl, " ", tostring(info.graph), " ", table.concat(info.ids, ","))]],
      ".lua")
    local got = {}
    for _, mode in ipairs({"masked", "flash"}) do
      local out, err, code = H.ember({"run", script}, {env = {EMBER_KV_DECODE = mode}})
      assert.are.equal(0, code, err)
      local impl, graph, ids = out:match("^(%S+) (%S+) (.*)$")
      assert.are.equal(mode, impl)
      assert.are.equal("true", graph)
      got[mode] = ids
    end
    assert.are.equal(80, select(2, got.masked:gsub(",", "")) + 1)
    assert.are.equal(got.masked, got.flash)
    H.remove_temps()
  end)
end)
