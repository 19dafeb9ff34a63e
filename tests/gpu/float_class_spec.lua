-- float_class_spec.lua (GPU) — isnan and isfinite on CUDA (kernels/math_ops.cu)
-- against the CPU, exactly: every size edge of the wide path (G 16-byte vectors
-- a thread, G = 4 f32/f64, 2 bf16/f16; the leftover vectors; the scalar tail),
-- NaN, +-inf and finite values at random places, and views off the 16-byte
-- alignment (the one-element path).
local ember = require "ember"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local cmp = dofile(here .. "compare.lua")

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local NAN, INF = 0 / 0, math.huge
local SIZES = {1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129, 4 * 256 * 4 + 5, (1 << 20) + 13}

-- randn with about 10 % NaN, 5 % +inf and 5 % -inf
local function mixed(n, dt)
  local x = ember.randn(n)
  x = x:masked_fill(ember.rand(n):lt(0.1), NAN)
  x = x:masked_fill(ember.rand(n):lt(0.05), INF)
  x = x:masked_fill(ember.rand(n):lt(0.05), -INF)
  return x:to(dt)
end

-- every 16-bit pattern's value in f64 (the NaNs as one NaN), in bit order: ebits
-- exponent bits, mbits mantissa bits (bf16 8/7, f16 5/10)
local function all16(ebits, mbits, dt)
  local v, emax, bias = {}, (1 << ebits) - 1, (1 << (ebits - 1)) - 1
  for b = 0, 65535 do
    local s, e, m = b >> 15, (b >> mbits) & emax, b & ((1 << mbits) - 1)
    local x
    if e == emax then x = m == 0 and INF or NAN
    elseif e == 0 then x = m * 2.0 ^ (1 - bias - mbits)
    else x = ((1 << mbits) + m) * 2.0 ^ (e - bias - mbits) end
    v[#v + 1] = s == 1 and -x or x
  end
  return ember.tensor(v, {dtype = "f64"}):to(dt)
end

describe("isnan and isfinite on CUDA", function()
  -- bf16/f16 test two elements a word (classify4: an add into bit 15 of each half)
  for _, c in ipairs({{"bf16", 8, 7}, {"f16", 5, 10}}) do
    it(c[1] .. ": every value (subnormals, both zeros, both infinities, the largest finite), the CPU's answer", function()
      local x = all16(c[2], c[3], c[1])
      assert.are.equal(65536, x.shape[1])
      local g = x:to("cuda")
      for _, op in ipairs({"isnan", "isfinite"}) do
        cmp.assert_equal(g[op](g), x[op](x), ("%s over every %s value"):format(op, c[1]))
      end
    end)
  end

  for _, dt in ipairs({"f32", "bf16", "f16", "f64"}) do
    it(dt .. ": every size edge, the CPU's answer", function()
      ember.manual_seed(31)
      for _, n in ipairs(SIZES) do
        local x = mixed(n, dt)
        local g = x:to("cuda")
        for _, op in ipairs({"isnan", "isfinite"}) do
          local got = g[op](g)
          assert.are.equal("cuda:0", got.device)
          cmp.assert_equal(got, x[op](x), ("%s %s n=%d"):format(op, dt, n))
        end
      end
    end)

    it(dt .. ": views 1 and 8 elements in", function()
      ember.manual_seed(32)
      local x = mixed(4 * 256 * 4 + 40, dt)
      for _, off in ipairs({1, 8}) do
        local v = x:narrow(0, off, x.shape[1] - off - 3)
        local g = x:to("cuda"):narrow(0, off, x.shape[1] - off - 3)
        for _, op in ipairs({"isnan", "isfinite"}) do
          cmp.assert_equal(g[op](g), v[op](v), ("%s %s view at %d"):format(op, dt, off))
        end
      end
    end)
  end
end)
