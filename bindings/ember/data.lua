--- ember.data: batches of token ids for language-model training, as the
-- course's get_batch: random windows of a 1-D token array (seeded by
-- ember.manual_seed, so a run is reproducible), and sequential windows for
-- evaluation; and a Loader for training loops, whose position can be saved
-- in a checkpoint and which feeds a GPU without a host sync per step.
--
--   local tokens = ember.data.open("train.npy")         -- memory-mapped 1-D ids (uint16 or int32/int64)
--   local x, y = ember.data.get_batch(tokens, 8, 256, {device = "cuda"})   -- (8, 256) i64 each
--   for x, y in ember.data.batches(tokens, 8, 256) do ... end              -- every window once
--   local loader = ember.data.Loader(tokens, {batch = 8, context = 256, device = "cuda", seed = 1})
--   local x, y = loader:next()          -- views of the loader's device buffer, refilled by the next call
--   local s = loader:state_dict()       -- {order=, seed=, offset=, position=, epoch=}: resumes exactly
--
-- y is x shifted by one token (the next-token targets). The windows are
-- gathered where the tokens live (one index_select of B·(T+1) ids) and the
-- (B, T+1) block alone is copied to the device.
--
-- Why the Loader has its own generator ({seed, offset}, swapped in around
-- each draw): its position is then two integers, independent of whatever
-- else draws random numbers, and a checkpoint restores it exactly. Why its
-- batches land in fixed device buffers: a captured CUDA graph reads them
-- (static inputs), and with the (B, T+1) ids staged in pinned host memory
-- the copy is queued on the stream without waiting (non_blocking), so the
-- host prepares the next batch while the device still runs the last step.
-- @module ember.data
local ember = require "ember"
local util = require "ember.util"

local fmt = string.format
local M = {}

local INT = {i64 = true, i32 = true, u16 = true, u8 = true}

local function check_args(fname, tokens, batch, context, opts)
  if not ember.is_tensor(tokens) then
    error(fmt("%s: expected tokens to be a tensor, got %s", fname, type(tokens)), 3)
  end
  if tokens.ndim ~= 1 or not INT[tokens.dtype] then
    error(fmt("%s: expected 1-D integer tokens (i64, i32, u16 or u8), got %s %s", fname, tokens.dtype,
              util.shape_str(tokens.shape)), 3)
  end
  util.check_positive_int(fname, "batch", batch, 4)       -- counted from the helper: the user's line
  util.check_positive_int(fname, "context", context, 4)
  if tokens:numel() < context + 1 then
    error(fmt("%s: expected at least context + 1 = %d tokens, got %d", fname, context + 1, tokens:numel()), 3)
  end
  opts = util.check_opts(fname, opts, 4)
  for k in pairs(opts) do
    if k ~= "device" then error(fmt("%s: unknown option '%s' (expected: device)", fname, tostring(k)), 3) end
  end
  return opts.device or tokens.device
end

-- (B, T+1) windows starting at `starts` (i64, (B)) -> x, y on `device`
local function windows(tokens, starts, context, device)
  local B = starts:numel()
  local offs = ember.arange(context + 1):to(starts.device)
  local idx = (starts:view(B, 1) + offs:view(1, context + 1)):view(-1)
  local rows = tokens:index_select(0, idx:to(tokens.device)):view(B, context + 1)
  rows = rows:to({dtype = "i64", device = device})
  return rows:narrow(1, 0, context), rows:narrow(1, 1, context)
end

