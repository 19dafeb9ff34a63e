--- ember.nn.parallel.DDP: data-parallel training, PyTorch's DistributedDataParallel
-- as four small strategies you can read and copy (CS336 assignment 2):
--
--   naive     one blocking all-reduce per parameter after backward (ember/ddp_naive.lua)
--   flat      every gradient copied into one flat buffer, one all-reduce (ddp_flat.lua)
--   overlap   per-parameter async all-reduces launched from grad hooks (ddp_overlap.lua)
--   bucketed  gradients live in bucket buffers as views; a bucket's async
--             all-reduce starts when its last gradient lands (ddp_bucketed.lua)
--
--     local ddp = ember.nn.parallel.DDP(model, {strategy = "bucketed", bucket_mb = 25})
--     for step = 1, n do
--       opt:zero_grad(); ddp:on_train_batch_start()   -- this order keeps grads as bucket views
--       local loss = loss_fn(ddp(x), y); loss:backward()
--       ddp:finish_gradient_synchronization(); opt:step()
--     end
--
-- Wrapping broadcasts rank 0's parameters and buffers, so ranks may start from
-- different seeds. Gradients are averaged. Frozen parameters (requires_grad
-- false) are left alone; tied weights appear once in `parameters()` and are
-- reduced once. A parameter without a gradient on some rank counts as zeros
-- there, so every rank issues the same collectives in the same order; after
-- finish_gradient_synchronization every trainable parameter has the same
-- averaged .grad on every rank (zeros when no rank produced one).
--
-- A strategy is a class made with `ddp.Strategy:extend(name)` that defines
-- `setup(opts)`, `on_train_batch_start()` and `finish_gradient_synchronization()`;
-- pass the class itself as `strategy` to use your own (examples/custom_ddp.lua).
-- @module ember.ddp

local ddp = {}
package.loaded["ember.ddp"] = ddp

local ember = require "ember"

local fmt = string.format
local FNAME = "ember.nn.parallel.DDP"

local STRATEGIES = {naive = "ember.ddp_naive", flat = "ember.ddp_flat",
  overlap = "ember.ddp_overlap", bucketed = "ember.ddp_bucketed"}
local STRATEGY_NAMES = '"naive", "flat", "overlap" or "bucketed"'
-- bucket options are accepted by every strategy (a script can switch with a
-- --strategy flag) and used by "bucketed"
local OPTIONS = {strategy = true, bucket_mb = true, first_bucket_mb = true}

-- ---------------------------------------------------------------------------
-- Strategy: the base class every strategy extends

--- The wrapper a strategy instance is: calling it runs the module; parameters,
-- state_dict, train/eval pass through to `ddp.module`.
-- @type Strategy
local Strategy = {__name = "DDP"}
Strategy.__index = Strategy
ddp.Strategy = Strategy

local function strategy_call(self, ...) return self.module(...) end
local function strategy_tostring(self)
  return fmt("DDP(strategy=%s, world_size=%d)\n  (module): %s", self.__name,
    self.world_size, tostring(self.module))
end
Strategy.__call, Strategy.__tostring = strategy_call, strategy_tostring

--- A subclass: `local Mine = ddp.Strategy:extend("mine")`.
function Strategy:extend(name)
  if type(name) ~= "string" then
    error(fmt("%s.Strategy.extend: expected a strategy name (string), got %s", FNAME, type(name)), 2)
  end
  local cls = setmetatable({__name = name, __call = strategy_call,
    __tostring = strategy_tostring, super = self}, {__index = self})
  cls.__index = cls
  return cls
end

--- Called once at wrap time, after the broadcast; `self.params` holds the
-- trainable parameters (registration order, tied ones once).
function Strategy:setup(opts) end
--- Before each step's forward: reset per-step state.
function Strategy:on_train_batch_start() end
--- After backward: when it returns, every p.grad holds the averaged gradient.
function Strategy:finish_gradient_synchronization() end
--- Remove the grad hooks a strategy registered (the wrapper stops syncing).
function Strategy:remove_hooks()
  for _, h in ipairs(self.hooks or {}) do h.remove() end
  self.hooks = {}
end

--- Register fn(param) as p's post-accumulate-grad hook, remembered for
-- remove_hooks. Inside no_sync the hook calls self:unsynced_grad(param) instead.
function Strategy:add_hook(p, fn)
  self.hooks = self.hooks or {}
  self.hooks[#self.hooks + 1] = p:register_post_accumulate_grad_hook(function(param)
    if self.sync_off then return self:unsynced_grad(param) end
    return fn(param)
  end)
end

--- A gradient landed inside no_sync: nothing to launch (a strategy whose
-- gradients must stay somewhere particular, as bucket views, overrides this).
function Strategy:unsynced_grad(param) end

--- ddp:no_sync(fn, ...) -> fn's results: run fn (a micro-batch's forward and
-- backward) without synchronising, as PyTorch's `with ddp.no_sync():`.
-- Gradients accumulate locally; the next backward outside no_sync, then
-- finish_gradient_synchronization, reduce the sum of every micro-batch:
--     ddp:on_train_batch_start()
--     ddp:no_sync(function() (loss_fn(ddp(x1), y1) / 2):backward() end)
--     (loss_fn(ddp(x2), y2) / 2):backward()
--     ddp:finish_gradient_synchronization(); opt:step()
function Strategy:no_sync(fn, ...)
  if type(fn) ~= "function" then
    error(fmt("%s.no_sync: expected a function (the micro-batch's forward and backward), got %s",
      FNAME, type(fn)), 2)
  end
  local prev = self.sync_off
  self.sync_off = true
  local res = table.pack(pcall(fn, ...))
  self.sync_off = prev
  if not res[1] then error(res[2], 0) end
  return table.unpack(res, 2, res.n)
