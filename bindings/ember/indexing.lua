--- ember.indexing: tensor indexing from Lua, composed from the C ops.
--
-- t:index({i0, i1, ...}) is PyTorch's t[i0, i1, ...]: one entry per leading
-- dim, each nil (the whole dim, `:`), an integer (0-based, negative from the
-- end), an integer tensor (i64/i32, any shape) or a bool mask (covering as
-- many dims as it has). Integers alone give a view (select); with a tensor
-- entry it is advanced indexing: the index tensors (integers count as 0-d
-- ones) broadcast together, the indexed dims are flattened into one and read
-- with a single index_select, so the result is differentiable w.r.t. t and
-- its dims follow NumPy's rule (the index dims replace the indexed dims when
-- these are adjacent, else they come first). `t[idx]` with a tensor key is
-- t:index({idx}) (the __index in bindings/lua/lua_indexing.c sends it here).
--
-- F.embedding_bag(ids, weight, offsets, mode) is embedding + a per-bag sum
-- (index_add) or mean; 1-D ids with offsets read the offsets on the host.
local core = require "ember.core"
local methods = core.methods

local M = {}

local is_tensor = core.is_tensor
local FLOAT = {f32 = true, bf16 = true, f16 = true, f64 = true}
-- The one-kernel CUDA paths below; "0" selects the composed ones they replaced.
local INDEX_ONE_KERNEL = os.getenv("EMBER_INDEX_ONE_KERNEL") ~= "0"
local BAG_FUSED = os.getenv("EMBER_EMBEDDING_BAG_FUSED") ~= "0"

-- An error pointing at the caller's line: the first frame outside this file (and C).
local function fail(fn, fmt, ...)
  local lvl = 3
  while true do
    local info = debug.getinfo(lvl, "S")
    if not info then lvl = 2 break end
    if info.what ~= "C" and not info.source:find("ember/indexing.lua", 1, true) then break end
    lvl = lvl + 1
  end
  error(("ember.%s: " .. fmt):format(fn, ...), lvl - 1)
end

local function shape_str(s)
  local p = {}
  for i, v in ipairs(s) do p[i] = tostring(v) end
  return "[" .. table.concat(p, ", ") .. "]"
end

-- Entries of the index list as {int = i} / {t = long tensor} / false per dim
-- of t (bool masks expanded into one long index per dim they cover).
local function read_entries(t, idx)
  local n = 0
  for k in pairs(idx) do
    if math.type(k) ~= "integer" or k < 1 then
      fail("index", "expected a list of per-dim indices (nil, integers or tensors), got key %s", tostring(k))
    end
    if k > n then n = k end
  end
  local entries, d, any_tensor = {}, 0, false
  for k = 1, n do
    local v = idx[k]
    if v == nil then
      d = d + 1; entries[d] = false
    elseif math.type(v) == "integer" then
      d = d + 1; entries[d] = {int = v}
    elseif is_tensor(v) and v.dtype == "bool" then
      if v:dim() == 0 then fail("index", "a 0-dim bool mask is not supported; use a mask with the indexed dims' shape") end
      local want = {}
      for j = 1, v:dim() do want[j] = t.shape[d + j] end
      for j = 1, v:dim() do
        if want[j] ~= v.shape[j] then
          fail("index", "mask of shape %s does not match the indexed dims %s of a tensor of shape %s (entry %d)",
               shape_str(v.shape), shape_str(want), shape_str(t.shape), k)
        end
      end
      local nz = v:nonzero()                   -- (N, v:dim()); synchronises on CUDA
      for j = 0, v:dim() - 1 do d = d + 1; entries[d] = {t = nz:select(1, j)} end
      any_tensor = true
    elseif is_tensor(v) and (v.dtype == "i64" or v.dtype == "i32") then
      d = d + 1; entries[d] = {t = v}
      any_tensor = true
    elseif is_tensor(v) then
      fail("index", "expected index tensors of dtype i64, i32 or bool, got %s (entry %d)", v.dtype, k)
    else
      fail("index", "expected nil, an integer or a tensor as entry %d, got %s", k, type(v) == "number" and "a float" or type(v))
    end
  end
  if d > t:dim() then fail("index", "too many indices for a tensor of %d dims: got %d", t:dim(), d) end
  return entries, d, any_tensor
