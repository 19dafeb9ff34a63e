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

describe("isnan and isfinite on CUDA", function()
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
