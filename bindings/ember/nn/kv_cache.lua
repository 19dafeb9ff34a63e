--- ember.nn.KVCache: the keys and values of every attention layer of a
-- TransformerLM, preallocated for `max_len` positions, so generation runs
-- the prompt once (prefill) and then one token per step (decode) instead of
-- the whole sequence again for every new token.
--
--     local kv = nn.KVCache(model, {batch = 1, max_len = 256})
--     local logits = model:forward(prompt_ids, {cache = kv})   -- (1, T, V); kv.len = T
--     logits = model:forward(next_id, {cache = kv})            -- (1, 1, V); kv.len = T + 1
--
-- A forward with a cache appends its T tokens at positions kv.len ..
-- kv.len + T - 1 (RoPE at those absolute positions) and attends to every
-- cached key before them. Three cases, one rule ("query i of the chunk sees
-- the keys up to its own position": causal masking aligned to the *end* of
-- the keys, not PyTorch's top-left alignment, which is the same only when
-- Tq = Tk):
--   * prefill (kv.len = 0): exactly the model's uncached attention on the
--     chunk's own q, k, v (causal, Tq = Tk; the flash kernels where they
--     apply); k and v are copied into the cache on the side;
--   * decode (T = 1): the position is read from the device tensor kv.pos
--     (i64, shape (1)), the new k and v are scattered into the cache there,
--     the query attends to all max_len cached keys with the keys after it
--     masked (-inf), and kv.pos is incremented in place. Nothing in this step
--     depends on a host value, so one captured CUDA graph serves every step
--     (ember.generate does this). With EMBER_KV_DECODE=flash (CUDA; bf16,
--     f16 or f32 caches of a head dim the kernels take) the attention is
--     F.flash_decode with n_keys = kv.pos + 1, a device tensor too: the
--     split-key decode kernels read only the filled keys instead of q kᵀ,
--     masked_fill, softmax and · v over all max_len of them. "masked" (the
--     default) keeps the composition; read once, at the first KVCache made;
--   * a chunk after a prefix (T > 1, kv.len > 0): the keys 0 .. len+T-1 with
--     an explicit bottom-right causal mask (query i sees keys <= len + i).
-- The cached forward runs without autograd (it writes the cache in place).
-- @module ember.nn.kv_cache

local ember = require "ember"
local F = require "ember.functional"
local util = require "ember.util"

local fmt = string.format
local NEG_INF = -math.huge

-- EMBER_KV_DECODE: the decode step's attention, "masked" (the composition
-- over all max_len keys) or "flash" (F.flash_decode over the filled ones,
-- where it applies: decode_impl below). Read once, at the first KVCache made.
local DECODE_MODES = {masked = true, flash = true}
local decode_mode
local function kv_decode_mode()
  if decode_mode == nil then
    local v = os.getenv("EMBER_KV_DECODE") or "masked"
    if not DECODE_MODES[v] then
      error(fmt("ember.nn.KVCache: EMBER_KV_DECODE must be 'masked' or 'flash', got '%s'", v), 0)
    end
    decode_mode = v
  end
  return decode_mode
end

-- The dtypes and head dims F.flash_decode's CUDA kernels take.
local FLASH_DTYPES = {bf16 = true, f16 = true, f32 = true}
local FLASH_DIMS = {[16] = true, [32] = true, [64] = true, [80] = true, [96] = true, [128] = true, [256] = true}

--- The decode step's attention for a cache on `device` of `dtype` and head
-- dim `dh`: "flash" where EMBER_KV_DECODE asks for it and the kernels apply,
-- else "masked".
local function decode_impl(device, dtype, dh)
  local mode = kv_decode_mode()
  if mode == "flash" and tostring(device):find("^cuda") and FLASH_DTYPES[dtype] and FLASH_DIMS[dh] then
    return "flash"
  end
  return "masked"
end

