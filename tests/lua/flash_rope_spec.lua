-- flash_rope_spec.lua — F.flash_attention(q, k, v, causal, {rope = {pos, theta}})
-- on the CPU, where it is the composition F.rope_qk then F.flash_attention
-- (engine/ops/flash_rope.c): O, the log-sum-exp and the gradients w.r.t.
-- the un-rotated q and k, v bit for bit the composition's (the same ops on
-- the same values; any difference is a wiring bug, not rounding); the
-- defaults (pos 0..T-1, theta 10000); the option errors; and the model's
-- switch EMBER_ATTN_ROPE, whose two values must train a tiny model to the
-- same bits. The CUDA kernels that rotate on load: tests/gpu/flash_rope_spec.lua.
local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local F = ember.nn.functional

local seed = 7600
local function randn(shape, dtype)
  seed = seed + 1
  return H.randn(seed, shape, dtype or "f32")
end
-- o, lse and the three gradients of the fused call (opts.rope) or the composition
local run = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "flash_rope_ref.lua")

local function assert_same_bits(a, b, what)
  for _, name in ipairs({"o", "lse", "dq", "dk", "dv"}) do
    assert.are.same(a[name].shape, b[name].shape, what .. " " .. name .. " shape")
    assert.is_true(H.raw_bytes(a[name]) == H.raw_bytes(b[name]), what .. ": " .. name .. " differs from the composition's")
  end
end

describe("F.flash_attention with the rope option on the CPU", function()
  local cases = {
    {name = "4-D, causal", q = {2, 4, 13, 16}, kv = {2, 4, 13, 16}, causal = true},
    {name = "4-D, not causal, d 64", q = {1, 2, 9, 64}, kv = {1, 2, 9, 64}, causal = false},
    {name = "GQA (H 6, Hkv 2), bottom-right", q = {2, 6, 7, 32}, kv = {2, 2, 7, 32}, causal = "bottom_right"},
    {name = "3-D (B, T, d), causal", q = {3, 11, 16}, kv = {3, 11, 16}, causal = true},
  }
  for _, c in ipairs(cases) do
    for _, dt in ipairs({"f32", "f64", "bf16"}) do
      it(("gives the composition's O, L and gradients bit for bit: %s, %s"):format(c.name, dt), function()
        local T = c.q[#c.q - 1]
        local q, k, v = randn(c.q, dt), randn(c.kv, dt), randn(c.kv, dt)
        local g = randn(c.q, dt)
        -- positions as generation uses them: an offset, not 0..T-1
        local pos = ember.arange(37, 37 + T, 1, {dtype = "i64"})
        local a = run(true, q, k, v, c.causal, pos, 500.0, g)
        local b = run(false, q, k, v, c.causal, pos, 500.0, g)
        assert_same_bits(a, b, c.name)
      end)
    end
  end

  it("takes per-batch positions (B, 1, T) and i32 positions", function()
    local q, k, v, g = randn({2, 3, 5, 16}), randn({2, 3, 5, 16}), randn({2, 3, 5, 16}), randn({2, 3, 5, 16})
    local pos = ember.tensor({{{0, 1, 2, 3, 4}}, {{9, 10, 11, 12, 13}}}, {dtype = "i32"})
    assert_same_bits(run(true, q, k, v, true, pos, 10000, g), run(false, q, k, v, true, pos, 10000, g), "(B, 1, T)")
  end)

  it("defaults to positions 0..T-1 and theta 10000", function()
    local q, k, v = randn({1, 2, 6, 16}), randn({1, 2, 6, 16}), randn({1, 2, 6, 16})
    local o1 = F.flash_attention(q, k, v, true, {rope = {}})
    local qr, kr = F.rope_qk(q, k, F.positions(6), 10000)
    local o2 = F.flash_attention(qr, kr, v, true)
    assert.is_true(H.raw_bytes(o1) == H.raw_bytes(o2))
    -- and rope changes the result (the option is not ignored)
    assert.is_true(H.maxdiff(o1, F.flash_attention(q, k, v, true)) > 1e-3)
  end)

  it("keeps the scale option beside rope, and takes a plain number as the scale as before", function()
    local q, k, v = randn({1, 2, 6, 16}), randn({1, 2, 6, 16}), randn({1, 2, 6, 16})
    local pos = F.positions(6)
    local qr, kr = F.rope_qk(q, k, pos, 10000)
    local want = F.flash_attention(qr, kr, v, false, 0.3)
    assert.is_true(H.raw_bytes(F.flash_attention(q, k, v, false, {scale = 0.3, rope = {pos = pos}})) == H.raw_bytes(want))
    assert.is_true(H.raw_bytes(F.flash_attention(qr, kr, v, false, {scale = 0.3})) == H.raw_bytes(want))
    assert.is_true(H.raw_bytes(F.flash_attention(qr, kr, v, false, 0.3)) == H.raw_bytes(want))
  end)
end)

describe("F.flash_attention's rope option errors", function()
  local q = ember.randn(1, 2, 6, 16)
  local function fails(opts, msg, qq, kk)
    assert.error_matches(function() F.flash_attention(qq or q, kk or q, kk or q, true, opts) end, msg, 1, true)
  end

  it("names a position tensor that does not broadcast, or is not an integer tensor", function()
    fails({rope = {pos = F.positions(5)}},
      "flash_attention: positions of shape [5] do not broadcast to q's leading dims [1, 2, 6]")
    fails({rope = {pos = ember.zeros(6)}}, "flash_attention: expected")
    fails({rope = {pos = ember.zeros(6)}}, "pos")
    fails({rope = {pos = 3}}, "flash_attention: expected rope.pos to be an integer tensor, got number")
  end)

  it("names a k whose T the positions do not fit (one pos for q and k)", function()
    local k = ember.randn(1, 2, 9, 16)
    fails({rope = {pos = F.positions(6)}}, "do not broadcast to k's leading dims [1, 2, 9]", q, k)
  end)

  it("rejects an odd head dim and theta <= 0", function()
    local q5 = ember.randn(1, 2, 6, 5)
    fails({rope = {}}, "flash_attention: expected an even last dim, got 5 (q has shape [1, 2, 6, 5])", q5, q5)
    fails({rope = {theta = 0}}, "flash_attention: expected theta > 0 and finite, got 0")
    fails({rope = {theta = -2}}, "flash_attention: expected theta > 0 and finite, got -2")
    fails({rope = {theta = "big"}}, "expected rope.theta to be a number, got string")
  end)

  it("rejects unknown options and non-table rope", function()
    fails({rope = {pos = F.positions(6), offset = 3}}, "unknown rope option 'offset' (expected pos or theta)")
    fails({rotary = {}}, "unknown option 'rotary' (expected scale or rope)")
    fails({rope = true}, "expected rope to be a table {pos = , theta = }, got boolean")
    fails("1/8", "expected a scale (number) or an options table, got string")
  end)
end)

describe("TransformerLM with EMBER_ATTN_ROPE", function()
  it("trains to the same bits with the rope inside flash (fused) and before it (separate)", function()
    local script = H.tiny_model_digests_script("flash")   -- the CPU's tiled flash, where the switch applies
    H.switch_agrees(script, "EMBER_ATTN_ROPE", {"separate", "fused"}, "2", 100)
    H.switch_refuses(script, "EMBER_ATTN_ROPE", "yes", "EMBER_ATTN_ROPE must be 'fused' or 'separate', got 'yes'")
    H.remove_temps()
  end)
end)
