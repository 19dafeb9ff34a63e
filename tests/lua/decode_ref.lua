-- decode_ref.lua — the reference of F.flash_decode for its specs (CPU:
-- tests/lua/flash_decode_spec.lua; GPU: tests/gpu/flash_decode_spec.lua),
-- loaded with dofile; not a spec itself. The masked composition, as
-- nn.KVCache's decode step runs it: scores q kᵀ · scale over all max_len
-- cached keys, the keys a query may not see set to −inf, softmax, · v.
-- Query i of batch b sees keys j < n_b − Tq + 1 + i (bottom-right causal
-- against the first n_b keys); rows that see no key are NaN here (softmax of
-- −inf everywhere), which is why the specs compare those rows apart.
local ember = require "ember"
local F = ember.nn.functional

local M = {}

-- k (B, Hkv, T, d) with each kv head repeated for its group of H q heads
function M.repeat_kv(k, H)
  local B, Hkv, T, d = table.unpack(k.shape)
  if Hkv == H then return k end
  return k:unsqueeze(2):expand(B, Hkv, H // Hkv, T, d):reshape(B, H, T, d)
end

-- The mask (B, 1, Tq, max_len), true where query i of batch b may not see key j;
-- counts: a list of B counts (one per batch, already clamped to [0, max_len]).
function M.hidden(counts, Tq, max_len, device)
  local rows = {}
  for b, n in ipairs(counts) do
    local r = {}
    for i = 0, Tq - 1 do
      local lim, row = n - Tq + 1 + i, {}
      for j = 0, max_len - 1 do row[j + 1] = j >= lim end
      r[i + 1] = row
    end
    rows[b] = {r}
  end
  return ember.tensor(rows, {dtype = "bool", device = device})
end

-- The masked composition on q's device and dtype (f64 when `f64`, on the CPU).
function M.masked(q, k, v, counts, scale, f64)
  if f64 then q, k, v = q:cpu():to("f64"), k:cpu():to("f64"), v:cpu():to("f64") end
  local H, Tq, d = q.shape[2], q.shape[3], q.shape[4]
  local kr, vr = M.repeat_kv(k, H), M.repeat_kv(v, H)
  local s = q:matmul(kr:transpose(-2, -1)) * (scale or 1 / math.sqrt(d))
  local mask = M.hidden(counts, Tq, k.shape[3], q.device)
  return F.softmax(s:masked_fill(mask, -math.huge), -1):matmul(vr)
end

return M
