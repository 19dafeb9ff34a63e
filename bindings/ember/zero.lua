--- ember.optim.ShardedOptimizer: ZeRO stage 1 (optimizer state sharding).
--
-- Every parameter has one owner rank. Each rank builds the wrapped optimizer
-- (any ember.optim class) over the parameters it owns only, so the optimizer
-- state (AdamW's exp_avg and exp_avg_sq: 2x the parameters) is divided by the
-- world size. step() updates the owned shard, then every parameter is
-- broadcast from its owner, and all ranks hold the same weights again.
--
-- Gradients must already be averaged across ranks when step() runs (wrap the
-- model in ember.nn.parallel.DDP, or all-reduce them yourself): the sharded
-- optimizer changes where the state lives, not what a step computes.
--
-- Partition: per param group, parameters sorted by size (largest first, ties
-- by position) each go to the rank with the fewest bytes so far (greedy
-- largest-first, lowest rank on ties): deterministic, so every rank computes
-- the same owners without talking.
--
--     local opt = optim.ShardedOptimizer(model:parameters(), optim.AdamW, {lr = 1e-3})
--     ... loss:backward(); ddp:finish_gradient_synchronization(); opt:step()
--     local sd = opt:state_dict()   -- the full state (a collective: every rank calls)
--
-- `param_groups` lists every parameter and the hyper-parameters, as the
-- unsharded optimizer's would; set group.lr (or use set_lr, LRScheduler) and
-- the next step() passes it on to the wrapped optimizer.
-- @module ember.zero

local zero = {}
package.loaded["ember.zero"] = zero

local ember = require "ember"

local fmt = string.format
local FNAME = "ember.optim.ShardedOptimizer"

local function is_tensor(v) return type(v) == "userdata" and ember.is_tensor(v) end

local function copy_value(v)
  if type(v) ~= "table" then return v end
  local c = {}
  for k, x in pairs(v) do c[k] = x end
  return c
end

local function nbytes(t) return t:numel() * t:element_size() end

--- @type ShardedOptimizer
local ShardedOptimizer = {__name = "ShardedOptimizer"}
ShardedOptimizer.__index = ShardedOptimizer
zero.ShardedOptimizer = ShardedOptimizer

setmetatable(ShardedOptimizer, {__call = function(cls, params, optimizer_cls, opts)
  local self = setmetatable({}, cls)
  self:__init(params, optimizer_cls, opts)
  return self
end})

--- @param params an array of tensors, or of groups {params = {...}, lr = ...}
-- @param optimizer_cls an ember.optim class (optim.AdamW, optim.SGD, ...)
-- @tparam[opt] table opts the wrapped optimizer's options
function ShardedOptimizer:__init(params, optimizer_cls, opts)
  if type(params) ~= "table" or #params == 0 then
    error(fmt("%s: expected a non-empty array of parameters or of param groups, got %s",
      FNAME, type(params) == "table" and "an empty table" or type(params)), 3)
  end
  if type(optimizer_cls) ~= "table" or type(optimizer_cls.step) ~= "function" then
    error(fmt("%s: expected an optimizer class (e.g. ember.optim.AdamW) as argument 2, got %s",
      FNAME, type(optimizer_cls)), 3)
  end
  local dist = require "ember.dist"
  if not dist.is_initialized() then
    error(FNAME .. ": expected ember.dist to be initialised; call ember.dist.init() first", 3)
  end
  self.rank, self.world_size = dist.rank(), dist.world_size()
  self.optimizer_cls, self.opts = optimizer_cls, opts
  self.param_groups = {}
  self.owner = {}                     -- parameter -> rank
  self.load = {}                      -- bytes owned per rank (0-based)
  for r = 0, self.world_size - 1 do self.load[r] = 0 end
  local groups = is_tensor(params[1]) and {{params = params}} or params
  for _, g in ipairs(groups) do self:add_param_group(g) end
end

--- Add a group: its parameters are partitioned (greedy largest-first onto the
-- least-loaded rank), the owned ones join the wrapped optimizer.
function ShardedOptimizer:add_param_group(group)
  if type(group) ~= "table" or type(group.params) ~= "table" then
    error(FNAME .. ".add_param_group: expected a table {params = {tensors...}, ...}, got " ..
      type(group), 2)
  end
  local order = {}
  for i, p in ipairs(group.params) do
    if not is_tensor(p) then
      error(fmt("%s: expected params[%d] to be a tensor, got %s", FNAME, i, type(p)), 2)
    end
    if self.owner[p] ~= nil then
      error(fmt("%s: params[%d] appears in more than one place", FNAME, i), 2)
    end
    order[i] = i
  end
  local ps = group.params
  table.sort(order, function(a, b)
    local na, nb = nbytes(ps[a]), nbytes(ps[b])
    if na ~= nb then return na > nb end
    return a < b
  end)
  for _, i in ipairs(order) do
    local best = 0
    for r = 1, self.world_size - 1 do
      if self.load[r] < self.load[best] then best = r end
    end
    self.owner[ps[i]] = best
    self.load[best] = self.load[best] + nbytes(ps[i])
  end
  -- the wrapped optimizer sees this rank's shard of the group (maybe empty)
  local mine = {}
  for k, v in pairs(group) do if k ~= "params" then mine[k] = copy_value(v) end end
  mine.params = {}
  for _, p in ipairs(ps) do
    if self.owner[p] == self.rank then mine.params[#mine.params + 1] = p end
  end
  if self.optim == nil then
    self.optim = self.optimizer_cls({mine}, self.opts)
  else
    self.optim:add_param_group(mine)
  end
  -- the full group: every parameter, with the defaults the optimizer filled in
  local full = {}
  for k, v in pairs(self.optim.param_groups[#self.optim.param_groups]) do
    if k ~= "params" then full[k] = copy_value(v) end
  end
  full.params = {}
  for i, p in ipairs(ps) do full.params[i] = p end
  self.param_groups[#self.param_groups + 1] = full
  self.defaults = self.optim.defaults
end

-- Hyper-parameters of the full groups (lr schedules write there) -> the wrapped optimizer.
function ShardedOptimizer:_sync_groups()
  for gi, g in ipairs(self.param_groups) do
    local mine = self.optim.param_groups[gi]
    for k, v in pairs(g) do
      if k ~= "params" then mine[k] = copy_value(v) end
    end
  end
end

--- Update this rank's shard, then broadcast every parameter from its owner.
-- @tparam[opt] function closure re-evaluates the model and returns the loss
function ShardedOptimizer:step(closure)
  local loss
  if closure then loss = closure() end
  self:_sync_groups()        -- AdamW's CUDA lr copies follow group.lr at step()
  self.optim:step()
  local dist = require "ember.dist"
  local works = {}
  ember.no_grad(function()
    for _, g in ipairs(self.param_groups) do
      for _, p in ipairs(g.params) do
        works[#works + 1] = dist.broadcast(p, {src = self.owner[p], async = true})
      end
    end
  end)
  for _, w in ipairs(works) do w:wait() end
  return loss
end

--- Reset the gradients of every parameter (not only the owned ones: every
-- rank computes every gradient).
function ShardedOptimizer:zero_grad(set_to_none)
  for _, g in ipairs(self.param_groups) do
    ember.core.zero_grad_(g.params, set_to_none ~= false)
  end
end

--- Set the learning rate of every group.
function ShardedOptimizer:set_lr(lr)
  if type(lr) ~= "number" then
    error(FNAME .. ".set_lr: expected a number, got " .. type(lr), 2)
  end
  for _, g in ipairs(self.param_groups) do g.lr = lr end
  self:_sync_groups()
  self.optim:set_lr(lr)
end

--- Learning rate of the first group.
function ShardedOptimizer:get_lr() return self.param_groups[1].lr end

--- The rank that owns parameter p (0-based).
function ShardedOptimizer:owner_of(p) return self.owner[p] end

-- ---------------------------------------------------------------------------
-- full state: gather on state_dict, scatter (locally) on load_state_dict

-- A state entry's shape as text: numbers travel in it, tensors as a description.
local function describe(st)
  local keys = {}
  for k in pairs(st) do keys[#keys + 1] = k end
  table.sort(keys)
  local parts = {}
  for _, k in ipairs(keys) do
    local v = st[k]
    if is_tensor(v) then
      parts[#parts + 1] = fmt("%s=T/%s/%s/%s", k, v.dtype, v.device, table.concat(v.shape, "x"))
    elseif math.type(v) == "integer" then
      parts[#parts + 1] = fmt("%s=I/%d", k, v)
    elseif type(v) == "number" then
      parts[#parts + 1] = fmt("%s=F/%a", k, v)    -- hex float: exact round trip
    else
      error(fmt("%s.state_dict: state '%s' is a %s; only tensors and numbers can be gathered",
        FNAME, k, type(v)), 4)
    end
  end
  return table.concat(parts, ";")
end

local function parse(desc)
  local out = {}
  for item in desc:gmatch("[^;]+") do
    local k, kind, rest = item:match("^(.-)=(%a)/(.*)$")
    if kind == "I" then out[k] = math.tointeger(tonumber(rest))
    elseif kind == "F" then out[k] = tonumber(rest)
    else
      local dtype, device, shape = rest:match("^(.-)/(.-)/(.*)$")
      local dims = {}
      for n in shape:gmatch("%d+") do dims[#dims + 1] = math.tointeger(tonumber(n)) end
      out[k] = {dtype = dtype, device = device, shape = dims}
    end
  end
  return out
end

-- Broadcast a string from rank src (length, then bytes, as tensors on
-- `device`: the parameters' device, so a backend="nccl" job works too).
local function broadcast_string(s, src, rank, device)
  local dist = require "ember.dist"
  local n = ember.tensor({rank == src and #s or 0}, {dtype = "i64", device = device})
  dist.broadcast(n, {src = src})
  local len = math.tointeger(n:item())
  if len == 0 then return "" end
  local codes = {}
  if rank == src then
    for i = 1, len do codes[i] = s:byte(i) end
  else
    for i = 1, len do codes[i] = 0 end
  end
  local bytes = ember.tensor(codes, {dtype = "u8", device = device})
  dist.broadcast(bytes, {src = src})
  if rank == src then return s end
  local chars = {}
  for i, c in ipairs(bytes:tolist()) do chars[i] = string.char(math.tointeger(c)) end
  return table.concat(chars)
end

--- The FULL state, in the unsharded optimizer's layout (parameters numbered
-- 1.. across groups): every rank gets the same table. A collective: every
-- rank must call it.
function ShardedOptimizer:state_dict()
  local dist = require "ember.dist"
  -- this rank's state, by global index
  local local_sd = self.optim:state_dict()
  local by_local, li = {}, 0
  for _, g in ipairs(self.optim.param_groups) do
    for _, p in ipairs(g.params) do li = li + 1; by_local[p] = local_sd.state[li] end
  end
  local params, index = {}, {}
  for _, g in ipairs(self.param_groups) do
    for _, p in ipairs(g.params) do params[#params + 1] = p; index[p] = #params end
  end
  -- 1. every rank announces what it holds: "index|description" lines
  local lines = {}
  for i, p in ipairs(params) do
    if self.owner[p] == self.rank and by_local[p] ~= nil then
      lines[#lines + 1] = i .. "|" .. describe(by_local[p])
    end
  end
  local mine = table.concat(lines, "\n")
  local meta = {}
  for r = 0, self.world_size - 1 do
    local s = broadcast_string(mine, r, self.rank, params[1].device)
    for line in s:gmatch("[^\n]+") do
      local i, desc = line:match("^(%d+)|(.*)$")
      meta[math.tointeger(tonumber(i))] = parse(desc)
    end
  end
  -- 2. state tensors travel from their owners, in index and key order
  local state, works = {}, {}
  for i = 1, #params do
    local m = meta[i]
    if m ~= nil then
      local p, st, keys = params[i], {}, {}
      for k in pairs(m) do keys[#keys + 1] = k end
      table.sort(keys)
      for _, k in ipairs(keys) do
        local v = m[k]
        if type(v) == "table" then
          local t
          if self.owner[p] == self.rank then
            t = by_local[p][k]             -- the optimizer's own tensor, as unsharded
            if not t:is_contiguous() then t = t:contiguous() end
          else
            -- on this rank's device for the parameter (the owner's "cuda:N" is its own GPU)
            t = ember.empty(v.shape, {dtype = v.dtype, device = v.device == "cpu" and "cpu" or p.device})
          end
          works[#works + 1] = dist.broadcast(t, {src = self.owner[p], async = true})
          st[k] = t
        else
          st[k] = v
        end
      end
      state[i] = st
    end
  end
  for _, w in ipairs(works) do w:wait() end
  -- 3. groups: hyper-parameters and global indices
  local groups, i = {}, 0
  for gi, g in ipairs(self.param_groups) do
    local packed = {}
    for k, v in pairs(g) do if k ~= "params" then packed[k] = copy_value(v) end end
    packed.params = {}
    for _ = 1, #g.params do i = i + 1; packed.params[#packed.params + 1] = i end
    groups[gi] = packed
  end
  return {state = state, param_groups = groups}
end

--- Load a FULL state (from state_dict() here, or from the unsharded
-- optimizer): each rank keeps the entries of the parameters it owns. Needs no
-- communication; every rank must pass the same table.
function ShardedOptimizer:load_state_dict(sd)
  local fname = FNAME .. ".load_state_dict"
  ember.optim.check_state_dict(sd, fname, #self.param_groups, 3)
  -- global index -> parameter, and parameter -> local index
  local by_index = ember.optim.params_by_id(sd, self.param_groups, fname, 3)
  local local_index, li = {}, 0
  local local_groups = {}
  for gi, g in ipairs(self.optim.param_groups) do
    local packed = {}
    for k, v in pairs(sd.param_groups[gi]) do if k ~= "params" then packed[k] = copy_value(v) end end
    packed.params = {}
    for _, p in ipairs(g.params) do
      li = li + 1
      local_index[p] = li
      packed.params[#packed.params + 1] = li
    end
    local_groups[gi] = packed
  end
  local local_state = {}
  for id, st in pairs(sd.state) do
    local p = by_index[id]
    if local_index[p] then local_state[local_index[p]] = st end
  end
  self.optim:load_state_dict({state = local_state, param_groups = local_groups})
  for gi, g in ipairs(self.param_groups) do
    for k, v in pairs(sd.param_groups[gi]) do
      if k ~= "params" then g[k] = copy_value(v) end
    end
  end
end

--- Bytes of optimizer state: on this rank, and what the unsharded optimizer
-- would hold (the sum over ranks). A collective: every rank must call it.
-- @treturn table {rank = bytes here, unsharded = bytes in all, params_owned = n}
function ShardedOptimizer:memory_stats()
  local dist = require "ember.dist"
  local here, owned = 0, 0
  for _, g in ipairs(self.optim.param_groups) do
    for _, p in ipairs(g.params) do
      owned = owned + 1
      for _, v in pairs(self.optim.state[p] or {}) do
        if is_tensor(v) then here = here + nbytes(v) end
      end
    end
  end
  local total = ember.tensor({here}, {dtype = "f64", device = self.param_groups[1].params[1].device})
  dist.all_reduce(total, {op = "sum"})
  return {rank = here, unsharded = math.tointeger(total:item()) or total:item(),
    params_owned = owned}
end
ShardedOptimizer.memory = ShardedOptimizer.memory_stats

return zero
