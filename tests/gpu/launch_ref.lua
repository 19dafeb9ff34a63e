-- launch_ref.lua — the results launch_spec.lua compares between EMBER_CUDA_LAUNCH=runtime and =driver
-- (kernels/launch.cuh): every kernel launched through em_launch -- ew_contig (1 to 3 operands, vectorised
-- and element by element, f32 and f64, constants and broadcast scalars), ew_fixed (bf16/f16 binary,
-- ternary and transcendental ops, f32 gelu), gelu_tab, fill_'s two kernels -- eagerly and replayed from
-- a CUDA graph, as text (hex floats). Run as a script it prints "name: text" lines; EMBER_LAUNCH_REF_DEVICE=cpu
-- checks the script itself without a GPU.
local ember = require "ember"

local M = {}

M.text = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "hex_text.lua")

-- {name, function returning the text of one result}, on device dev
function M.cases(dev)
  ember.manual_seed(17)
  local x, y, z = ember.randn(1000):to(dev), ember.randn(1000):to(dev), ember.rand(1000):to(dev)
  local s = ember.tensor(0.75):to(dev)                    -- a 0-d tensor: ew_contig's broadcast scalar
  local one, two = ember.ones(1, {device = dev}), ember.full({1}, 2, {device = dev})
  local xb, yb = x:to("bf16"), y:to("bf16")
  local xh, yh = x:to("f16"), y:to("f16")
  local xd, yd = x:to("f64"), y:to("f64")
  local T = M.text
  local cases = {
    {"a + b 1 element", function() return T(one + two) end},
    {"a:add_(b) 1 element", function() local a = one:clone(); a:add_(two); return T(a) end},
    {"f32 add", function() return T(x + y) end},
    {"f32 mul in place", function() local a = x:clone(); a:mul_(y); return T(a) end},
    {"f32 neg", function() return T(-x) end},
    {"f32 add a number", function() return T(x + 3.5) end},
    {"f32 mul a 0-d tensor", function() return T(x * s) end},
    {"f32 lerp", function() return T(x:lerp(y, z)) end},
    {"f32 gelu", function() return T(x:gelu()) end},
    {"f32 add unaligned", function() return T(x:narrow(0, 1, 999) + y:narrow(0, 1, 999)) end},
    {"f64 add", function() return T(xd + yd) end},
    {"f64 exp", function() return T(xd:exp()) end},
    {"bf16 add", function() return T(xb + yb) end},
    {"bf16 gelu", function() return T(xb:gelu()) end},
    {"bf16 addcmul", function() return T(xb:addcmul(yb, z:to("bf16"), {value = 0.5})) end},
    {"f16 mul", function() return T(xh * yh) end},
    {"f16 silu", function() return T(xh:silu()) end},
    {"fill_ contiguous", function() return T(ember.empty(1001, {device = dev}):fill_(2.5)) end},
    {"fill_ strided", function()
      local m = ember.zeros(8, 9, {device = dev})
      m:t():narrow(0, 2, 3):fill_(-7)
      return T(m)
    end},
    {"fill_ bf16 and zero", function()
      local m = ember.ones(33, {device = dev, dtype = "bf16"})
      m:narrow(0, 1, 20):fill_(0.1)
      m:narrow(0, 25, 4):zero_()
      return T(m)
    end},
  }
  if dev == "cuda" then
    cases[#cases + 1] = {"graph replay of add, gelu, fill_", function()
      local a = ember.zeros(1000, {device = dev})
      local g, o1, o2 = ember.cuda.graph(function()
        local u = a + y
        u:fill_(1.25)
        return a * y, (a + x):gelu()
      end, {warmup = 1})
      a:copy_(x)
      g:replay()
      local r = T(o1) .. " | " .. T(o2)
      g:close()
      return r
    end}
  end
  return cases
end

if not pcall(debug.getlocal, 4, 1) then   -- run as a script: print the results
  local dev = os.getenv("EMBER_LAUNCH_REF_DEVICE") or "cuda"
  for _, c in ipairs(M.cases(dev)) do print(c[1] .. ": " .. c[2]()) end
end
return M
