-- philox_ref.lua — Philox4x32-10 and Ember's stream layout (ember/rng.h) in
-- plain Lua 5.4, the reference the random and dropout specs check draws
-- against; rng_spec.lua pins it to Random123's known answers. Returns
-- {philox, block, words, u24, u64}.
local MASK = 0xffffffff
local M0, M1 = 0xD2511F53, 0xCD9E8D57
local W0, W1 = 0x9E3779B9, 0xBB67AE85

-- Lua integer multiplication wraps modulo 2^64, so the 64-bit product is exact.
local function mulhilo(a, b)
  local p = a * b
  return (p >> 32) & MASK, p & MASK
end

local function philox(c0, c1, c2, c3, k0, k1)
  for _ = 1, 10 do
    local hi0, lo0 = mulhilo(M0, c0)
    local hi1, lo1 = mulhilo(M1, c2)
    c0, c1, c2, c3 = hi1 ~ c1 ~ k0, lo1, hi0 ~ c3 ~ k1, lo0
    k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
  end
  return {c0, c1, c2, c3}
end

local R = {}
--- Philox4x32-10 of counter (c0..c3) under key (k0, k1): the four output words
R.philox = philox
--- the block at counter c under key seed
function R.block(seed, c) return philox(c & MASK, (c >> 32) & MASK, 0, 0, seed & MASK, (seed >> 32) & MASK) end
--- the n words of an op starting at counter ctr0 (element j: word j % 4 of block j / 4)
function R.words(seed, ctr0, n)
  local out = {}
  for j = 0, n - 1 do out[j + 1] = R.block(seed, ctr0 + j // 4)[j % 4 + 1] end
  return out
end
--- u(w) = (w >> 8) 2^-24
function R.u24(w) return (w >> 8) * 2.0 ^ -24 end
--- element e's 64-bit draw: block ctr0 + e / 2, words 2(e%2) (low) and 2(e%2)+1 (high)
function R.u64(seed, ctr0, e)
  local b = R.block(seed, ctr0 + e // 2)
  local h = e % 2
  return b[2 * h + 1] | (b[2 * h + 2] << 32)
end
return R
