-- norm_spec.lua — the VALUES of F.rmsnorm (engine/ops/norm.c):
--   y = x / sqrt(mean(x², −1) + eps) · w,
-- per row of the last dim, with and without a weight, the effect of eps, and
-- low-precision inputs computed in f32. Gradients live in gradcheck_spec.lua,
-- errors in bad_input_spec.lua.
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/norm_spec.lua
--
-- The reference is the formula in Lua doubles. Tolerances, and why:
--   * f64: 1e-14 relative (a D-term sum, a sqrt, a divide, two products).
--   * f32: 2^-20 (8 ulps) relative plus 2^-24 absolute: the engine's f32 path
--     rounds the inputs' products and the scale a few times; the absolute
--     part covers outputs near 0.
--   * bf16/f16: computed in f32 and rounded once, so exactly the f32 rmsnorm
--     of the widened values converted back, and within 1 ulp of the formula.

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local F = ember.nn.functional

local flat = H.flat

-- rmsnorm over the last dim of a tensor of `shape`, on flat values
local function rms_ref(vals, D, w, eps)
  local out = {}
  for base = 0, #vals - 1, D do
    local ss = 0.0
    for j = 1, D do ss = ss + vals[base + j] ^ 2 end
    local rstd = 1 / math.sqrt(ss / D + eps)
    for j = 1, D do out[base + j] = vals[base + j] * rstd * (w and w[j] or 1) end
  end
  return out
end

local assert_close = H.assert_close

local randn = H.randn

describe("F.rmsnorm", function()
  it("matches x / sqrt(mean(x²) + eps) · w per row (f64, (2, 3, 16))", function()
    local x, w = randn(1, {2, 3, 16}, "f64", 2), randn(2, {16}, "f64")
    local r = F.rmsnorm(x, w, 1e-5)
    assert.same({2, 3, 16}, r.shape)
    assert.equals("f64", r.dtype)
    assert_close(flat(r), rms_ref(flat(x), 16, flat(w), 1e-5), 1e-14, 0, "f64")
  end)

  it("f32: within 8 ulps of the double formula", function()
    local x, w = randn(3, {5, 32}, "f32", 3), randn(4, {32}, "f32")
    local r = F.rmsnorm(x, w, 1e-5)
    assert.equals("f32", r.dtype)
    assert_close(flat(r), rms_ref(flat(x), 32, flat(w), 1e-5), 2 ^ -20, 2 ^ -24, "f32")
  end)

  it("without a weight is the plain normalisation (w = 1)", function()
    local x = randn(5, {4, 8}, "f64")
    assert_close(flat(F.rmsnorm(x)), rms_ref(flat(x), 8, nil, 1e-5), 1e-14, 0, "no weight")
    assert_close(flat(F.rmsnorm(x, nil, 0.1)), rms_ref(flat(x), 8, nil, 0.1), 1e-14, 0, "no weight, eps 0.1")
  end)

  it("defaults eps to 1e-5", function()
    local x = randn(6, {2, 4}, "f64", 0.01)          -- mean(x²) ~ 1e-4: eps matters at 10%
    assert.same(F.rmsnorm(x, nil, 1e-5):tolist(), F.rmsnorm(x):tolist())
    assert.are_not.same(F.rmsnorm(x, nil, 0):tolist(), F.rmsnorm(x):tolist())
  end)

  it("eps changes the result as the formula says: small rows are damped", function()
    local x = randn(7, {3, 8}, "f64", 1e-3)          -- mean(x²) ~ 1e-6
    for _, eps in ipairs({0, 1e-6, 1e-5, 1}) do
      assert_close(flat(F.rmsnorm(x, nil, eps)), rms_ref(flat(x), 8, nil, eps), 1e-14, 0, "eps " .. eps)
    end
    -- with eps = 0 every row has rms exactly 1
    local y = F.rmsnorm(x, nil, 0):tolist()
    for _, row in ipairs(y) do
      local ss = 0.0
      for _, v in ipairs(row) do ss = ss + v * v end
      assert.is_true(math.abs(ss / 8 - 1) < 1e-14)
    end
  end)

  it("is invariant to scaling a row when eps = 0", function()
    local x = randn(8, {2, 16}, "f64")
    assert_close(flat(F.rmsnorm(x * 1000, nil, 0)), flat(F.rmsnorm(x, nil, 0)), 1e-14, 0, "scaled")
  end)

  it("a row of zeros gives zeros, not NaN (eps > 0)", function()
    assert.same({{0, 0, 0, 0}}, F.rmsnorm(ember.zeros(1, 4), nil, 1e-5):tolist())
  end)

  it("handles large f32 inputs (1e18, whose sum of squares 4e36 is near the f32 limit)", function()
    local x = ember.tensor({{1e18, -1e18, 1e18, -1e18}})
    local r = flat(F.rmsnorm(x))
    assert_close(r, {1, -1, 1, -1}, 2 ^ -20, 0, "large")
  end)

  for _, dt in ipairs({"bf16", "f16"}) do
    it(dt .. " input is computed in f32 and rounded once to " .. dt, function()
      local x, w = randn(9, {4, 24}, dt, 2), randn(10, {24}, dt)
      local r = F.rmsnorm(x, w)
      assert.equals(dt, r.dtype)
      assert.same(flat(F.rmsnorm(x:float(), w:float()):to(dt)), flat(r))
      local want, got = rms_ref(flat(x), 24, flat(w), 1e-5), flat(r)
      local bits = dt == "bf16" and 8 or 11
      for i = 1, #want do
        local ulp = want[i] == 0 and 0 or 2.0 ^ (math.floor(math.log(math.abs(want[i]), 2)) - bits + 1)
        assert.is_true(math.abs(got[i] - want[i]) <= ulp,
          string.format("%s %d: %.9g vs %.9g", dt, i, got[i], want[i]))
      end
    end)
  end

  it("bf16 input with an f32 weight (master weights) gives bf16", function()
    local x, w = randn(11, {3, 8}, "bf16"), randn(12, {8}, "f32")
    local r = F.rmsnorm(x, w)
    assert.equals("bf16", r.dtype)
    assert.same(flat(F.rmsnorm(x:float(), w):to("bf16")), flat(r))
  end)

  it("reads a non-contiguous input by its logical rows", function()
    local x = randn(13, {8, 3}, "f64"):t()            -- (3, 8), strides (1, 3)
    assert_close(flat(F.rmsnorm(x, nil, 1e-5)), rms_ref(flat(x), 8, nil, 1e-5), 1e-14, 0, "transposed")
  end)

  it("a 1-D input is one row", function()
    local x = ember.tensor({3, 4}, {dtype = "f64"})     -- rms = sqrt(12.5)
    assert_close(flat(F.rmsnorm(x, nil, 0)), {3 / math.sqrt(12.5), 4 / math.sqrt(12.5)}, 1e-15, 0, "1-D")
  end)
end)

