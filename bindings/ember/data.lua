--- ember.data: batches of token ids for language-model training, as the
-- course's get_batch: random windows of a 1-D token array (seeded by
-- ember.manual_seed, so a run is reproducible), and sequential windows for
-- evaluation.
--
--   local tokens = ember.load("train.npy")              -- 1-D integer ids (uint16 or int32/int64)
--   local x, y = ember.data.get_batch(tokens, 8, 256, {device = "cuda"})   -- (8, 256) i64 each
--   for x, y in ember.data.batches(tokens, 8, 256) do ... end              -- every window once
--
-- y is x shifted by one token (the next-token targets). The windows are
-- gathered where the tokens live (one index_select of B·(T+1) ids) and the
-- (B, T+1) block alone is copied to the device.
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
  util.check_positive_int(fname, "batch", batch, 3)
  util.check_positive_int(fname, "context", context, 3)
  if tokens:numel() < context + 1 then
    error(fmt("%s: expected at least context + 1 = %d tokens, got %d", fname, context + 1, tokens:numel()), 3)
  end
  opts = util.check_opts(fname, opts, 3)
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

return M