end

function Strategy:forward(...) return self.module(...) end
function Strategy:parameters() return self.module:parameters() end
function Strategy:named_parameters() return self.module:named_parameters() end
function Strategy:buffers() return self.module:buffers() end
function Strategy:named_buffers() return self.module:named_buffers() end
--- The module's state_dict (no "module." prefix, unlike PyTorch).
function Strategy:state_dict() return self.module:state_dict() end
function Strategy:load_state_dict(sd, opts) return self.module:load_state_dict(sd, opts) end
function Strategy:train(mode) self.module:train(mode); return self end
function Strategy:eval() self.module:eval(); return self end
function Strategy:zero_grad(set_to_none) return self.module:zero_grad(set_to_none) end

-- ---------------------------------------------------------------------------
-- helpers the strategies share

--- Trainable parameters of a module: requires_grad ones, registration order,
-- a tied tensor once (Module:parameters already drops repeats).
function ddp.trainable_parameters(model)
  local out = {}
  for _, p in ipairs(model:parameters()) do
    if p.requires_grad then out[#out + 1] = p end
  end
  return out
end

--- Broadcast t from rank src in place; a non-contiguous tensor goes through
-- a contiguous copy (collectives need contiguous memory).
function ddp.broadcast_(t, src)
  local dist = require "ember.dist"
  ember.no_grad(function()
    if t:is_contiguous() then
      dist.broadcast(t, {src = src or 0})
    else
      local c = t:contiguous()
      dist.broadcast(c, {src = src or 0})
      t:copy_(c)
    end
  end)
end

--- p.grad, or (when p got no gradient on this rank) a fresh zero gradient
-- assigned to p.grad: every rank then reduces the same tensors.
function ddp.grad_or_zeros(p)
  local g = p.grad
  if g == nil then
    g = ember.zeros_like(p)
    p.grad = g
  end
  return g
end

-- ---------------------------------------------------------------------------
-- the constructor

local function check_mb(name, v)
  if v ~= nil and (type(v) ~= "number" or v ~= v or v <= 0) then
    error(fmt("%s: expected %s to be a positive number of MiB, got %s", FNAME, name,
      tostring(v)), 4)
  end
end

-- opts -> (strategy class, opts); errors name what was expected and received.
local function resolve(opts)
  if opts ~= nil and type(opts) ~= "table" then
    error(fmt("%s: expected an options table {strategy=, bucket_mb=}, got %s", FNAME,
      type(opts)), 3)
  end
  opts = opts or {}
  for k in pairs(opts) do
    if not OPTIONS[k] then
      error(fmt("%s: unknown option '%s' (expected strategy, bucket_mb, first_bucket_mb)",
        FNAME, tostring(k)), 3)
    end
  end
  check_mb("bucket_mb", opts.bucket_mb)
  check_mb("first_bucket_mb", opts.first_bucket_mb)
  local s = opts.strategy or "bucketed"
  if type(s) == "table" and type(s.finish_gradient_synchronization) == "function" then
    return s, opts
  end
  if type(s) ~= "string" or not STRATEGIES[s] then
    error(fmt("%s: expected strategy %s (or a class from ddp.Strategy:extend), got %s", FNAME,
      STRATEGY_NAMES, type(s) == "string" and ('"' .. s .. '"') or type(s)), 3)
  end
  return require(STRATEGIES[s]), opts
end

--- Wrap a module for data-parallel training (ember.dist must be initialised).
-- @param model an nn.Module
-- @tparam[opt] table opts strategy ("bucketed"; or a Strategy class),
--   bucket_mb (25), first_bucket_mb (1, at most bucket_mb)
-- @return the wrapper (a Strategy instance); `wrapper.module` is the model
function ddp.DDP(model, opts)
  local nn = require "ember.nn"
  if not nn.is_module(model) then
    error(fmt("%s: expected an nn.Module, got %s", FNAME, type(model)), 2)
  end
  local cls
  cls, opts = resolve(opts)
  local dist = require "ember.dist"
  if not dist.is_initialized() then
    error(FNAME .. ": expected ember.dist to be initialised; call ember.dist.init() first", 2)
  end
  local self = setmetatable({module = model, rank = dist.rank(),
    world_size = dist.world_size()}, cls)
  -- rank 0's weights everywhere: frozen ones and buffers too
  for _, p in ipairs(model:parameters()) do ddp.broadcast_(p, 0) end
  for _, b in ipairs(model:buffers()) do ddp.broadcast_(b, 0) end
  self.params = ddp.trainable_parameters(model)
  self:setup(opts)
  return self
end

--- ember.nn.parallel.plan_buckets(model, loss_fn, opts): the bucket size for
-- bucketed DDP from one measured backward and the measured all-reduce link
-- (ember/ddp_planner.lua; every rank calls it).
function ddp.plan_buckets(model, loss_fn, opts)
  return require("ember.ddp_planner").plan_buckets(model, loss_fn, opts)
end

return ddp