-- F.add_rmsnorm (engine/ops/norm.c): s = x + r and rmsnorm(s) in one node,
-- the same bits as `x + r` then F.rmsnorm, forward and backward (the CPU
-- calls the same add and norm; the CUDA kernel is checked the same way in
-- tests/gpu/norm_spec.lua).
describe("F.add_rmsnorm", function()
  -- the grads of x, r, w through (s, y) weighed by gs, gy, and through the unfused pair
  local function grads(fused, x, r, w, gs, gy)
    local leaves = {x:detach():requires_grad_(), r:detach():requires_grad_(), w and w:detach():requires_grad_()}
    local s, y
    if fused then s, y = F.add_rmsnorm(leaves[1], leaves[2], leaves[3])
    else s = leaves[1] + leaves[2]; y = F.rmsnorm(s, leaves[3]) end
    local loss = (y * gy):sum()
    if gs then loss = loss + (s * gs):sum() end
    loss:backward()
    return s, y, leaves[1].grad, leaves[2].grad, leaves[3] and leaves[3].grad
  end

  local combos = {
    {"f32 stream, bf16 branch, f32 weight (autocast's)", "f32", "bf16", "f32"},
    {"f32, f32, f32", "f32", "f32", "f32"},
    {"f32 stream, f16 branch, no weight", "f32", "f16", nil},
    {"f64, f32 branch, f64 weight", "f64", "f32", "f64"},
  }
  for _, c in ipairs(combos) do
    it("gives the bits of x + r then rmsnorm, and their gradients: " .. c[1], function()
      local x, r = randn(21, {3, 5, 24}, c[2]), randn(22, {3, 5, 24}, c[3])
      local w = c[4] and randn(23, {24}, c[4])
      local gs, gy = randn(24, {3, 5, 24}, c[2]), randn(25, {3, 5, 24}, c[2])
      local a = {grads(true, x, r, w, gs, gy)}
      local b = {grads(false, x, r, w, gs, gy)}
      assert.equals(c[2], a[1].dtype)
      assert.equals(c[2], a[2].dtype)
      assert.equals(c[3], a[4].dtype)
      for k = 1, (w and 5 or 4) do assert.same(flat(b[k]), flat(a[k]), "output " .. k) end
      -- and with only the norm's output used (s's gradient absent)
      local a2, b2 = {grads(true, x, r, w, nil, gy)}, {grads(false, x, r, w, nil, gy)}
      for k = 3, (w and 5 or 4) do assert.same(flat(b2[k]), flat(a2[k]), "no gs, grad " .. k) end
    end)
  end

  it("records one node with two outputs where it fuses, the pair where it does not", function()
    local x = randn(31, {2, 8}, "f32"):requires_grad_()
    local s, y = F.add_rmsnorm(x, randn(32, {2, 8}, "bf16"), randn(33, {8}, "f32"))
    assert.equals("add_rmsnorm", s.grad_fn)
    assert.equals("add_rmsnorm", y.grad_fn)
    -- bf16 x: the add and the norm (autocast-free, bf16 out)
    local xb = randn(34, {2, 8}, "bf16"):requires_grad_()
    local s2, y2 = F.add_rmsnorm(xb, randn(35, {2, 8}, "bf16"))
    assert.equals("bf16", y2.dtype)
    assert.is_not.equals("add_rmsnorm", y2.grad_fn)
    assert.is_not.equals("add_rmsnorm", s2.grad_fn)
  end)

  it("under autocast bf16 gives the f32 sum and the f32 norm of the pair", function()
    local x, r, w = randn(41, {4, 16}, "f32"), randn(42, {4, 16}, "bf16"), randn(43, {16}, "f32")
    local s, y = ember.autocast("bf16", function() return F.add_rmsnorm(x, r, w) end)
    local s2, y2 = ember.autocast("bf16", function() local t = x + r; return t, F.rmsnorm(t, w) end)
    assert.equals("f32", y.dtype)
    assert.same(flat(s2), flat(s))
    assert.same(flat(y2), flat(y))
  end)

  it("refuses r of another shape, naming both", function()
    local ok, err = pcall(F.add_rmsnorm, ember.zeros(2, 8), ember.zeros(8))
    assert.is_false(ok)
    assert.matches("add_rmsnorm: expected r of x's shape [2, 8], got [8]", tostring(err), 1, true)
  end)