--- Random windows: x (B, T) and y (B, T) i64, y[b][t] = tokens[s_b + t + 1],
-- s_b uniform in [0, N - T) drawn from Ember's generator.
-- @tparam ember.Tensor tokens 1-D integer ids
-- @tparam integer batch B
-- @tparam integer context T
-- @tparam[opt] table opts device (default: the tokens' device)
function M.get_batch(tokens, batch, context, opts)
  local device = check_args("ember.data.get_batch", tokens, batch, context, opts)
  local starts = ember.randint(0, tokens:numel() - context, {batch})
  return windows(tokens, starts, context, device)
end

--- Sequential windows for evaluation: an iterator over (x, y) pairs covering
-- tokens[0 .. N-1] in non-overlapping windows of T (+1 for the targets); the
-- last batch may hold fewer than B rows, a tail shorter than T+1 is dropped.
function M.batches(tokens, batch, context, opts)
  local device = check_args("ember.data.batches", tokens, batch, context, opts)
  local n_windows = (tokens:numel() - 1) // context
  local next_w = 0
  return function()
    if next_w >= n_windows then return nil end
    local b = math.min(batch, n_windows - next_w)
    local starts = ember.arange(b) * context + next_w * context
    next_w = next_w + b
    return windows(tokens, starts, context, device)
  end
end

--- open(path[, {mmap = true}]) -> the 1-D integer token array of a .npy
-- (scripts/tokenize.lua's output), memory-mapped by default: pages are read
-- as batches touch them, so a corpus larger than memory trains.
function M.open(path, opts)
  local fname = "ember.data.open"
  if type(path) ~= "string" then error(fmt("%s: expected a path (string), got %s", fname, type(path)), 2) end
  opts = util.check_opts(fname, opts, 3)
  for k in pairs(opts) do
    if k ~= "mmap" then error(fmt("%s: unknown option '%s' (expected: mmap)", fname, tostring(k)), 2) end
  end
  local ok, t = pcall(ember.load_npy, path, {mmap = opts.mmap ~= false})
  if not ok then error(fname .. ": " .. tostring(t):gsub("^ember%.load_npy: ", ""), 2) end
  if t.ndim ~= 1 or not INT[t.dtype] then
    error(fmt("%s: expected a 1-D array of integer token ids (i64, i32, u16 or u8) in '%s', got %s %s", fname,
              path, t.dtype, util.shape_str(t.shape)), 2)
  end
  return t
end

-- ---------------------------------------------------------------------------
-- Loader

--- @type Loader
local Loader = {}
Loader.__index = Loader
Loader.__name = "ember.data.Loader"
-- a tail call: errors raised for the caller (level 2 in Loader.new) name the user's line
M.Loader = setmetatable(Loader, {__call = function(cls, tokens, opts) return cls.new(tokens, opts) end})

local LOADER_KEYS = {batch = true, context = true, device = true, order = true, seed = true, rank = true,
                     world_size = true, slots = true, pin = true}

--- Loader(tokens, opts): batch, context (required); device (the tokens');
-- order "random" (windows drawn uniformly, the default) or "sequential"
-- (non-overlapping windows in order, wrapping around with epoch + 1);
-- seed (0) of the loader's own generator; rank and world_size (0, 1): each
-- call draws one global batch of batch·world_size windows and keeps rows
-- [rank·batch, (rank+1)·batch), so ranks see different data and together
-- the same as one process with the whole batch; slots (1): device buffers
-- used in turn (grad accumulation under a CUDA graph needs one per
-- micro-batch); pin (true when host tokens go to a GPU): stage in pinned
-- memory and copy with non_blocking.
function Loader.new(tokens, opts)
  local fname = "ember.data.Loader"
  opts = util.check_opts(fname, opts, 3)
  for k in pairs(opts) do
    if not LOADER_KEYS[k] then
      error(fmt("%s: unknown option '%s' (expected: batch, context, device, order, seed, rank, world_size, " ..
                "slots, pin)", fname, tostring(k)), 2)
    end
  end
  local device = check_args(fname, tokens, opts.batch, opts.context, {device = opts.device})
  local order = opts.order or "random"
  if order ~= "random" and order ~= "sequential" then
    error(fmt("%s: expected order 'random' or 'sequential', got %s", fname, tostring(order)), 2)
  end
  local rank, world, slots = opts.rank or 0, opts.world_size or 1, opts.slots or 1
  util.check_positive_int(fname, "world_size", world, 3)
  util.check_positive_int(fname, "slots", slots, 3)
  if math.type(rank) ~= "integer" or rank < 0 or rank >= world then
    error(fmt("%s: expected rank in [0, world_size = %d), got %s", fname, world, tostring(rank)), 2)
  end
  local seed = opts.seed or 0
  if math.type(seed) ~= "integer" then
    error(fmt("%s: expected seed to be an integer, got %s", fname, tostring(seed)), 2)
  end
  local B, T, N = opts.batch, opts.context, tokens:numel()
  local n_windows = (N - 1) // T
  if order == "sequential" and n_windows < B * world then
    error(fmt("%s: expected at least batch * world_size = %d windows of context + 1 tokens for order " ..
              "'sequential', got %d (%d tokens)", fname, B * world, n_windows, N), 2)
  end
  local self = setmetatable({tokens = tokens, batch = B, context = T, device = device, order = order,
    seed = seed, offset = 0, position = 0, epoch = 0, rank = rank, world_size = world, n_windows = n_windows,
    calls = 0, slots = {}, views = {}}, Loader)
  self.offs = ember.arange(T + 1):to(tokens.device):view(1, T + 1)
  for i = 1, slots do
    local buf = ember.empty({B, T + 1}, {dtype = "i64", device = device})
    self.slots[i] = buf
    self.views[i] = {buf:narrow(1, 0, T), buf:narrow(1, 1, T)}
  end
  local on_gpu, host_tokens = device ~= "cpu", tokens.device == "cpu"
  local pin = opts.pin
  if pin == nil then pin = on_gpu and host_tokens and ember.cuda.is_available() end
  if pin and on_gpu and host_tokens then
    -- a ring of pinned buffers: one is refilled only after the copy that read
    -- it has run (its event), which waits only when the host is 2 rounds ahead
    self.pinned, self.events = {}, {}
    for i = 1, 2 * slots do
      self.pinned[i] = ember.empty({B, T + 1}, {dtype = tokens.dtype}):pin_memory()
      self.events[i] = ember.cuda.Event()
    end
  end
  return self
end

-- This rank's window starts (i64, (B)) where the tokens live; advances the position.
function Loader:_starts()
  local B, T = self.batch, self.context
  local dev = self.tokens.device
  if self.order == "sequential" then
    local need = B * self.world_size
    if self.position + need > self.n_windows then self.position, self.epoch = 0, self.epoch + 1 end
    local first = self.position + self.rank * B
    self.position = self.position + need
    return (ember.arange(B) + first):mul(T):to(dev)
  end
  local saved = ember.get_rng_state()
  ember.set_rng_state({seed = self.seed, offset = self.offset})
  local ok, all = pcall(ember.randint, 0, self.tokens:numel() - T, {B * self.world_size}, {device = dev})
  self.offset = ember.get_rng_state().offset
  ember.set_rng_state(saved)
  if not ok then error(all, 0) end
  return self.world_size > 1 and all:narrow(0, self.rank * B, B) or all
end

--- x, y (B, T) i64 on the device: the next batch, written into the next
-- slot's buffer (the same tensors every `slots` calls: clone to keep one).
function Loader:next()
  local B, T = self.batch, self.context
  local idx = (self:_starts():view(B, 1) + self.offs):view(-1)
  local rows = self.tokens:index_select(0, idx):view(B, T + 1)
  local k = self.calls % #self.slots + 1
  local dst = self.slots[k]
  if self.pinned then
    local r = self.calls % #self.pinned + 1
    self.events[r]:synchronize()             -- the copy that last read this buffer has run
    self.pinned[r]:copy_(rows)
    dst:copy_(self.pinned[r], {non_blocking = true})
    self.events[r]:record()
  else
    dst:copy_(rows)
  end
  self.calls = self.calls + 1
  local v = self.views[k]
  return v[1], v[2]
end

--- The position, as plain values: {order, seed, offset, position, epoch}
-- (seed and offset of the loader's generator; position = the next window
-- of order "sequential"). load_state_dict(s) continues exactly there.
function Loader:state_dict()
  return {order = self.order, seed = self.seed, offset = self.offset, position = self.position, epoch = self.epoch}
end

function Loader:load_state_dict(s)
  local fname = "ember.data.Loader.load_state_dict"
  if type(s) ~= "table" then error(fmt("%s: expected a table from state_dict(), got %s", fname, type(s)), 2) end
  if s.order ~= self.order then
    error(fmt("%s: the state is of order '%s', this loader's is '%s'", fname, tostring(s.order), self.order), 2)
  end
  for _, k in ipairs({"seed", "offset", "position", "epoch"}) do
    local v = math.tointeger(s[k])
    if v == nil then error(fmt("%s: expected %s to be an integer, got %s", fname, k, tostring(s[k])), 2) end
    self[k] = v
  end
  if self.order == "sequential" and self.position > self.n_windows then
    error(fmt("%s: position %d is past the %d windows of these tokens", fname, self.position, self.n_windows), 2)
  end
end

function Loader:__tostring()
  return fmt("ember.data.Loader(%d tokens, batch=%d, context=%d, order=%s, device=%s, rank=%d/%d)",
    self.tokens:numel(), self.batch, self.context, self.order, self.device, self.rank, self.world_size)
end

return M