--- One layer's view of the cache: its k and v (B, H, max_len, d_head).
-- @type LayerKV
local LayerKV = {}
LayerKV.__index = LayerKV

--- softmax(q kᵀ · scale, masked) v on tensors in the cache's dtype.
local function masked_attention(q, keys, values, mask, scale)
  local s = q:matmul(keys:transpose(-2, -1)) * scale
  return F.softmax(s:masked_fill(mask, NEG_INF), -1):matmul(values)
end

--- The attention output for q, k, v (B, H, T, d_head) of the current chunk
-- (RoPE already applied); stores k and v. `attn_fn` is the layer's own
-- attention, used as it is for the prefill.
function LayerKV:attend(q, k, v, attn_fn)
  local kv = self.owner
  local dt = kv.dtype
  local qdt = q.dtype
  local k_c, v_c = k:to(dt), v:to(dt)
  local step = kv._step
  if step.decode then
    self.k:scatter_(2, kv._write_index, k_c)
    self.v:scatter_(2, kv._write_index, v_c)
    if step.n_keys then return F.flash_decode(q:to(dt), self.k, self.v, step.n_keys, kv.scale):to(qdt) end
    return masked_attention(q:to(dt), self.k, self.v, step.future, kv.scale):to(qdt)
  end
  local start, T = step.start, step.T
  self.k:narrow(2, start, T):copy_(k_c)
  self.v:narrow(2, start, T):copy_(v_c)
  if start == 0 then return attn_fn(q, k, v) end   -- Tq = Tk: the model's own causal attention
  local keys, values = self.k:narrow(2, 0, start + T), self.v:narrow(2, 0, start + T)
  return masked_attention(q:to(dt), keys, values, step.future, kv.scale):to(qdt)
end

