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
-- the losses of three AdamW steps and the final weights bit for bit, in f32
-- and under bf16 autocast, and a cached (KV) generation step's logits.
describe("TransformerLM with EMBER_FUSE_ADD_RMSNORM", function()
  it("gives the same losses, weights and cached logits bit for bit as the unfused pair", function()
    local script = H.temp(".lua")
    H.spit(script, [[
      local e = require 'ember'
      local nn, F = e.nn, e.nn.functional
      local out = {}
      for _, amp in ipairs({false, true}) do
        e.manual_seed(7)
        local m = nn.TransformerLM(nn.configs.tiny{vocab_size = 37, context_length = 12})
        local opt = e.optim.AdamW(m:parameters(), {lr = 1e-2})
        local data = e.randint(0, 37, {2, 13})
        local x, y = data:narrow(1, 0, 12):contiguous(), data:narrow(1, 1, 12):contiguous()
        for _ = 1, 3 do
          opt:zero_grad()
          local loss = amp and e.autocast("bf16", function() return F.cross_entropy(m(x), y) end)
                       or F.cross_entropy(m(x), y)
          loss:backward()
          opt:step()
          out[#out + 1] = ('%a'):format(loss:item())
        end
        local sum = 0
        for _, p in ipairs(m:parameters()) do sum = sum + p:double():abs():sum():item() end
        out[#out + 1] = ('%a'):format(sum)
        local kv = nn.KVCache(m, {batch = 2, max_len = 12})
        local logits = m(x:narrow(1, 0, 5):contiguous(), {cache = kv})
        out[#out + 1] = ('%a'):format(logits:double():abs():sum():item())
      end
      io.write(table.concat(out, ';'))]])
    H.switch_agrees(script, "EMBER_FUSE_ADD_RMSNORM", {"0", "1"}, "2", 100)
    H.switch_refuses(script, "EMBER_FUSE_ADD_RMSNORM", "yes",
      "EMBER_FUSE_ADD_RMSNORM must be 0 or 1, got 'yes'; using 1")
    H.remove_temps()
  end)
end)