end)

-- The model with the adds fused (default) and with EMBER_FUSE_ADD_RMSNORM=0:
-- H.tiny_model_digests_script's digests bit for bit.
describe("TransformerLM with EMBER_FUSE_ADD_RMSNORM", function()
  it("gives the same losses, gradients, weights and cached logits bit for bit as the unfused pair", function()
    local script = H.tiny_model_digests_script()
    H.switch_agrees(script, "EMBER_FUSE_ADD_RMSNORM", {"0", "1"}, "2", 100)
    H.switch_refuses(script, "EMBER_FUSE_ADD_RMSNORM", "yes",
      "EMBER_FUSE_ADD_RMSNORM must be 0 or 1, got 'yes'; using 1")
    H.remove_temps()
  end)
end)

-- out_dtype (engine/ops/norm.c, em_rmsnorm_out): y written in bf16/f16 by
-- the norm for f32 x, the bits of F.rmsnorm(...):to(od) forward; y's
-- gradient is summed in f32, so with one consumer whose gradient is already
-- in od (a bf16 product, or a bf16 gy at the root) the gradients of x, r and
-- w are the composition's bit for bit, and with several consumers they are
-- those of an f32 y that each consumer casts itself (the model's case: the
-- norms' only consumers are linears under autocast).
describe("F.rmsnorm and F.add_rmsnorm with out_dtype", function()
  local shapes = {{3, 5, 24}, {7, 13}, {2, 1, 40}, {1, 96}, {4, 9}}

  -- y = the op with out_dtype (new) or the composition, and its gradients (helpers.lua)
  local run = H.norm_out_grads

  for _, op in ipairs({"rmsnorm", "add_rmsnorm"}) do
    for si, shape in ipairs(shapes) do
      for _, od in ipairs({"bf16", "f16"}) do
        for _, has_w in ipairs({true, false}) do
          for _, consumer in ipairs({"root", "product"}) do
            local rdt = si % 2 == 1 and "bf16" or "f32"
            it(("%s %s -> %s%s, gradient by %s%s: the composition's bits"):format(op, H.shape_str and
               H.shape_str(shape) or table.concat(shape, "x"), od, has_w and ", weight" or "", consumer,
               op == "add_rmsnorm" and (", r " .. rdt) or ""), function()
              local D = shape[#shape]
              local x, w = randn(100 + si, shape, "f32", 2), has_w and randn(110 + si, {D}, "f32") or nil
              local r = op == "add_rmsnorm" and randn(120 + si, shape, rdt) or nil
              local gs, gy = randn(130 + si, shape, "f32"), randn(140 + si, shape, od)
              local a = run(true, op, od, x, r, w, gs, gy, consumer)
              local b = run(false, op, od, x, r, w, gs, gy, consumer)
              assert.equals(od, a.y.dtype)
              assert.equals(op, a.y.grad_fn)
              if op == "add_rmsnorm" then
                assert.equals("f32", a.s.dtype)
                assert.same(flat(b.s), flat(a.s), "s")
              end
              assert.same(flat(b.y), flat(a.y), "y")
              for _, k in ipairs({"gx", "gr", "gw"}) do
                if a[k] or b[k] then
                  assert.equals(b[k].dtype, a[k].dtype, k)
                  assert.same(flat(b[k]), flat(a[k]), k)
                end
              end
            end)
          end
        end
      end
    end
  end

  it("sums y's gradients over several consumers in f32: those of an f32 y each consumer casts", function()
    for _, op in ipairs({"rmsnorm", "add_rmsnorm"}) do
      local x, r, w = randn(201, {6, 40}, "f32", 2), randn(202, {6, 40}, "bf16"), randn(203, {40}, "f32")
      local g1, g2 = randn(204, {6, 40}, "bf16"), randn(205, {6, 40}, "bf16")
      local function grads(new)
        local xl, wl = x:detach():requires_grad_(), w:detach():requires_grad_()
        local y1, y2
        if new then
          local _, y
          if op == "rmsnorm" then y = F.rmsnorm(xl, wl, 1e-5, {out_dtype = "bf16"})
          else _, y = F.add_rmsnorm(xl, r, wl, 1e-5, {out_dtype = "bf16"}) end
          y1, y2 = y, y
        else
          local _, y
          if op == "rmsnorm" then y = F.rmsnorm(xl, wl, 1e-5) else _, y = F.add_rmsnorm(xl, r, wl, 1e-5) end
          y1, y2 = y:to("bf16"), y:to("bf16")          -- two casts: two gradients widened, summed in f32
        end
        ;((y1 * g1):sum():float() + (y2 * g2):sum():float()):backward()
        return xl.grad, wl.grad
      end
      local ax, aw = grads(true)
      local bx, bw = grads(false)
      assert.same(flat(bx), flat(ax), op .. " gx")
      assert.same(flat(bw), flat(aw), op .. " gw")
    end
  end)

  it("under autocast: bf16 x widened first, y in the out_dtype with the composition's bits", function()
    local x, w = randn(211, {5, 24}, "bf16"), randn(212, {24}, "f32")
    local y = ember.autocast("bf16", function() return F.rmsnorm(x, w, 1e-5, {out_dtype = "bf16"}) end)
    local y2 = ember.autocast("bf16", function() return F.rmsnorm(x, w, 1e-5):to("bf16") end)
    assert.equals("bf16", y.dtype)
    assert.same(flat(y2), flat(y))
    local x2, r = randn(213, {5, 24}, "f32"), randn(214, {5, 24}, "bf16")
    local s, yy = ember.autocast("f16", function() return F.add_rmsnorm(x2, r, w, 1e-5, {out_dtype = "f16"}) end)
    local s2 = x2 + r
    assert.equals("f32", s.dtype)
    assert.equals("f16", yy.dtype)
    assert.same(flat(s2), flat(s))
    assert.same(flat(F.rmsnorm(s2, w):to("f16")), flat(yy))
  end)

  it("other dtypes are the norm then the cast: f64 x, bf16 x, f32 out, out = x's dtype", function()
    local xd, wd = randn(221, {3, 10}, "f64"):requires_grad_(), randn(222, {10}, "f64")
    local y = F.rmsnorm(xd, wd, 1e-5, {out_dtype = "f32"})
    assert.equals("f32", y.dtype)
    assert.equals("to", y.grad_fn)
    assert.same(flat(F.rmsnorm(xd, wd):to("f32")), flat(y))
    local xb = randn(223, {3, 10}, "bf16")
    assert.same(flat(F.rmsnorm(xb, nil):to("f32")), flat(F.rmsnorm(xb, nil, 1e-5, {out_dtype = "f32"})))
    local xf = randn(224, {3, 10}, "f32"):requires_grad_()
    local yf = F.rmsnorm(xf, nil, 1e-5, {out_dtype = "float32"})
    assert.equals("rmsnorm", yf.grad_fn)
    assert.same(flat(F.rmsnorm(xf)), flat(yf))
    local s, ys = F.add_rmsnorm(xd, randn(225, {3, 10}, "f32"), wd, 1e-5, {out_dtype = "bf16"})
    assert.equals("f64", s.dtype)
    assert.equals("bf16", ys.dtype)
    assert.same(flat(F.rmsnorm(s, wd):to("bf16")), flat(ys))
  end)

  it("refuses an out_dtype that is not a float dtype, an unknown option, and a non-table", function()
    local x = ember.zeros(2, 8)
    local ok, err = pcall(F.rmsnorm, x, nil, 1e-5, {out_dtype = "i64"})
    assert.is_false(ok)
    assert.matches("rmsnorm: expected out_dtype to be a float dtype (f32, f64, bf16, f16), got i64", tostring(err), 1,
      true)
    ok, err = pcall(F.add_rmsnorm, x, x, nil, 1e-5, {out_dtype = "bool"})
    assert.is_false(ok)
    assert.matches("add_rmsnorm: expected out_dtype to be a float dtype (f32, f64, bf16, f16), got bool",
      tostring(err), 1, true)
    ok, err = pcall(F.rmsnorm, x, nil, 1e-5, {dtype = "bf16"})
    assert.is_false(ok)
    assert.matches("ember.nn.functional.rmsnorm: unknown option 'dtype' (expected out_dtype)", tostring(err), 1, true)
    ok, err = pcall(F.add_rmsnorm, x, x, nil, 1e-5, "bf16")
    assert.is_false(ok)
    assert.matches("ember.nn.functional.add_rmsnorm: expected an options table {out_dtype = ...}, got string",
      tostring(err), 1, true)
  end)
end)

describe("nn.RMSNorm out_dtype", function()
  it("'autocast' gives y in the region's dtype inside autocast and as before outside it", function()
    local n = ember.nn.RMSNorm(16, {out_dtype = "autocast"})
    local x, r = randn(231, {3, 16}, "f32"), randn(232, {3, 16}, "bf16")
    assert.equals("f32", n(x).dtype)
    assert.same(flat(F.rmsnorm(x, n.weight)), flat(n(x)))
    local y = ember.autocast("bf16", function() return n(x) end)
    assert.equals("bf16", y.dtype)
    assert.same(flat(F.rmsnorm(x, n.weight):to("bf16")), flat(y))
    local s, y2 = ember.autocast("f16", function() return n(x, r) end)
    assert.equals("f32", s.dtype)
    assert.equals("f16", y2.dtype)
    local fixed = ember.nn.RMSNorm(16, {out_dtype = "bf16"})
    assert.equals("bf16", fixed(x).dtype)
    assert.is_nil(ember.nn.RMSNorm(16).out_dtype)
  end)

  it("refuses an out_dtype that is neither a float dtype nor 'autocast'", function()
    local ok, err = pcall(ember.nn.RMSNorm, 4, {out_dtype = "i32"})
    assert.is_false(ok)
    assert.matches('ember.nn.RMSNorm: expected out_dtype to be a float dtype (f32, f64, bf16, f16) or "autocast", got i32',
      tostring(err), 1, true)
  end)
end)

-- The model's norms under autocast with out_dtype (default) and with
-- EMBER_NORM_OUT16=0 (f32 y, each linear casting it): the losses of three
-- AdamW steps, the final weights and every gradient bit for bit, under bf16
-- and f16 autocast, and a cached (KV) step's logits; f32 (no autocast) too.
describe("TransformerLM with EMBER_NORM_OUT16", function()
  it("gives the same losses, gradients, weights and cached logits bit for bit", function()
    local script = H.tiny_model_digests_script()
    H.switch_agrees(script, "EMBER_NORM_OUT16", {"0", "1"}, "2", 100)
    H.switch_refuses(script, "EMBER_NORM_OUT16", "yes", "EMBER_NORM_OUT16 must be 0 or 1, got 'yes'; using 1")
    -- and the switch does change the path: the norms ask for the region's dtype only with it on
    local probe = H.temp_file([[
      local e = require 'ember'
      local m = e.nn.TransformerLM(e.nn.configs.tiny{vocab_size = 37, context_length = 12})
      local x = e.randint(0, 37, {1, 4})
      local h = e.autocast("bf16", function() return m.ln_final(m.token_embeddings(x)) end)
      io.write(tostring(m.layers[1].ln1.out_dtype), " ", tostring(m.layers[1].ln2.out_dtype), " ",
        tostring(m.ln_final.out_dtype), " ", h.dtype)]], ".lua")
    local on = H.ember({"run", probe}, {env = {EMBER_NORM_OUT16 = "1"}})
    local off = H.ember({"run", probe}, {env = {EMBER_NORM_OUT16 = "0"}})
    assert.equals("autocast autocast autocast bf16", on)
    assert.equals("nil nil nil f32", off)
    H.remove_temps()
  end)
end)
