-- flash_spec.lua — F.flash_attention on the CPU: the tiled path
-- (engine/ops/flash_cpu.c) against explicit Lua loops (an independent
-- reference), against the naive composition (F.scaled_dot_product_attention
-- impl "naive", autograd for the gradients), and against itself with other
-- tile sizes; grouped-query attention, 3-D (B, T, d) inputs, both causal
-- alignments, one query against many keys (decode), odd lengths, strided and
-- half-precision inputs, memory that stays linear in T, what impl = "auto"
-- picks, and the errors. Finite-difference gradchecks of the same paths are
-- in the op registry (op_cases/attention.lua, gradcheck_spec.lua).
--
-- Small tiles (ember.core.flash_cpu_tiles(4, 8)) make every small shape here
-- span several query and key tiles, with partial tiles at the ends.
--
-- Tolerances, and why:
--   * f64: 1e-12 absolute on O(1) values: a d-term dot, a softmax over at
--     most ~100 keys and a weighted sum, each a few dozen roundings of 1e-16;
--     a wrong mask or a missed tile is O(0.1).
--   * f32: 2e-5 absolute against f64: scores, exponentials and sums round to
--     f32 (6e-8 relative) over ~100 terms of O(1) values.
--   * bf16/f16 inputs: the output is rounded to the input dtype once
--     (relative 4e-3 bf16, 5e-4 f16); the arithmetic is f32.
local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local F = ember.nn.functional
local core = ember.core

local seed = 7000
local function randn(shape, dtype)
  seed = seed + 1
  return H.randn(seed, shape, dtype or "f64")
end
local function leaf(t) local c = t:detach():clone(); c.requires_grad = true; return c end
local function maxdiff(a, b) return (a:to("f64") - b:to("f64")):abs():max():item() end

-- attention of one head given as Lua lists, with the log-sum-exp of each row;
-- causal nil/false, true/"top_left" or "bottom_right"
local function attend(q, k, v, causal, scale)
  local off = causal == "bottom_right" and #k - #q or 0
  local out, lse = {}, {}
  for i = 1, #q do
    local s, m = {}, -math.huge
    for j = 1, #k do
      if causal and j > i + off then
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
    out[i], lse[i] = {}, m + math.log(z)
    for c = 1, #v[1] do
      local acc = 0.0
      for j = 1, #k do acc = acc + s[j] / z * v[j][c] end
      out[i][c] = acc
    end
  end
  return out, lse
end

-- (B, H, Tq, d) q against (B, Hkv, Tk, d) k, v: head h reads kv head (h - 1) // (H / Hkv) + 1
local function attend4(q, k, v, causal, scale)
  local lq, lk, lv, out, lse = q:to("f64"):tolist(), k:to("f64"):tolist(), v:to("f64"):tolist(), {}, {}
  for b = 1, #lq do
    out[b], lse[b] = {}, {}
    local G = #lq[b] // #lk[b]
    for h = 1, #lq[b] do
      local hk = (h - 1) // G + 1
      out[b][h], lse[b][h] = attend(lq[b][h], lk[b][hk], lv[b][hk], causal, scale)
    end
  end
  return out, lse
end

