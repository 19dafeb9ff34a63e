--- ember.optim: optimizers and learning-rate schedules, PyTorch style.
--
-- An optimizer holds `param_groups` (arrays of {params = {...}, lr = ...,
-- hyper-parameters}) and per-parameter `state` keyed by the parameter tensor
-- itself (tensor identity is stable in Ember). `step()` batches every
-- parameter that has a gradient into one call of a fused C kernel per group
-- (core.adamw_ / core.sgd_); parameters whose grad is nil are skipped and
-- their state does not advance, as in PyTorch.
--
-- `state_dict()` is PyTorch's layout with Lua (1-based) parameter indices:
--     {state = {[i] = {step = n, exp_avg = t, exp_avg_sq = t}},
--      param_groups = {{lr = .., betas = {..}, .., params = {1, 2, ..}}}}
-- `optim.state_to_tensors` flattens it into name -> tensor for ember.save.
--
--     local opt = optim.AdamW(model:parameters(), {lr = 3e-4, weight_decay = 0.1})
--     local lr = optim.cosine_schedule{max_lr = 3e-4, min_lr = 3e-5, warmup = 100, total = 5000}
--     for it = 0, 4999 do
--       opt:set_lr(lr(it)); opt:zero_grad()
--       loss_fn():backward(); opt:step()
--     end
-- @module ember.optim

local optim = {}
-- Registered before requiring "ember" so init.lua gets this table, not a copy.
package.loaded["ember.optim"] = optim

local core = require "ember.core"
local ember = require "ember"
local util = require "ember.util"

local fmt = string.format
local is_tensor, no_grad, copy_value = util.is_tensor, util.no_grad, util.copy_value
local same_shape, shape_str, sorted_keys = util.same_shape, util.shape_str, util.sorted_keys
local check_opts, FLOAT_DTYPES = util.check_opts, util.FLOAT_DTYPES
local context = require "ember.context"
-- An optimizer update: no autograd, and its kernels and allocations are
-- attributed to the "optimizer" phase by the profiler and memory history.
local function update(fn) return context.phase("optimizer", no_grad, fn) end
local has_grad = core.has_grad
local CPU_END = core.PLACEMENT_CPU_END   -- core.placements(ts)[i] below it: a CPU tensor

-- Minimal classes: calling the class makes an instance and runs __init.
local function class(name, parent)
  local cls = {}
  cls.__index = cls
  cls.__name = name
  cls.super = parent
  return setmetatable(cls, {
    __index = parent,
    __call = function(c, ...)
      local o = setmetatable({}, c)
      o:__init(...)
      return o
    end,
  })
end

-- ---------------------------------------------------------------------------
-- Optimizer

-- Every optimizer, weakly: memory history tags their state
-- "optimizer_state" when recording starts after it was made (ember.memory).
optim._live_optimizers = setmetatable({}, {__mode = "k"})

--- Base class: parameter groups, state, zero_grad and (de)serialisation.
-- Subclasses implement `__init` (validate, then call
-- `optim.Optimizer.__init(self, params, defaults)`) and `step`.
-- @type Optimizer
local Optimizer = class("Optimizer")
optim.Optimizer = Optimizer

--- Create a subclass (user optimizers).
function Optimizer:extend(name) return class(name, self) end

--- @param params an array of tensors, or an array of groups {params = {...}, lr = ...}
-- @tparam table defaults hyper-parameters a group does not set
function Optimizer:__init(params, defaults)
  local fname = "ember.optim." .. self.__name
  if type(params) ~= "table" then
    error(fmt("%s: expected an array of parameters or of param groups, got %s", fname,
      type(params)), 4)
  end
  if #params == 0 then error(fname .. ": got an empty parameter list", 4) end
  self.defaults = defaults
  self.param_groups = {}
  self.state = {}
  optim._live_optimizers[self] = true
  if is_tensor(params[1]) then
    self:add_param_group({params = params})
  else
    for _, g in ipairs(params) do self:add_param_group(g) end
  end
end

