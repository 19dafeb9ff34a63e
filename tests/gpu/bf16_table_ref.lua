-- bf16_table_ref.lua — the results that bf16_table_spec.lua checks, as text
-- that keeps every bit (hex floats; "nan" for a NaN): gelu, gelu tanh and
-- binary_cross_entropy_with_logits on CUDA over every bf16 value. The spec
-- computes them in its own process and in a child run with the table
-- kernels switched off (EMBER_GELU_TAB=0 EMBER_BCE_LPTAB=0), which prints
-- them: the two texts must be equal. dofile returns the functions; run with
-- EMBER_BF16_TABLE_PRINT=1 it prints them, one per line.
local ember = require "ember"
local F = ember.nn.functional
local M = {}

-- every bf16 bit pattern's value in f64 (the NaNs are one NaN), in bit order
function M.all_bf16()
  local v = {}
  for b = 0, 65535 do
    local s, e, m = b >> 15, (b >> 7) & 255, b & 127
    local x
    if e == 255 then x = m == 0 and math.huge or 0 / 0
    elseif e == 0 then x = m * 2.0 ^ -133
    else x = (128 + m) * 2.0 ^ (e - 134) end
    v[#v + 1] = s == 1 and -x or x
  end
  return ember.tensor(v, {dtype = "f64"}):to("bf16")
end

M.text = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "hex_text.lua")

-- {name, function returning the text of one result}, on device dev (default
-- cuda; EMBER_BF16_TABLE_DEVICE=cpu checks the script itself without a GPU)
function M.cases(dev)
  dev = dev or os.getenv("EMBER_BF16_TABLE_DEVICE") or "cuda"
  local x = M.all_bf16():to(dev)
  ember.manual_seed(5)
  local y = ember.rand({65536}):to("bf16"):to(dev)
  -- 2^22 elements: many grid-stride trips a thread, so the sums' partials are the kernels' own
  local big = x:reshape(1, 65536):expand(64, 65536):contiguous():reshape(64 * 65536)
  ember.manual_seed(6)
  local ybig = ember.rand({64 * 65536}):to("bf16"):to(dev)
  local zero = ember.zeros({64 * 65536}, {dtype = "bf16", device = dev})
  local finite = ember.where(big:ne(big), zero, big)
  finite = ember.where(finite:abs():eq(math.huge), zero, finite)
  ember.manual_seed(7)
  local rn = ember.randn({64 * 65536}):to("bf16"):to(dev)
  local function bce(a, b, r) return M.text(F.binary_cross_entropy_with_logits(a, b, {reduction = r})) end
  return {
    {"gelu all bf16", function() return M.text(x:gelu()) end},
    {"gelu tanh all bf16", function() return M.text(F.gelu(x, {approximate = "tanh"})) end},
    {"bce none all bf16", function() return bce(x, y, "none") end},
    {"bce mean all bf16 x64", function() return bce(big, ybig, "mean") end},
    {"bce sum all bf16 x64", function() return bce(big, ybig, "sum") end},
    {"bce mean finite x64", function() return bce(finite, ybig, "mean") end},
    {"bce mean randn 2^22", function() return bce(rn, ybig, "mean") end},
  }
end

if os.getenv("EMBER_BF16_TABLE_PRINT") then
  for _, c in ipairs(M.cases()) do print(c[1] .. ": " .. c[2]()) end
end
return M