-- k (B, Hkv, T, d) with each kv head repeated for its group: (B, H, T, d)
local function repeat_kv(k, H_)
  local B, Hkv, T, d = table.unpack(k.shape)
  return k:unsqueeze(2):expand(B, Hkv, H_ // Hkv, T, d):reshape(B, H_, T, d)
end

-- o, lse and the gradients of flash and of naive f64 attention for the same inputs
local function both(q, k, v, g, causal)
  local fq, fk, fv = leaf(q), leaf(k), leaf(v)
  local o, lse = F.flash_attention(fq, fk, fv, causal)
  o:backward(g)
  local nq, nk, nv = leaf(q:to("f64")), leaf(k:to("f64")), leaf(v:to("f64"))
  local Hq = q.shape[2]
  local no = F.scaled_dot_product_attention(nq, repeat_kv(nk, Hq), repeat_kv(nv, Hq), {causal = causal, impl = "naive"})
  no:backward(g:to("f64"))
  return {o = o, lse = lse, dq = fq.grad, dk = fk.grad, dv = fv.grad},
    {o = no, dq = nq.grad, dk = nk.grad, dv = nv.grad}
end

local function check_grads(f, n, tol, what)
  for _, key in ipairs({"o", "dq", "dk", "dv"}) do
    local e = maxdiff(f[key], n[key])
    assert.is_true(e <= tol, ("%s %s: max error %.3g > %.3g"):format(what, key, e, tol))
  end
end

describe("F.flash_attention on the CPU (tiled)", function()
  before_each(function() core.flash_cpu_tiles(4, 8) end)
  after_each(function() core.flash_cpu_tiles(0, 0) end)

  it("matches Lua loops: O and the log-sum-exp, causal and not, Tq != Tk, odd lengths", function()
    for _, c in ipairs({{2, 3, 9, 13, false}, {2, 3, 9, 13, true}, {1, 2, 13, 5, true}, {1, 2, 11, 11, true},
                        {2, 1, 7, 7, false}}) do
      local B, Hq, Tq, Tk, causal = table.unpack(c)
      local q, k, v = randn({B, Hq, Tq, 16}), randn({B, Hq, Tk, 16}), randn({B, Hq, Tk, 16})
      local o, lse = F.flash_attention(q, k, v, causal)
      local ro, rl = attend4(q, k, v, causal, 0.25)
      assert.same({B, Hq, Tq, 16}, o.shape)
      assert.same({B, Hq, Tq}, lse.shape)
      assert.equals("f64", lse.dtype)
      H.assert_abs(o:tolist(), ro, 1e-12, "O " .. table.concat(c, " ", 1, 4))
      H.assert_abs(lse:tolist(), rl, 1e-12, "lse " .. table.concat(c, " ", 1, 4))
    end
  end)

  it("aligns causal = 'bottom_right' to the end of the keys (query i sees j <= i + Tk - Tq)", function()
    local q, k, v = randn({2, 2, 5, 16}), randn({2, 2, 12, 16}), randn({2, 2, 12, 16})
    local o = F.flash_attention(q, k, v, "bottom_right", 0.3)
    H.assert_abs(o:tolist(), (attend4(q, k, v, "bottom_right", 0.3)), 1e-12, "bottom-right")
    -- the last query sees every key: its row equals the unmasked one
    local full = F.flash_attention(q, k, v, false, 0.3)
    H.assert_abs(o:narrow(2, 4, 1):tolist(), full:narrow(2, 4, 1):tolist(), 1e-12, "last row")
    -- and differs from the top-left alignment, which hides most keys from row 0
    assert.is_true(maxdiff(o, F.flash_attention(q, k, v, true, 0.3)) > 1e-3)
  end)

  it("naive SDPA on the CPU (the fused scale + mask + softmax) aligns 'bottom_right' the same, f64 and f32", function()
    for _, dt in ipairs({"f64", "f32"}) do
      local q, k, v = randn({1, 2, 5, 16}, dt), randn({1, 2, 12, 16}, dt), randn({1, 2, 12, 16}, dt)
      local o = F.scaled_dot_product_attention(q, k, v, {causal = "bottom_right", impl = "naive", scale = 0.3})
      local tol = dt == "f64" and 1e-12 or 1e-5
      H.assert_abs(o:tolist(), (attend4(q, k, v, "bottom_right", 0.3)), tol, "naive bottom-right " .. dt)
    end
  end)

  it("gives the same result for both alignments when Tq = Tk, and 'top_left' is true", function()
    local q, k, v = randn({1, 2, 10, 32}), randn({1, 2, 10, 32}), randn({1, 2, 10, 32})
    local a = F.flash_attention(q, k, v, true)
    assert.same(a:tolist(), F.flash_attention(q, k, v, "bottom_right"):tolist())
    assert.same(a:tolist(), F.flash_attention(q, k, v, "top_left"):tolist())
  end)

  it("decodes one query against a long cache (Tq = 1): bottom-right causal = every key", function()
    local q, k, v = randn({2, 4, 1, 64}), randn({2, 4, 37, 64}), randn({2, 4, 37, 64})
    local o, lse = F.flash_attention(q, k, v, "bottom_right")
    local ro, rl = attend4(q, k, v, false, 1 / 8)
    H.assert_abs(o:tolist(), ro, 1e-12, "decode O")
    H.assert_abs(lse:tolist(), rl, 1e-12, "decode lse")
  end)

  it("runs grouped-query attention: k, v with fewer heads, head h reads kv head h // (H / Hkv)", function()
    for _, c in ipairs({{6, 2, 9, 9, true}, {6, 3, 5, 14, "bottom_right"}, {4, 1, 7, 10, false}}) do
      local Hq, Hkv, Tq, Tk, causal = table.unpack(c)
      local q, k, v = randn({2, Hq, Tq, 16}), randn({2, Hkv, Tk, 16}), randn({2, Hkv, Tk, 16})
      local o, lse = F.flash_attention(q, k, v, causal)
      local ro, rl = attend4(q, k, v, causal, 0.25)
      H.assert_abs(o:tolist(), ro, 1e-12, "GQA O")
      H.assert_abs(lse:tolist(), rl, 1e-12, "GQA lse")
    end
  end)

  it("sums the gradients of a kv head over its group (GQA backward) like naive attention on repeated k, v", function()
    for _, c in ipairs({{6, 2, 9, 9, true}, {6, 3, 5, 14, "bottom_right"}, {4, 1, 7, 10, false}}) do
      local Hq, Hkv, Tq, Tk, causal = table.unpack(c)
      local q, k, v = randn({2, Hq, Tq, 16}), randn({2, Hkv, Tk, 16}), randn({2, Hkv, Tk, 16})
      local f, n = both(q, k, v, randn({2, Hq, Tq, 16}), causal)
      assert.same({2, Hkv, Tk, 16}, f.dk.shape)
      check_grads(f, n, 1e-12, ("GQA %d/%d %s"):format(Hq, Hkv, tostring(causal)))
    end
  end)

  it("has naive attention's gradients in f64 for every alignment, Tq < Tk and Tq > Tk", function()
    for _, c in ipairs({{9, 13, false}, {9, 13, true}, {13, 5, true}, {6, 17, "bottom_right"}, {1, 19, "bottom_right"}}) do
      local Tq, Tk, causal = table.unpack(c)
      local q, k, v = randn({2, 2, Tq, 32}), randn({2, 2, Tk, 32}), randn({2, 2, Tk, 32})
      local f, n = both(q, k, v, randn({2, 2, Tq, 32}), causal)
      check_grads(f, n, 1e-12, ("Tq %d Tk %d %s"):format(Tq, Tk, tostring(causal)))
    end
  end)

  it("computes f32 inputs in f32: within 2e-5 of f64, gradients too", function()
    local q, k, v = randn({1, 4, 21, 64}, "f32"), randn({1, 2, 30, 64}, "f32"), randn({1, 2, 30, 64}, "f32")
    local f, n = both(q, k, v, randn({1, 4, 21, 64}, "f32"), "bottom_right")
    assert.equals("f32", f.o.dtype)
    assert.equals("f32", f.lse.dtype)
    assert.equals("f32", f.dk.dtype)
    check_grads(f, n, 2e-5, "f32")
  end)

  it("computes bf16 and f16 inputs in f32 and rounds the results once", function()
    for _, dt in ipairs({"bf16", "f16"}) do
      local q, k, v = randn({1, 2, 17, 32}, dt), randn({1, 2, 17, 32}, dt), randn({1, 2, 17, 32}, dt)
      local f, n = both(q, k, v, randn({1, 2, 17, 32}, dt), true)
      assert.equals(dt, f.o.dtype)
      assert.equals(dt, f.dq.dtype)
      assert.equals("f32", f.lse.dtype)
      -- O within the rounding of one output (|O| <= max |v| ~ 4)
      local e = maxdiff(f.o, n.o)
      assert.is_true(e <= (dt == "bf16" and 4 * 2 ^ -8 or 4 * 2 ^ -11), dt .. " O error " .. e)
      assert.is_true(maxdiff(f.lse, (select(2, F.flash_attention(q:to("f64"), k:to("f64"), v:to("f64"), true))))
        < 2e-5, dt .. " lse")
    end
  end)

  it("takes 3-D (B, T, d) inputs as one head: O (B, Tq, d), L (B, Tq), gradients to the 3-D leaves", function()
    local q, k, v = randn({3, 7, 16}), randn({3, 11, 16}), randn({3, 11, 16})
    local q3, k3, v3 = leaf(q), leaf(k), leaf(v)
    local o, lse = F.flash_attention(q3, k3, v3, "bottom_right")
    assert.same({3, 7, 16}, o.shape)
    assert.same({3, 7}, lse.shape)
    local g = randn({3, 7, 16})
    o:backward(g)
    local q4, k4, v4 = leaf(q:unsqueeze(1)), leaf(k:unsqueeze(1)), leaf(v:unsqueeze(1))
    local o4, lse4 = F.flash_attention(q4, k4, v4, "bottom_right")
    o4:backward(g:unsqueeze(1))
    assert.same(o4:squeeze(1):tolist(), o:tolist())
    assert.same(lse4:squeeze(1):tolist(), lse:tolist())
    assert.same({3, 11, 16}, k3.grad.shape)
    assert.same(k4.grad:squeeze(1):tolist(), k3.grad:tolist())
    assert.same(q4.grad:squeeze(1):tolist(), q3.grad:tolist())
  end)

  it("reads strided (B, T, H, d) head views and returns gradients in the leaves' layout", function()
    local x = {randn({2, 9, 3, 16}), randn({2, 12, 3, 16}), randn({2, 12, 3, 16})}
    local l = {leaf(x[1]), leaf(x[2]), leaf(x[3])}
    local o = F.flash_attention(l[1]:transpose(1, 2), l[2]:transpose(1, 2), l[3]:transpose(1, 2), true)
    assert.is_true(o:transpose(1, 2):is_contiguous(), "O is (B, T, H, d) memory")
    local ref = attend4(x[1]:transpose(1, 2), x[2]:transpose(1, 2), x[3]:transpose(1, 2), true, 0.25)
    H.assert_abs(o:tolist(), ref, 1e-12, "strided")
    o:backward(randn({2, 3, 9, 16}))
    for i = 1, 3 do assert.is_true(l[i].grad:is_contiguous(), "gradient " .. i .. " layout") end
  end)

  it("does not depend on the tile sizes beyond rounding, and repeats bit for bit", function()
    local q, k, v = randn({2, 4, 45, 32}), randn({2, 2, 50, 32}), randn({2, 2, 50, 32})
    local g = randn({2, 4, 45, 32})
    local runs = {}
    for i, t in ipairs({{4, 8}, {3, 5}, {64, 64}, {4, 8}}) do
      core.flash_cpu_tiles(t[1], t[2])
      local f = both(q, k, v, g, "bottom_right")
      runs[i] = f
    end
    for _, key in ipairs({"o", "lse", "dq", "dk", "dv"}) do
      for i = 2, 3 do assert.is_true(maxdiff(runs[i][key], runs[1][key]) < 1e-12, key .. " tiles " .. i) end
      assert.same(runs[1][key]:tolist(), runs[4][key]:tolist())   -- same tiles: bit-identical
    end
  end)

  it("keeps memory linear in T: no allocation near T×T, where naive attention makes several", function()
    core.flash_cpu_tiles(0, 0)
    local T = 1024
    local function largest(fn)
      ember.memory.record_history(true, {cpu = true, track_modules = false})
      fn()
      local snap = ember.memory.snapshot()
      ember.memory.record_history(false)
      ember.memory.clear_history()
      local big = 0
      for _, e in ipairs(snap.trace) do
        if e.action == "alloc" and e.device == "cpu" then big = math.max(big, e.size) end
      end
      return big
    end
    local q, k, v = leaf(randn({1, 1, T, 16}, "f32")), leaf(randn({1, 1, T, 16}, "f32")),
      leaf(randn({1, 1, T, 16}, "f32"))
    local function run(impl)
      return function()
        local o = F.scaled_dot_product_attention(q, k, v, {causal = true, impl = impl})
        o:backward(ember.ones(1, 1, T, 16))
      end
    end
    local tt = T * T * 4
    local flash, naive = largest(run("flash")), largest(run("naive"))
    assert.is_true(naive >= tt, "naive's largest allocation " .. naive)   -- the measure sees T×T
    assert.is_true(flash <= T * 16 * 8, ("flash's largest allocation %d bytes (T×T f32 = %d)"):format(flash, tt))
  end)
end)

describe("scaled_dot_product_attention on the CPU", function()
  it("impl 'auto' takes the tiled flash path from 256 keys, the naive composition below", function()
    local q = randn({1, 2, 8, 16}, "f32")
    local long, short = randn({1, 2, 256, 16}, "f32"), randn({1, 2, 255, 16}, "f32")
    q.requires_grad = true
    assert.equals("flash_attention", F.scaled_dot_product_attention(q, long, long).grad_fn)
    assert.is_true(core.flash_applies(q, long, long))
    assert.is_false(core.flash_applies(q, short, short))
    assert.are_not.equal("flash_attention", F.scaled_dot_product_attention(q, short, short).grad_fn)
    -- both give the same values
    local a = F.scaled_dot_product_attention(q, long, long, {causal = "bottom_right"})
    local b = F.scaled_dot_product_attention(q, long, long, {causal = "bottom_right", impl = "naive"})
    assert.is_true(maxdiff(a, b) < 2e-5)
  end)

  it("runs grouped-query attention with enable_gqa = true, naive and flash alike", function()
    local q, k, v = randn({2, 6, 5, 16}), randn({2, 3, 8, 16}), randn({2, 3, 8, 16})
    local ref = attend4(q, k, v, "bottom_right", 0.25)
    for _, impl in ipairs({"naive", "flash", "auto"}) do
      local o = F.scaled_dot_product_attention(q, k, v, {causal = "bottom_right", enable_gqa = true, impl = impl})
      H.assert_abs(o:tolist(), ref, 1e-12, impl)
    end
  end)

  it("asks for enable_gqa when the heads differ, as PyTorch does, and rejects unknown options", function()
    local q, k = randn({1, 4, 5, 16}), randn({1, 2, 5, 16})
    assert.error_matches(function() F.scaled_dot_product_attention(q, k, k) end,
      "q has 4 heads (dim -3) and k 2: pass enable_gqa = true for grouped-query attention", 1, true)
    assert.error_matches(function() F.scaled_dot_product_attention(q, q, q, {is_casual = true}) end,
      "unknown option 'is_casual' (expected causal, is_causal, scale, impl or enable_gqa)", 1, true)
  end)

  it("takes PyTorch's is_causal for causal = true (top-left), and refuses a contradiction", function()
    local q, k, v = randn({1, 2, 6, 16}), randn({1, 2, 9, 16}), randn({1, 2, 9, 16})
    for _, impl in ipairs({"naive", "flash"}) do
      local want = F.scaled_dot_product_attention(q, k, v, {causal = true, impl = impl})
      local got = F.scaled_dot_product_attention(q, k, v, {is_causal = true, impl = impl})
      assert.same(want:tolist(), got:tolist())
      local plain = F.scaled_dot_product_attention(q, k, v, {impl = impl})
      assert.same(plain:tolist(), F.scaled_dot_product_attention(q, k, v, {is_causal = false, impl = impl}):tolist())
      -- and it does mask: not the unmasked result
      assert.are_not.same(plain:tolist(), got:tolist())
      assert.same(want:tolist(), F.scaled_dot_product_attention(q, k, v, {causal = true, is_causal = true,
        impl = impl}):tolist())
    end
    assert.error_matches(function() F.scaled_dot_product_attention(q, k, v, {causal = "bottom_right",
      is_causal = false}) end, "causal = bottom_right and is_causal = false disagree (give one of them)", 1, true)
    assert.error_matches(function() F.scaled_dot_product_attention(q, k, v, {is_causal = 1}) end,
      "expected is_causal to be a boolean, got number", 1, true)
  end)
end)

describe("F.flash_attention errors", function()
  local q = ember.randn(1, 4, 6, 16)
  it("names both shapes when they do not fit", function()
    local k3 = ember.randn(1, 3, 6, 16)
    assert.error_matches(function() F.flash_attention(q, k3, k3) end,
      "ember.flash_attention: expected q (B, H, Tq, D), k and v (B, Hkv, Tk, D) with H a multiple of Hkv, " ..
      "got [1, 4, 6, 16], [1, 3, 6, 16] and [1, 3, 6, 16]", 1, true)
    local kd = ember.randn(1, 4, 6, 32)
    assert.error_matches(function() F.flash_attention(q, kd, kd) end, "got [1, 4, 6, 16], [1, 4, 6, 32]", 1, true)
    local v7 = ember.randn(1, 4, 7, 16)
    assert.error_matches(function() F.flash_attention(q, q, v7) end, "and [1, 4, 7, 16]", 1, true)
    assert.error_matches(function() F.flash_attention(q, ember.randn(4, 6, 16), ember.randn(4, 6, 16)) end,
      "expected q, k and v with the same number of dims, got [1, 4, 6, 16], [4, 6, 16] and [4, 6, 16]", 1, true)
    local q3, k3b = ember.randn(2, 6, 16), ember.randn(3, 6, 16)
    assert.error_matches(function() F.flash_attention(q3, k3b, k3b) end,
      "expected q (B, Tq, D), k and v (B, Tk, D), got [2, 6, 16], [3, 6, 16] and [3, 6, 16]", 1, true)
    local q2 = ember.randn(6, 16)
    assert.error_matches(function() F.flash_attention(q2, q2, q2) end,
      "expected q of shape (B, H, T, D) or (B, T, D), got [6, 16]", 1, true)
  end)

  it("rejects bottom-right alignment with more queries than keys, and unknown alignments", function()
    local k = ember.randn(1, 4, 4, 16)
    assert.error_matches(function() F.flash_attention(q, k, k, "bottom_right") end,
      "expected Tq <= Tk for bottom-right causal alignment (the first Tq - Tk queries would see no key), " ..
      "got Tq = 6 and Tk = 4", 1, true)
    assert.error_matches(function() F.scaled_dot_product_attention(q, k, k, {causal = "bottom_right"}) end,
      "scaled_dot_product_attention: expected Tq <= Tk for bottom-right", 1, true)
    assert.error_matches(function() F.flash_attention(q, q, q, "lower_right") end,
      "expected causal true, false, 'top_left' or 'bottom_right', got 'lower_right'", 1, true)
    assert.error_matches(function() F.scaled_dot_product_attention(q, q, q, {causal = 1}) end,
      "expected causal true, false, 'top_left' or 'bottom_right', got number", 1, true)
  end)

  it("rejects head dims without a kernel, no keys, mixed dtypes and non-float inputs", function()
    local q24 = ember.randn(1, 1, 4, 24)
    assert.error_matches(function() F.flash_attention(q24, q24, q24) end,
      "no kernel for head dim 24 (supported: 16, 32, 64, 80, 96, 128, 256)", 1, true)
    local k0 = ember.randn(1, 4, 0, 16)
    assert.error_matches(function() F.flash_attention(q, k0, k0) end, "expected at least one key, got Tk = 0", 1, true)
    assert.error_matches(function() F.flash_attention(q, q:to("f64"), q) end,
      "expected q, k and v to have the same dtype, got f32, f64 and f32", 1, true)
    local i = ember.ones(1, 1, 4, 16, {dtype = "i32"})
    assert.error_matches(function() F.flash_attention(i, i, i) end, "flash_attention: expected", 1, true)
    assert.error_matches(function() core.flash_cpu_tiles(0, 4) end, "expected tile sizes in [1, 4096]", 1, true)
  end)

  it("core.flash_fwd_kernel takes auto, mma, wg, wg2 and wg3 (the CUDA forward's choice), names the others", function()
    local prev = core.flash_fwd_kernel("wg3")
    assert.are.equal("wg3", core.flash_fwd_kernel("wg2"))
    assert.are.equal("wg2", core.flash_fwd_kernel("wg"))
    assert.are.equal("wg", core.flash_fwd_kernel("mma"))
    assert.are.equal("mma", core.flash_fwd_kernel("auto"))
    assert.are.equal("auto", core.flash_fwd_kernel(prev))
    assert.are.equal(prev, core.flash_fwd_kernel())
    assert.error_matches(function() core.flash_fwd_kernel("wg4") end,
      'expected "auto", "mma", "wg", "wg2" or "wg3", got "wg4"', 1, true)
  end)

  it("core.flash_bwd_kernel takes auto, mma, wg, wg2, fused and fused_nd (the CUDA backward's choice), names the others",
    function()
    local prev = core.flash_bwd_kernel("wg")
    assert.are.equal("wg", core.flash_bwd_kernel("wg2"))
    assert.are.equal("wg2", core.flash_bwd_kernel("fused"))
    assert.are.equal("fused", core.flash_bwd_kernel("fused_nd"))
    assert.are.equal("fused_nd", core.flash_bwd_kernel("mma"))
    assert.are.equal("mma", core.flash_bwd_kernel("auto"))
    assert.are.equal("auto", core.flash_bwd_kernel(prev))
    assert.are.equal(prev, core.flash_bwd_kernel())
    assert.error_matches(function() core.flash_bwd_kernel("wg3") end,
      'expected "auto", "mma", "wg", "wg2", "fused" or "fused_nd", got "wg3"', 1, true)
  end)
end)
