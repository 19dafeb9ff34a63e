-- normal_f32_ref.lua — the f32 Box-Muller of engine/backend/rng_math.h
-- (normal_/randn into f32/bf16/f16) re-derived in plain Lua 5.4, the
-- reference rng_spec.lua checks the engine's draws against bit for bit.
--
-- An f32 operation is one double operation rounded to f32: exact for + - *
-- / and sqrt of f32 operands (53 >= 2 * 24 + 2 bits, so the double rounding
-- is innocuous), which is why rng_math.h uses no fmaf. The constants are
-- derived here from their definitions (FreeBSD logf's minimax coefficients
-- by their bit patterns, the sin/cos Taylor coefficients from math.pi), not
-- copied from the C source. Returns {f32, logf, sincos2pi, normals}.
local R = {}

local function f32(x) return (string.unpack("<f", string.pack("<f", x))) end
local function bits(x) return (string.unpack("<I4", string.pack("<f", x))) end
local function from_bits(u) return (string.unpack("<f", string.pack("<I4", u))) end
R.f32 = f32

local function mul(a, b) return f32(a * b) end
local function add(a, b) return f32(a + b) end
local function sub(a, b) return f32(a - b) end

local ln2_hi, ln2_lo = from_bits(0x3f317180), from_bits(0x3717f7d1)
local Lg1, Lg2, Lg3, Lg4 = 0xaaaaaa * 2.0^-24, 0xccce13 * 2.0^-25, 0x91e9ee * 2.0^-25, 0xf89e26 * 2.0^-26

--- ln x in f32 for 0 < x <= 1 (x an f32), FreeBSD logf's reduction and polynomial
function R.logf(x)
  local ix = bits(x)
  local k = (ix >> 23) - 127
  ix = ix & 0x7fffff
  local i = (ix + 0x4afb20) & 0x800000
  local m = from_bits(ix | (i ~ 0x3f800000))
  k = k + (i >> 23)
  local f = sub(m, 1.0)
  local s = f32(f / add(2.0, f))
  local z = mul(s, s)
  local w = mul(z, z)
  local t1 = mul(w, add(Lg2, mul(w, Lg4)))
  local t2 = mul(z, add(Lg1, mul(w, Lg3)))
  local r = add(t2, t1)
  local hfsq = mul(mul(0.5, f), f)
  local dk = k + 0.0
  local inner = add(mul(s, add(hfsq, r)), mul(dk, ln2_lo))
  return sub(mul(dk, ln2_hi), sub(sub(hfsq, inner), f))
end

local S, C = {}, {}
do
  local fact = 1
  for n = 1, 10 do
    fact = fact * n
    local c = (2 * math.pi) ^ n / fact
    if n % 2 == 1 then S[n] = f32(((n - 1) // 2) % 2 == 0 and c or -c)
    else C[n] = f32((n // 2) % 2 == 0 and c or -c) end
  end
end

--- sin and cos of 2 pi m 2^-24 (0 <= m < 2^24) in f32
function R.sincos2pi(m)
  local j = (m + 0x200000) >> 22
  local r = (m - (j << 22)) * 2.0^-24
  local r2 = mul(r, r)
  local ps = add(S[7], mul(r2, S[9]))
  ps = add(S[5], mul(r2, ps))
  ps = add(S[3], mul(r2, ps))
  ps = add(S[1], mul(r2, ps))
  local sr = mul(r, ps)
  local pc = add(C[8], mul(r2, C[10]))
  pc = add(C[6], mul(r2, pc))
  pc = add(C[4], mul(r2, pc))
  pc = add(C[2], mul(r2, pc))
  local cr = add(1.0, mul(r2, pc))
  local q = j & 3
  if q == 0 then return sr, cr
  elseif q == 1 then return cr, -sr
  elseif q == 2 then return -sr, -cr
  else return -cr, sr end
end

--- the f32 values mean + std z of n elements from words w (word j + 1 for element j)
function R.normals(w, n, mean, std)
  mean, std = f32(mean or 0), f32(std or 1)
  local out = {}
  for j = 0, n - 1, 2 do
    local x = sub(1.0, (w[j + 1] >> 8) * 2.0^-24)
    local r = f32(math.sqrt(mul(-2.0, R.logf(x))))
    local sn, cs = R.sincos2pi(w[j + 2] >> 8)
    out[j + 1] = add(mean, mul(std, mul(r, cs)))
    out[j + 2] = add(mean, mul(std, mul(r, sn)))
  end
  out[n + 1] = nil
  return out
end

return R