--- Add a group {params = {...}, hyper-parameter overrides}; missing keys take
-- the defaults. A parameter may belong to one group only.
function Optimizer:add_param_group(group)
  local fname = "ember.optim." .. self.__name .. ".add_param_group"
  if type(group) ~= "table" or type(group.params) ~= "table" then
    error(fname .. ": expected a table {params = {tensors...}, ...}, got " .. type(group), 2)
  end
  local seen = {}
  for _, g in ipairs(self.param_groups) do
    for _, p in ipairs(g.params) do seen[p] = true end
  end
  local g = {}
  for k, v in pairs(group) do g[k] = copy_value(v) end
  for i, p in ipairs(g.params) do
    if not is_tensor(p) then
      error(fmt("%s: expected params[%d] to be a tensor, got %s", fname, i, type(p)), 2)
    end
    if seen[p] then
      error(fmt("%s: params[%d] appears in more than one place", fname, i), 2)
    end
    seen[p] = true
  end
  for k, v in pairs(self.defaults) do
    if g[k] == nil then g[k] = copy_value(v) end
  end
  self.param_groups[#self.param_groups + 1] = g
end

--- Reset gradients of every parameter: nil (the default, set_to_none), or
-- zeros in place when set_to_none is false. Gradients are never read into Lua
-- here or in step(): a Lua handle would keep a dropped gradient's memory
-- alive until the next collection.
function Optimizer:zero_grad(set_to_none)
  local groups = self.param_groups
  if #groups == 1 then util.zero_grads(groups[1].params, set_to_none) return end
  local all = {}                     -- one call: the stranded bytes counted over every group
  for _, g in ipairs(groups) do table.move(g.params, 1, #g.params, #all + 1, all) end
  util.zero_grads(all, set_to_none)
end

--- Set the learning rate of every group.
function Optimizer:set_lr(lr)
  if type(lr) ~= "number" then
    error("ember.optim." .. self.__name .. ".set_lr: expected a number, got " .. type(lr), 2)
  end
  for _, g in ipairs(self.param_groups) do g.lr = lr end
end

--- Learning rate of the first group.
function Optimizer:get_lr() return self.param_groups[1].lr end

function Optimizer:step()
  error("ember.optim." .. self.__name .. ": step is not implemented", 2)
end

--- PyTorch-layout state: {state = {[i] = {...}}, param_groups = {{..., params = {i...}}}}
-- with parameters numbered 1.. across groups in order. State tensors are the
-- optimizer's own (not copies).
function Optimizer:state_dict()
  local state, groups, i = {}, {}, 0
  for gi, g in ipairs(self.param_groups) do
    local packed = {}
    for k, v in pairs(g) do
      if k ~= "params" then packed[k] = copy_value(v) end
    end
    packed.params = {}
    for _, p in ipairs(g.params) do
      i = i + 1
      packed.params[#packed.params + 1] = i
      local st = self.state[p]
      if st ~= nil then state[i] = copy_value(st) end
    end
    groups[gi] = packed
  end
  return {state = state, param_groups = groups}
end

--- Load a state_dict produced by state_dict() (possibly through
-- state_to_tensors / tensors_to_state). Group structure must match. State
-- tensors are copied onto each parameter's device (and dtype, for float
-- state of float parameters).
--- The shape every load_state_dict needs (this one and ShardedOptimizer's):
-- {state = {...}, param_groups = {...}} with `ngroups` groups; errors name
-- `fname` and point `level` frames up.
function optim.check_state_dict(sd, fname, ngroups, level)
  if type(sd) ~= "table" or type(sd.state) ~= "table" or type(sd.param_groups) ~= "table" then
    error(fname .. ": expected {state = {...}, param_groups = {...}}, got " ..
      (type(sd) == "table" and "a table without state/param_groups" or type(sd)), level)
  end
  if #sd.param_groups ~= ngroups then
    error(fmt("%s: the state has %d parameter group(s), the optimizer %d", fname,
      #sd.param_groups, ngroups), level)
  end
end

--- The parameters a checked state's ids name, also shared by both
-- load_state_dicts: {id = parameter} from the ids of sd.param_groups[gi].params
-- against param_groups[gi].params, in order. Errors (`level` frames up) when a
-- group's counts differ or a state entry names a parameter no group lists.
function optim.params_by_id(sd, param_groups, fname, level)
  local by_index = {}
  for gi, g in ipairs(param_groups) do
    local ids = sd.param_groups[gi].params or {}
    if #ids ~= #g.params then
      error(fmt("%s: group %d has %d parameter(s) in the state, %d in the optimizer", fname,
        gi, #ids, #g.params), level)
    end
    for j, id in ipairs(ids) do by_index[id] = g.params[j] end
  end
  for id in pairs(sd.state) do
    if by_index[id] == nil then
      error(fmt("%s: state for parameter %s, which no group lists", fname, tostring(id)), level)
    end
  end
  return by_index
end

function Optimizer:load_state_dict(sd)
  local fname = "ember.optim." .. self.__name .. ".load_state_dict"
  optim.check_state_dict(sd, fname, #self.param_groups, 3)
  local by_index = optim.params_by_id(sd, self.param_groups, fname, 3)
  for id, st in pairs(sd.state) do
    local p = by_index[id]
    for k, v in pairs(st) do
      if is_tensor(v) and #v.shape > 0 and not same_shape(v.shape, p.shape) then
        error(fmt("%s: state '%s' of parameter %s has shape %s, the parameter %s", fname, k,
          tostring(id), shape_str(v.shape), shape_str(p.shape)), 2)
      end
    end
  end
  local state = {}
  no_grad(function()
    for id, st in pairs(sd.state) do
      local p = by_index[id]
      local new = {}
      for k, v in pairs(st) do
        if is_tensor(v) then
          local float = FLOAT_DTYPES[v.dtype] and FLOAT_DTYPES[p.dtype]
          local t = ember.empty(v.shape, {dtype = float and p.dtype or v.dtype,
            device = p.device})
          t:copy_(v)
          new[k] = t
        else
          new[k] = copy_value(v)
        end
      end
      state[p] = new
    end
  end)
  self.state = state
  for gi, g in ipairs(self.param_groups) do
    for k, v in pairs(sd.param_groups[gi]) do
      if k ~= "params" then g[k] = copy_value(v) end
    end
  end
end

-- Append p, g and the state tensors named in `keys` to bucket `key` of
-- `buckets` (one kernel call per step / device / dtype).
local function bucket_add(buckets, order, key, p, st, keys)
  local b = buckets[key]
  if b == nil then
    b = {params = {}}
    for _, k in ipairs(keys) do b[k] = {} end
    buckets[key] = b
    order[#order + 1] = key
  end
  local n = #b.params + 1
  b.params[n] = p
  for _, k in ipairs(keys) do b[k][n] = st[k] end
  return b
end

-- Check lo <= v (< or <=) hi; `level` is error()'s level seen from here.
local function check_number(level, fname, name, v, lo, hi, hi_open)
  if type(v) ~= "number" or v ~= v or v < lo or (hi and (hi_open and v >= hi or v > hi)) then
    local range = hi and fmt("in [%g, %g%s", lo, hi, hi_open and ")" or "]") or
      fmt(">= %g", lo)
    error(fmt("%s: expected %s %s, got %s", fname, name, range, tostring(v)), level)
  end
end

-- ---------------------------------------------------------------------------
-- AdamW

--- AdamW (decoupled weight decay), PyTorch's formula, through the fused C
-- kernel: p -= lr·wd·p; m = β1 m + (1−β1) g; v = β2 v + (1−β2) g²;
-- p -= lr · (m / (1−β1ᵗ)) / (sqrt(v / (1−β2ᵗ)) + eps).
-- @type AdamW
-- @param params tensors or param groups
-- @tparam[opt] table opts lr (1e-3), betas ({0.9, 0.999}), eps (1e-8), weight_decay (0.01),
--   shadow_weights (true): an f32 parameter that autocast casts to bf16/f16
--   gets that copy written by the step itself, in the same kernel as its
--   update (the same bits as casting it after the step), and autocast's next
--   forward reads it instead of casting (ember/autocast.h); false: never.
--   overlap_bucket_mb (32): with step_in_backward, the MiB of parameters one
--   overlapped kernel launch updates (0: one launch per parameter).
local AdamW = Optimizer:extend("AdamW")
optim.AdamW = AdamW

local function adam_defaults(fname, opts, wd_default)
  opts = check_opts(fname, opts, 5)
  local d = {
    lr = opts.lr or 1e-3,
    betas = opts.betas or {0.9, 0.999},
    eps = opts.eps or 1e-8,
    weight_decay = opts.weight_decay or wd_default,
  }
  check_number(5, fname, "lr", d.lr, 0)
  if type(d.betas) ~= "table" then
    error(fmt("%s: expected betas = {beta1, beta2}, got %s", fname, type(d.betas)), 4)
  end
  check_number(5, fname, "betas[1]", d.betas[1], 0, 1, true)
  check_number(5, fname, "betas[2]", d.betas[2], 0, 1, true)
  check_number(5, fname, "eps", d.eps, 0)
  check_number(5, fname, "weight_decay", d.weight_decay, 0)
  return d
end

function AdamW:__init(params, opts)
  Optimizer.__init(self, params, adam_defaults("ember.optim.AdamW", opts, 0.01))
  local sw = opts and opts.shadow_weights
  if sw ~= nil and type(sw) ~= "boolean" then
    error(fmt("ember.optim.AdamW: expected shadow_weights = true or false, got %s", type(sw)), 3)
  end
  self.shadow_weights = sw ~= false
  local mb = opts and opts.overlap_bucket_mb
  if mb ~= nil then check_number(3, "ember.optim.AdamW", "overlap_bucket_mb", mb, 0) end
  self.overlap_bucket_mb = mb or 32
end

local ADAM_KEYS = {"exp_avg", "exp_avg_sq"}
local ADAM_CUDA_KEYS = {"exp_avg", "exp_avg_sq", "step"}

-- CUDA parameters take the capturable path: each one's `step` is a 0-d f32
-- tensor on its device that the kernel increments, and lr is read from a 0-d
-- f64 device tensor per (group, device), so a training step captured with
-- ember.cuda.graph replays with the right bias corrections and with the lr
-- last given to set_lr (refreshed on step() and set_lr(), never during a
-- capture; a schedule that assigns group.lr directly takes effect at the next
-- uncaptured step() or set_lr()). state_dict() still reports steps as numbers.
local function device_lr(self, gi, g, device)
  self._lr_dev = self._lr_dev or {}
  local key = gi .. "|" .. device
  local e = self._lr_dev[key]
  if e == nil then
    e = {t = ember.tensor(g.lr, {dtype = "f64", device = device}), v = g.lr}
    self._lr_dev[key] = e
  elseif e.v ~= g.lr and not core.cuda_is_capturing() then
    e.t:fill_(g.lr)
    e.v = g.lr
  end
  return e.t
end

-- The update of `params` (of group gi, every one with a gradient) split in
-- two, so the overlapped step (ember/optim_overlap.lua) can run the first
-- half on the main stream and the second on a side stream.
-- adamw_prepare: state made on first use, step counts advanced (CPU) or moved
-- to the device (CUDA), the device lr refreshed: everything that allocates or
-- writes host-side state. Returns the buckets: one kernel call each.
-- A bucket is keyed by core.placements' integer (device, dtype) and, on the
-- CPU, the step count too (negative keys there): no strings per parameter.
local function adamw_prepare(self, gi, g, params)
  local buckets, order = {}, {}
  local places = core.placements(params)
  for i, p in ipairs(params) do
    local st = self.state[p]
    if st == nil then
      st = {step = 0, exp_avg = ember.zeros_like(p), exp_avg_sq = ember.zeros_like(p)}
      self.state[p] = st
      if not self.shadow_weights then core.shadow_weights_(p, false) end
    end
    local place = places[i]
    if place >= CPU_END then
      if type(st.step) == "number" then
        st.step = ember.tensor(st.step, {dtype = "f32", device = p.device})
      end
      local b = bucket_add(buckets, order, place, p, st, ADAM_CUDA_KEYS)
      if b.device == nil then
        b.device = p.device
        b.lr_t = device_lr(self, gi, g, b.device)
      end
    else
      if type(st.step) ~= "number" then st.step = math.tointeger(st.step:item()) end
      st.step = st.step + 1
      bucket_add(buckets, order, -1 - (st.step * CPU_END + place), p, st, ADAM_KEYS).step = st.step
    end
  end
  return {buckets = buckets, order = order}
end

-- adamw_launch: the kernels of prepared buckets, on the current stream.
local function adamw_launch(g, work)
  for _, key in ipairs(work.order) do
    local b = work.buckets[key]
    if b.device then
      core.adamw_capturable_(b.params, nil, b.exp_avg, b.exp_avg_sq, b.step, b.lr_t, g.lr,
        g.betas[1], g.betas[2], g.eps, g.weight_decay)
    else
      core.adamw_(b.params, nil, b.exp_avg, b.exp_avg_sq, g.lr, g.betas[1], g.betas[2],
        g.eps, g.weight_decay, b.step)
    end
  end
end
AdamW._prepare, AdamW._launch = adamw_prepare, adamw_launch

-- The plain update of every parameter of every group that has a gradient and
-- is not in `skip` (a set, or nil).
function AdamW:_update_rest(skip)
  for gi, g in ipairs(self.param_groups) do
    local params = {}
    for _, p in ipairs(g.params) do
      if has_grad(p) and not (skip and skip[p]) then params[#params + 1] = p end
    end
    if #params > 0 then adamw_launch(g, adamw_prepare(self, gi, g, params)) end
  end
end

--- One optimisation step over every parameter with a gradient. After
-- step_in_backward() it completes the step the backward started
-- (ember/optim_overlap.lua).
-- @tparam[opt] function closure re-evaluates the model and returns the loss
-- @return the closure's loss, if any
function AdamW:step(closure)
  if self._armed then
    if closure then
      error("ember.optim.AdamW.step: a closure cannot be used after step_in_backward() " ..
        "(the backward already ran)", 2)
    end
    return self:_finish_step()
  end
  local loss
  if closure then loss = closure() end
  update(function() self:_update_rest(nil) end)
  return loss
end

--- Set the learning rate of every group (and, outside a capture, of the
-- device copies a captured step reads).
function AdamW:set_lr(lr)
  Optimizer.set_lr(self, lr)
  if self._lr_dev and not core.cuda_is_capturing() then
    for key, e in pairs(self._lr_dev) do
      local g = self.param_groups[math.tointeger(tonumber(key:match("^(%d+)|")))]
      if g and e.v ~= g.lr then e.t:fill_(g.lr); e.v = g.lr end
    end
  end
end

--- Optimizer.state_dict with device step counters read back as numbers.
function AdamW:state_dict()
  local sd = Optimizer.state_dict(self)
  for _, st in pairs(sd.state) do
    if type(st.step) ~= "number" and st.step ~= nil then
      local v = st.step:item()
      st.step = math.tointeger(v) or v
    end
  end
  return sd
end

-- overlapped with backward: step_in_backward, grad_norm (ember/optim_overlap.lua)
require("ember.optim_overlap").install(AdamW, {update = update})

-- ---------------------------------------------------------------------------
-- SGD

--- Stochastic gradient descent with optional momentum and weight decay
-- (PyTorch's formula: g += wd·p; buf = momentum·buf + g (buf = g at first);
-- p -= lr·buf).
-- @type SGD
-- @tparam[opt] table opts lr (1e-3), momentum (0), weight_decay (0)
local SGD = Optimizer:extend("SGD")
optim.SGD = SGD

function SGD:__init(params, opts)
  local fname = "ember.optim.SGD"
  opts = check_opts(fname, opts, 4)
  local d = {lr = opts.lr or 1e-3, momentum = opts.momentum or 0,
    weight_decay = opts.weight_decay or 0}
  check_number(4, fname, "lr", d.lr, 0)
  check_number(4, fname, "momentum", d.momentum, 0)
  check_number(4, fname, "weight_decay", d.weight_decay, 0)
  if opts.nesterov or (opts.dampening or 0) ~= 0 then
    error(fname .. ": nesterov and dampening are not supported", 3)
  end
  Optimizer.__init(self, params, d)
end

local SGD_KEYS = {"momentum_buffer"}

function SGD:step(closure)
  local loss
  if closure then loss = closure() end
  update(function()
    for _, g in ipairs(self.param_groups) do
      local buckets, order = {}, {}
      for _, p in ipairs(g.params) do
        if has_grad(p) then
          local first = false
          local st = self.state[p]
          if g.momentum ~= 0 and (st == nil or st.momentum_buffer == nil) then
            st = {momentum_buffer = ember.zeros_like(p)}
            self.state[p] = st
            first = true
          end
          bucket_add(buckets, order, fmt("%s|%s|%s", first, p.device, p.dtype), p,
            st or {}, SGD_KEYS).first = first
        end
      end
      for _, key in ipairs(order) do
        local b = buckets[key]
        local bufs = g.momentum ~= 0 and b.momentum_buffer or nil
        core.sgd_(b.params, nil, bufs, g.lr, g.momentum, g.weight_decay, b.first)
      end
    end
  end)
  return loss
end

-- ---------------------------------------------------------------------------
-- schedules

--- Cosine schedule with linear warm-up (the course's get_lr_cosine_schedule):
-- lr(t) = max_lr·t/warmup for t < warmup; then
-- min_lr + ½(1 + cos(π (t − warmup)/(total − warmup)))(max_lr − min_lr) up to
-- t = total; min_lr after.
-- @tparam table o max_lr, min_lr (0), warmup (0), total
-- @treturn function lr(step)
function optim.cosine_schedule(o)
  local fname = "ember.optim.cosine_schedule"
  if type(o) ~= "table" then
    error(fname .. ": expected {max_lr=, min_lr=, warmup=, total=}, got " .. type(o), 2)
  end
  local max_lr, min_lr = o.max_lr, o.min_lr or 0
  local warmup, total = o.warmup or o.warmup_iters or 0, o.total or o.cosine_cycle_iters
  check_number(3, fname, "max_lr", max_lr, 0)
  check_number(3, fname, "min_lr", min_lr, 0)
  check_number(3, fname, "warmup", warmup, 0)
  check_number(3, fname, "total", total, warmup)
  return function(t)
    if t < warmup then return max_lr * t / warmup end
    if t <= total then
      local progress = total > warmup and (t - warmup) / (total - warmup) or 1
      return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)
    end
    return min_lr
  end
end

--- Drives an optimizer's learning rate from a function of the step:
-- constructing it sets lr = fn(0); each `step()` advances and sets
-- lr = fn(step) in every group (call it after opt:step(), as in PyTorch).
-- @type LRScheduler
-- @param optimizer
-- @tparam function fn lr(step, group) -> number
local LRScheduler = class("LRScheduler")
optim.LRScheduler = LRScheduler

function LRScheduler:__init(optimizer, fn)
  if type(optimizer) ~= "table" or type(optimizer.param_groups) ~= "table" then
    error("ember.optim.LRScheduler: expected an optimizer, got " .. type(optimizer), 3)
  end
  if type(fn) ~= "function" then
    error("ember.optim.LRScheduler: expected fn(step) -> lr, got " .. type(fn), 3)
  end
  self.optimizer, self.fn, self.last_step = optimizer, fn, 0
  self:_apply()
end

function LRScheduler:_apply()
  local lrs = {}
  for i, g in ipairs(self.optimizer.param_groups) do
    g.lr = self.fn(self.last_step, g)
    lrs[i] = g.lr
  end
  self.last_lr = lrs
end

--- Advance one step and set the new learning rate.
function LRScheduler:step()
  self.last_step = self.last_step + 1
  self:_apply()
end

--- Learning rates set last, one per group.
function LRScheduler:get_last_lr() return self.last_lr end

function LRScheduler:state_dict() return {last_step = self.last_step} end

function LRScheduler:load_state_dict(s)
  self.last_step = s.last_step
  self:_apply()
end

-- ---------------------------------------------------------------------------
-- flat form for ember.save

--- Flatten an optimizer state_dict into name -> tensor, so ember.save can
-- write it: "state.{i}.{key}" (tensors as they are; numbers such as step as
-- 0-d f64) and "param_groups.{g}.{key}" (numbers 0-d f64, arrays of numbers
-- 1-d f64, params 1-d i64, booleans 0-d bool).
function optim.state_to_tensors(sd)
  local fname = "ember.optim.state_to_tensors"
  local out = {}
  local function put(name, v)
    if is_tensor(v) then
      out[name] = v
    elseif type(v) == "number" then
      out[name] = ember.tensor(v, {dtype = "f64"})
    elseif type(v) == "boolean" then
      out[name] = ember.tensor(v, {dtype = "bool"})
    elseif type(v) == "table" then
      for i, x in ipairs(v) do
        if type(x) ~= "number" then
          error(fmt("%s: %s[%d] is a %s; only numbers can be stored", fname, name, i, type(x)), 3)
        end
      end
      out[name] = ember.tensor(v, {dtype = "f64"})
    else
      error(fmt("%s: %s is a %s; only tensors, numbers, booleans and arrays of numbers " ..
        "can be stored", fname, name, type(v)), 3)
    end
  end
  for i, st in pairs(sd.state) do
    for k, v in pairs(st) do put(fmt("state.%d.%s", i, k), v) end
  end
  for gi, g in ipairs(sd.param_groups) do
    for k, v in pairs(g) do
      if k == "params" then
        out[fmt("param_groups.%d.params", gi)] = ember.tensor(v, {dtype = "i64"})
      else
        put(fmt("param_groups.%d.%s", gi, k), v)
      end
    end
  end
  return out
end

local function to_lua(t, integral)
  local v
  if t.dtype == "bool" then
    v = t:item()
    return v == true or v == 1
  end
  if #t.shape == 0 then
    v = t:item()
    return integral and math.tointeger(v) or v
  end
  v = t:tolist()
  if integral then
    for i, x in ipairs(v) do v[i] = math.tointeger(x) or x end
  end
  return v
end

--- Inverse of state_to_tensors: name -> tensor back into {state=, param_groups=}.
function optim.tensors_to_state(flat)
  local sd = {state = {}, param_groups = {}}
  for _, name in ipairs(sorted_keys(flat)) do
    local t = flat[name]
    local i, key = tostring(name):match("^state%.(%d+)%.(.+)$")
    if i then
      i = math.tointeger(tonumber(i))
      sd.state[i] = sd.state[i] or {}
      if key == "step" then
        sd.state[i][key] = to_lua(t, true)
      elseif key:match("^exp_avg") or key:match("buffer$") then
        sd.state[i][key] = t
      else
        sd.state[i][key] = #t.shape == 0 and to_lua(t, false) or t
      end
    else
      local gi, gkey = tostring(name):match("^param_groups%.(%d+)%.(.+)$")
      if gi then
        gi = math.tointeger(tonumber(gi))
        sd.param_groups[gi] = sd.param_groups[gi] or {}
        sd.param_groups[gi][gkey] = to_lua(t, gkey == "params")
      end
    end
  end
  return sd
end

-- ZeRO-1 (ember/zero.lua), loaded on first use
setmetatable(optim, {__index = function(t, k)
  if k == "ShardedOptimizer" then
    local v = require("ember.zero").ShardedOptimizer
    rawset(t, k, v)
    return v
  end
end})

return optim