end

-- i with negatives wrapped; on the CPU an out-of-range value is an error
-- naming it; on CUDA it is mapped to -1 (the final index_select then never
-- reads it: its row is NaN), so nothing is read on the host.
local function checked(i, size, dim)
  i = i.dtype == "i64" and i or i:long()
  i = core.where(i:lt(0), i + size, i)
  if i.device == "cpu" and i:numel() > 0 then
    local lo, hi = i:min():item(), i:max():item()
    local bad = lo < 0 and lo or (hi >= size and hi or nil)
    if bad then
      fail("index", "index %d is out of range for dim %d of size %d (expected %d..%d)", bad < 0 and bad - size or bad,
           dim, size, -size, size - 1)
    end
    return i, nil
  end
  return i, i:lt(0):logical_or(i:ge(size))
end

--- t:index(list) -> tensor: PyTorch's t[list...] (see the module comment).
function methods.index(t, idx)
  if is_tensor(idx) or math.type(idx) == "integer" then idx = {idx} end
  if type(idx) ~= "table" then fail("index", "expected a list of per-dim indices, got %s", type(idx)) end
  local entries, m, any_tensor = read_entries(t, idx)
  if not any_tensor then                       -- integers and nils only: a view
    local r, removed = t, 0
    for k = 1, m do
      if entries[k] then r = r:select(k - 1 - removed, entries[k].int); removed = removed + 1 end
    end
    return r
  end
  -- one index tensor and no integers on CUDA: one kernel (ember._index_wrap
  -- wraps negatives and writes NaN for an out-of-range index in the gather
  -- itself) instead of ~8 launches normalising the index first. The CPU keeps
  -- the path below (its out-of-range error names the caller's index), as does
  -- EMBER_INDEX_ONE_KERNEL=0.
  if t.device ~= "cpu" and INDEX_ONE_KERNEL then
    local only
    for k = 1, t:dim() do
      local e = entries[k]
      if e and (only or not e.t) then only = false break end
      if e then only = k end
    end
    if only then
      local i = entries[only].t
      local shape = {}
      for j = 1, only - 1 do shape[#shape + 1] = t.shape[j] end
      for j = 1, i:dim() do shape[#shape + 1] = i.shape[j] end
      for j = only + 1, t:dim() do shape[#shape + 1] = t.shape[j] end
      -- flattened and reshaped in C: no intermediate handle keeps the result's storage from <close>
      return core._index_wrap(t, only - 1, i, shape)
    end
  end
  local adv, rest, lin, bad = {}, {}, nil, nil
  for k = 1, t:dim() do
    local e = entries[k]
    if e then adv[#adv + 1] = k - 1 else rest[#rest + 1] = k - 1 end
  end
  local adv_numel = 1
  for _, dim in ipairs(adv) do
    local size, e = t.shape[dim + 1], entries[dim + 1]
    local it = e.t or core.full({}, e.int, {dtype = "i64", device = t.device})
    local i, b = checked(it, size, dim)
    lin = lin and lin * size + i or i
    if b then bad = bad and bad:logical_or(b) or b end
    adv_numel = adv_numel * size
  end
  if bad then lin = core.where(bad, -1, lin) end
  -- advanced dims first, flattened into one; one index_select reads them
  local perm, flat_shape = {}, {adv_numel}
  for _, dim in ipairs(adv) do perm[#perm + 1] = dim end
  for _, dim in ipairs(rest) do perm[#perm + 1] = dim; flat_shape[#flat_shape + 1] = t.shape[dim + 1] end
  local identity = true
  for j, dim in ipairs(perm) do identity = identity and dim == j - 1 end
  local src = identity and t or t:permute(perm)
  local out = src:reshape(flat_shape):index_select(0, lin:reshape({-1}))
  local out_shape, nb = {}, lin:dim()
  for j = 1, nb do out_shape[j] = lin.shape[j] end
  for j = 2, #flat_shape do out_shape[#out_shape + 1] = flat_shape[j] end
  out = out:reshape(out_shape)
  -- adjacent advanced dims: the index dims go where the indexed dims were
  local adjacent = adv[#adv] - adv[1] == #adv - 1
  if adjacent and adv[1] > 0 and nb > 0 then
    local before, p = adv[1], {}
    for j = 0, before - 1 do p[#p + 1] = nb + j end
    for j = 0, nb - 1 do p[#p + 1] = j end
    for j = nb + before, out:dim() - 1 do p[#p + 1] = j end
    out = out:permute(p)
  end
  return out
end

--- F.embedding_bag(ids, weight, offsets, mode): per-bag sums or means of
-- embedding rows. ids (B, L) with offsets nil (each row a bag), or 1-D ids
-- with 1-D offsets (bag b is ids[offsets[b] .. offsets[b+1]-1], the last to
-- the end; read on the host). mode "mean" (PyTorch's default) or "sum", or an
-- options table {mode = ...}. An empty bag gives zeros. -> (B, d)
function M.embedding_bag(ids, weight, offsets, mode)
  if not is_tensor(ids) then fail("embedding_bag", "expected a tensor for 'ids', got %s", type(ids)) end
  if not is_tensor(weight) then fail("embedding_bag", "expected a tensor for 'weight', got %s", type(weight)) end
  if type(mode) == "table" then mode = mode.mode end
  mode = mode or "mean"
  if mode ~= "sum" and mode ~= "mean" then
    fail("embedding_bag", "expected mode 'sum' or 'mean', got %s ('max' is not implemented)", tostring(mode))
  end
  -- CUDA, float weight: one fused kernel (a block per bag, rows summed in id
  -- order: deterministic); the CPU (and EMBER_EMBEDDING_BAG_FUSED=0) composes
  -- embedding + sum / index_add.
  local fused = BAG_FUSED and weight.device ~= "cpu" and FLOAT[weight.dtype]
  if ids:dim() == 2 then
    if offsets ~= nil then fail("embedding_bag", "expected offsets nil for 2-D ids (each row is a bag)") end
    if fused then return core._embedding_bag(ids, weight, nil, mode == "mean") end
    local e = core.embedding(ids, weight)
    return mode == "sum" and e:sum(1) or e:mean(1)
  end
  if ids:dim() ~= 1 then fail("embedding_bag", "expected ids of 1 or 2 dims, got %d", ids:dim()) end
  if not is_tensor(offsets) or offsets:dim() ~= 1 then
    fail("embedding_bag", "expected 1-D offsets with 1-D ids, got %s", is_tensor(offsets) and shape_str(offsets.shape) or type(offsets))
  end
  local offs, n, d = offsets:tolist(), ids:numel(), weight.shape[2]
  local B = #offs
  for b = 1, B do
    local lo, hi = offs[b], b < B and offs[b + 1] or n
    if lo < 0 or lo > hi or hi > n or (b == 1 and lo ~= 0) then
      fail("embedding_bag", "expected offsets to start at 0 and increase up to %d (the number of ids), got %s",
           n, shape_str(offs))
    end
  end
  if fused then
    local offt = core.tensor(offs, {dtype = "i64", device = weight.device})
    return core._embedding_bag(ids, weight, offt, mode == "mean")
  end
  local seg, counts = {}, {}
  for b = 1, B do
    local lo, hi = offs[b], b < B and offs[b + 1] or n
    for _ = lo, hi - 1 do seg[#seg + 1] = b - 1 end
    counts[b] = math.max(hi - lo, 1)
  end
  local out = core.zeros({B, d}, {dtype = weight.dtype, device = weight.device})
  if n > 0 then
    local segt = core.tensor(seg, {dtype = "i64", device = ids.device})
    out = out:index_add(0, segt, core.embedding(ids, weight))
  end
  if mode == "mean" then
    out = out / core.tensor(counts, {dtype = weight.dtype, device = weight.device}):view(B, 1)
  end
  return out
end

return M
