-- attention_spec.lua — the VALUES of F.scaled_dot_product_attention with the
-- naive implementation (engine/ops/attention.c): softmax(q kᵀ · scale + mask) v,
-- checked against explicit Lua loops, non-causal and causal (top-left aligned,
-- as torch's is_causal), Tq ≠ Tk, a custom scale, dv ≠ d and broadcast batch
-- dims. Gradients live in gradcheck_spec.lua, errors in bad_input_spec.lua.
-- The flash implementation has its own GPU specs; it is compared to this one.
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/attention_spec.lua
--
-- Tolerances, and why:
--   * f64: 1e-13 absolute on O(1) outputs (a d-term dot, a softmax, a Tk-term
--     weighted sum: a few dozen roundings of 1e-16).
--   * f32: 1e-5 absolute: each stage (scores, softmax, output) rounds to f32
--     (6e-8 relative) and sums of up to 16 terms of O(1) values; 1e-5 is ~100×
--     that, and ~1000× smaller than any indexing or masking mistake.

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local F = ember.nn.functional

local flat = H.flat

-- attention for one (Tq, d) q, (Tk, d) k and (Tk, dv) v given as Lua lists
local function attend(q, k, v, causal, scale)
  local out = {}
  for i = 1, #q do
    local s, m = {}, -math.huge
    for j = 1, #k do
      if causal and j > i then
        s[j] = -math.huge
      else
        local dot = 0.0
        for c = 1, #q[i] do dot = dot + q[i][c] * k[j][c] end
        s[j] = dot * scale
      end
      m = math.max(m, s[j])
    end
    local z = 0.0
    for j = 1, #k do s[j] = math.exp(s[j] - m); z = z + s[j] end
    out[i] = {}
    for c = 1, #v[1] do
      local acc = 0.0
      for j = 1, #k do acc = acc + s[j] / z * v[j][c] end
      out[i][c] = acc
    end
  end
  return out
end

local assert_abs = H.assert_abs

local randn = H.randn

local function qkv(seed, qshape, kshape, vshape, dtype)
  return randn(seed, qshape, dtype), randn(seed + 1, kshape, dtype), randn(seed + 2, vshape or kshape, dtype)
end

-- the (B, H, ...) reference: attend each head
local function attend4(q, k, v, causal, scale)
  local lq, lk, lv, out = q:tolist(), k:tolist(), v:tolist(), {}
  for b = 1, #lq do
    out[b] = {}
    for h = 1, #lq[b] do out[b][h] = attend(lq[b][h], lk[b][h], lv[b][h], causal, scale) end
  end
  return out
end

describe("F.scaled_dot_product_attention (naive)", function()
  it("non-causal matches Lua loops on (B, H, T, d) = (2, 2, 5, 8), scale 1/sqrt(d)", function()
    local q, k, v = qkv(1, {2, 2, 5, 8}, {2, 2, 5, 8})
    local r = F.scaled_dot_product_attention(q, k, v)
    assert.same({2, 2, 5, 8}, r.shape)
    assert_abs(r:tolist(), attend4(q, k, v, false, 1 / math.sqrt(8)), 1e-13, "non-causal")
  end)

  it("causal matches Lua loops with the j <= i mask", function()
    local q, k, v = qkv(2, {2, 2, 6, 4}, {2, 2, 6, 4})
    local r = F.scaled_dot_product_attention(q, k, v, {causal = true})
    assert_abs(r:tolist(), attend4(q, k, v, true, 0.5), 1e-13, "causal")
  end)

  it("is non-causal by default, as torch's is_causal=False", function()
    local q, k, v = qkv(3, {1, 1, 4, 4}, {1, 1, 4, 4})
    assert.same(F.scaled_dot_product_attention(q, k, v, {causal = false}):tolist(),
      F.scaled_dot_product_attention(q, k, v):tolist())
    assert.are_not.same(F.scaled_dot_product_attention(q, k, v, {causal = true}):tolist(),
      F.scaled_dot_product_attention(q, k, v):tolist())
  end)

  it("causal row 0 attends only to key 0, so it equals v[0] exactly", function()
    local q, k, v = qkv(4, {2, 3, 5, 8}, {2, 3, 5, 8})
    local r = F.scaled_dot_product_attention(q, k, v, {causal = true})
    assert.same(v:narrow(2, 0, 1):tolist(), r:narrow(2, 0, 1):tolist())
  end)

  it("the last causal row equals the non-causal last row", function()
    local q, k, v = qkv(5, {1, 2, 5, 4}, {1, 2, 5, 4})
    local c = F.scaled_dot_product_attention(q, k, v, {causal = true}):narrow(2, 4, 1)
    local n = F.scaled_dot_product_attention(q, k, v):narrow(2, 4, 1)
    assert_abs(c:tolist(), n:tolist(), 1e-15, "last row")
  end)

  it("Tq < Tk causal is top-left aligned: query i sees keys 0..i (torch is_causal)", function()
    local q, k, v = qkv(6, {1, 1, 3, 4}, {1, 1, 5, 4})
    local r = F.scaled_dot_product_attention(q, k, v, {causal = true})
    assert.same({1, 1, 3, 4}, r.shape)
    assert_abs(r:tolist(), attend4(q, k, v, true, 0.5), 1e-13, "Tq < Tk")
  end)

  it("Tq > Tk causal: later queries see every key", function()
    local q, k, v = qkv(7, {1, 1, 5, 4}, {1, 1, 3, 4})
    local r = F.scaled_dot_product_attention(q, k, v, {causal = true})
    assert_abs(r:tolist(), attend4(q, k, v, true, 0.5), 1e-13, "Tq > Tk")
  end)

  it("one query against a KV cache (Tq = 1, non-causal) sees every key", function()
    local q, k, v = qkv(8, {2, 2, 1, 8}, {2, 2, 7, 8})
    local r = F.scaled_dot_product_attention(q, k, v)
    assert_abs(r:tolist(), attend4(q, k, v, false, 1 / math.sqrt(8)), 1e-13, "decode")
  end)

  it("uses a custom scale", function()
    local q, k, v = qkv(9, {1, 2, 4, 8}, {1, 2, 4, 8})
    local r = F.scaled_dot_product_attention(q, k, v, {scale = 0.9})
    assert_abs(r:tolist(), attend4(q, k, v, false, 0.9), 1e-13, "scale 0.9")
    local c = F.scaled_dot_product_attention(q, k, v, {scale = 0.05, causal = true})
    assert_abs(c:tolist(), attend4(q, k, v, true, 0.05), 1e-13, "scale 0.05 causal")
  end)

  it("v may have another last dim than q and k (dv = 3, d = 8)", function()
    local q, k, v = qkv(10, {1, 2, 4, 8}, {1, 2, 6, 8}, {1, 2, 6, 3})
    local r = F.scaled_dot_product_attention(q, k, v)
    assert.same({1, 2, 4, 3}, r.shape)
    assert_abs(r:tolist(), attend4(q, k, v, false, 1 / math.sqrt(8)), 1e-13, "dv")
  end)

  it("works on 3-D (B, T, d) and 2-D (T, d) inputs", function()
    local q, k, v = qkv(11, {2, 4, 4}, {2, 4, 4})
    local r = F.scaled_dot_product_attention(q, k, v, {causal = true}):tolist()
    local lq, lk, lv = q:tolist(), k:tolist(), v:tolist()
    for b = 1, 2 do assert_abs(r[b], attend(lq[b], lk[b], lv[b], true, 0.5), 1e-13, "3-D") end
    local r2 = F.scaled_dot_product_attention(q:select(0, 0), k:select(0, 0), v:select(0, 0), {causal = true})
    assert_abs(r2:tolist(), attend(lq[1], lk[1], lv[1], true, 0.5), 1e-13, "2-D")
  end)

  it("broadcasts batch dims: one shared K/V head for two query heads (2, 2, T, d) vs (2, 1, T, d)", function()
    local q, k, v = qkv(12, {2, 2, 4, 4}, {2, 1, 4, 4})
    local r = F.scaled_dot_product_attention(q, k, v, {causal = true})
    assert.same({2, 2, 4, 4}, r.shape)
    local ke, ve = k:expand(2, 2, 4, 4), v:expand(2, 2, 4, 4)
    assert_abs(r:tolist(), attend4(q, ke, ve, true, 0.5), 1e-13, "broadcast")
  end)

  it("reads non-contiguous (B, T, H, d) -> (B, H, T, d) permuted inputs", function()
    local function perm(seed) return randn(seed, {2, 5, 2, 4}):permute(0, 2, 1, 3) end
    local q, k, v = perm(13), perm(14), perm(15)
    local r = F.scaled_dot_product_attention(q, k, v, {causal = true})
    assert_abs(r:tolist(), attend4(q, k, v, true, 0.5), 1e-13, "permuted")
  end)

  it("is stable for large scores (q·k ~ 1e4): no NaN or inf", function()
    local q, k, v = qkv(16, {1, 1, 4, 4}, {1, 1, 4, 4})
    local r = F.scaled_dot_product_attention(q * 100, k * 100, v, {causal = true})
    for _, x in ipairs(flat(r)) do assert.is_true(x == x and math.abs(x) < math.huge) end
    assert_abs(r:tolist(), attend4(q * 100, k * 100, v, true, 0.5), 1e-12, "large scores")
  end)

  it("f32 matches the double loops within 1e-5", function()
    local q, k, v = qkv(17, {2, 2, 16, 8}, {2, 2, 16, 8}, nil, "f32")
    local r = F.scaled_dot_product_attention(q, k, v, {causal = true})
    assert.equals("f32", r.dtype)
    assert_abs(r:tolist(), attend4(q, k, v, true, 1 / math.sqrt(8)), 1e-5, "f32")
  end)

  -- On the CPU the scale, the mask and the softmax are one fused row op
  -- (engine/ops/attention.c); it must round exactly as the composition.
  for _, dtype in ipairs({"f32", "f64"}) do
    for _, causal in ipairs({true, false}) do
      it(("the CPU's fused softmax gives the composition's bits (%s, causal %s, Tq > Tk)"):format(dtype,
          tostring(causal)), function()
        local q, k, v = qkv(19, {2, 3, 37, 8}, {2, 3, 29, 8}, nil, dtype)
        local fused = F.scaled_dot_product_attention(q, k, v, {causal = causal, scale = 0.3})
        local s = q:matmul(k:transpose(-1, -2)) * 0.3
        if causal then s = s:masked_fill(ember.ones({37, 29}):triu(1):to("bool"), -math.huge) end
        local composed = s:softmax(-1):matmul(v)
        assert.are.equal(0, ember.ne(fused, composed):sum():item())
      end)
    end
  end

  it("every output row is a convex combination of v's rows (between their min and max)", function()
    local q, k, v = qkv(18, {1, 1, 6, 4}, {1, 1, 6, 4})
    local r = F.scaled_dot_product_attention(q, k, v):tolist()[1][1]
    local lv = v:tolist()[1][1]
    for c = 1, 4 do
      local lo, hi = math.huge, -math.huge
      for j = 1, 6 do lo = math.min(lo, lv[j][c]); hi = math.max(hi, lv[j][c]) end
      for i = 1, 6 do assert.is_true(r[i][c] >= lo - 1e-15 and r[i][c] <= hi + 1e-15) end
    end
  end)
end)