--- Preallocated keys and values for every attention layer of `model`.
-- @type KVCache
-- @tparam TransformerLM model
-- @tparam[opt] table opts `batch` (1), `max_len` (model.context_length; at
--   most that), `dtype` (the autocast dtype when created inside
--   ember.autocast, else the model's parameter dtype), `device` (the
--   parameters')
local KVCache = {}
KVCache.__index = KVCache
KVCache.__name = "KVCache"

local OPTS = {batch = true, max_len = true, dtype = true, device = true}

local function new(model, opts)
  local fname = "ember.nn.KVCache"
  if type(model) ~= "table" or type(model.layers) ~= "table" or type(model.config) ~= "table" then
    error(fname .. ": expected a TransformerLM, got " .. (type(model) == "table" and
      tostring(model.__name or "a table") or type(model)), 3)
  end
  opts = util.check_opts(fname, opts, 4)
  for k in pairs(opts) do
    if not OPTS[k] then
      error(fmt("%s: unknown option '%s' (expected batch, max_len, dtype, device)", fname, tostring(k)), 3)
    end
  end
  local cfg = model.config
  local batch, max_len = opts.batch or 1, opts.max_len or cfg.context_length
  util.check_positive_int(fname, "batch", batch, 4)
  if not util.is_positive_int(max_len) or max_len > cfg.context_length then
    error(fmt("%s: expected max_len to be an integer in [1, %d] (the model's context_length), got %s",
      fname, cfg.context_length, tostring(max_len)), 3)
  end
  local w = model.lm_head.weight
  local amp = require "ember.amp"
  local dtype = opts.dtype or (amp.is_autocast_enabled() and amp.get_autocast_dtype()) or w.dtype
  dtype = util.DTYPES[dtype] or dtype
  if not util.FLOAT_DTYPES[dtype] then
    error(fmt("%s: expected a floating-point dtype (f32, f64, bf16, f16), got %s", fname, tostring(dtype)), 3)
  end
  local device = opts.device or w.device
  local H = cfg.num_heads
  local dh = cfg.d_model // H
  local self = setmetatable({batch = batch, max_len = max_len, dtype = dtype, device = device,
    num_heads = H, d_head = dh, scale = 1 / math.sqrt(dh), len = 0, layers = {},
    decode_impl = decode_impl(device, dtype, dh)}, KVCache)
  local topts = {dtype = dtype, device = device}
  for i = 1, #model.layers do
    self.layers[i] = setmetatable({owner = self, k = ember.zeros({batch, H, max_len, dh}, topts),
      v = ember.zeros({batch, H, max_len, dh}, topts)}, LayerKV)
  end
  -- the device copy of len: decode steps read their position from it (and
  -- move it on), so a captured step needs no host value
  self.pos = ember.zeros({1}, {dtype = "i64", device = device})
  self.key_index = F.positions(max_len, device)                       -- 0 .. max_len-1
  self._write_index = self.pos:view(1, 1, 1, 1):expand(batch, H, 1, dh)   -- a view of pos
  return self
end

--- Bytes the cache holds (keys and values of every layer).
function KVCache:nbytes()
  local sizes = {f64 = 8, f32 = 4, bf16 = 2, f16 = 2}
  return 2 * #self.layers * self.batch * self.num_heads * self.max_len * self.d_head * sizes[self.dtype]
end

--- Forget every position (the memory stays allocated).
function KVCache:reset() return self:seek(0) end

--- Keep the first n positions and continue from there (n <= len).
function KVCache:seek(n)
  if math.type(n) ~= "integer" or n < 0 or n > self.len then
    error(fmt("ember.nn.KVCache.seek: expected an integer in [0, %d] (the positions filled), got %s",
      self.len, tostring(n)), 2)
  end
  self.len = n
  self.pos:fill_(n)
  return self
end

--- Check a chunk of T new tokens for batch B fits; `fname` names the caller,
-- `level` is error()'s level as seen by the caller.
function KVCache:check_append(fname, B, T, level)
  level = level + 1
  if B ~= self.batch then
    error(fmt("%s: expected ids of batch %d (the KV cache's), got batch %d", fname, self.batch, B), level)
  end
  if self.len + T > self.max_len then
    error(fmt("%s: KV cache overflow: it holds %d of max_len %d positions, cannot append %d more",
      fname, self.len, self.max_len, T), level)
  end
end

--- Set up the step that appends T tokens; returns the RoPE positions (T).
-- Called by TransformerLM:forward once per forward, before the layers.
function KVCache:begin_step(T)
  local start = self.len
  if T == 1 then
    if self.decode_impl == "flash" then   -- the keys written so far and this step's (scattered at pos)
      self._step = {decode = true, T = 1, n_keys = self.pos + 1}
    else
      self._step = {decode = true, T = 1, future = self.key_index:gt(self.pos)}   -- keys after pos
    end
    return self.pos
  end
  local step = {decode = false, start = start, T = T}
  if start > 0 then   -- query i sees keys <= start + i: true above diagonal start
    step.future = ember.ones({T, start + T}, {dtype = "bool", device = self.device}):triu(start + 1)
  end
  self._step = step
  return ember.arange(start, start + T, 1, {dtype = "i64", device = self.device})
end

--- Finish the step begun by begin_step: len (host) and pos (device) move on.
function KVCache:end_step()
  local step = self._step
  self._step = nil
  self.len = self.len + step.T
  if step.decode then self.pos:add_(1) else self.pos:fill_(self.len) end
end

function KVCache:__tostring()
  return fmt("ember.nn.KVCache(batch=%d, max_len=%d, len=%d, layers=%d, heads=%d, d_head=%d, dtype=%s, device=%s)",
    self.batch, self.max_len, self.len, #self.layers, self.num_heads, self.d_head, self.dtype,
    tostring(self.device))
end

return setmetatable({KVCache = KVCache, LayerKV = LayerKV}, {
  __call = function(_, model, opts)
    local kv = new(model, opts)   -- not a tail call: error levels count this frame
    return kv
  end})
