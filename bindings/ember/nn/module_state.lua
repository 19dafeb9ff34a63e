--- ember.nn.Module, continued: the methods that move or copy a module's
-- tensors — `to` (and cuda, cpu, float, bfloat16), `state_dict` and
-- `load_state_dict`.
--
-- `m:to(device|dtype)` converts parameters *in place* (p:set_), so the
-- tensors an optimizer already holds stay the model's parameters.
-- Loaded by ember/nn/module.lua; it adds methods to Module and exports nothing.
-- @module ember.nn.module_state

local core = require "ember.core"
local util = require "ember.util"
local parameter = require "ember.nn.parameter"
local module = require "ember.nn.module"

local Module, named_tensors = module.Module, module.named_tensors
local fmt = string.format
local is_tensor, no_grad, check_opts = util.is_tensor, util.no_grad, util.check_opts
local shape_str, same_shape, sorted_keys = util.shape_str, util.same_shape, util.sorted_keys
local DTYPES, FLOAT_DTYPES = util.DTYPES, util.FLOAT_DTYPES
local note_parameter = parameter.note

-- Parse a `to` argument into (device, dtype); either may be nil.
local function parse_to(args)
  local device, dtype
  for i = 1, args.n do
    local a = args[i]
    if type(a) == "string" then
      if DTYPES[a] then dtype = DTYPES[a]
      elseif a == "cpu" or a:match("^cuda$") or a:match("^cuda:%d+$") then device = a
      else
        error(fmt("ember.nn.Module.to: expected a dtype (f32, bf16, ...) or a device " ..
          "(cpu, cuda, cuda:N), got \"%s\"", a), 3)
      end
    elseif type(a) == "table" then
      if a.device ~= nil then device = a.device end
      if a.dtype ~= nil then
        if not DTYPES[a.dtype] then
          error(fmt("ember.nn.Module.to: unknown dtype \"%s\"", tostring(a.dtype)), 3)
        end
        dtype = DTYPES[a.dtype]
      end
    elseif is_tensor(a) then
      device, dtype = a.device, a.dtype
    elseif a ~= nil then
      error("ember.nn.Module.to: expected a dtype, a device or {device=, dtype=}, got " ..
        type(a), 3)
    end
  end
  if dtype and not FLOAT_DTYPES[dtype] then
    error(fmt("ember.nn.Module.to: expected a floating-point dtype, got %s", dtype), 3)
  end
  return device, dtype
end

--- Move and/or convert parameters, their grads and buffers in place.
-- Only floating-point tensors change dtype (as in PyTorch). Parameters keep
-- their identity (`p:set_`), so optimizers holding them keep working.
-- @param ... "cuda", "bf16", {device=, dtype=}, or a tensor to match
-- @return self
function Module:to(...)
  local device, dtype = parse_to(table.pack(...))
  if device == nil and dtype == nil then return self end
  local function spec_for(t)
    return {device = device, dtype = FLOAT_DTYPES[t.dtype] and dtype or nil}
  end
  no_grad(function()
    local done, replaced = {}, {}
    for _, m in ipairs(self:modules()) do
      local params = rawget(m, "_parameters")
      for _, name in ipairs(rawget(m, "_parameters_order")) do
        local p = params[name]
        if replaced[p] then
          params[name] = replaced[p]            -- a tied parameter seen before
        elseif not done[p] then
          done[p] = true
          local q = p:to(spec_for(p))
          if q.dtype ~= p.dtype or q.device ~= p.device then
            local g = p.grad
            if g ~= nil then p.grad = nil end
            q = q:detach()
            if pcall(p.set_, p, q) then
              if g ~= nil then p.grad = g:to(spec_for(g)) end
              core.mem_tag(p, "parameter")         -- its new storage (memory history)
            else
              -- The core's set_ cannot change dtype/device: register a new
              -- tensor instead (references held elsewhere go stale).
              q.requires_grad = p.requires_grad
              if g ~= nil then q.grad = g:to(spec_for(g)) end
              params[name], replaced[p] = q, q
              note_parameter(q)
            end
          end
        end
      end
      local bufs = rawget(m, "_buffers")
      for _, name in ipairs(rawget(m, "_buffers_order")) do
        bufs[name] = bufs[name]:to(spec_for(bufs[name]))
      end
    end
  end)
  module.changed()   -- registries written directly above: cached lists are stale
  return self
end

--- to("cuda") (or "cuda:N").
function Module:cuda(device) return self:to(device or "cuda") end
--- to("cpu").
function Module:cpu() return self:to("cpu") end
--- to("f32").
function Module:float() return self:to("f32") end
--- to("bf16").
function Module:bfloat16() return self:to("bf16") end

--- Parameters and persistent buffers by dotted name. The tensors are
-- detached aliases of the module's (they share storage, as in PyTorch).
-- Tied tensors appear under every name.
function Module:state_dict()
  local sd = {}
  for _, np in ipairs(named_tensors(self, "_parameters", false)) do
    sd[np[1]] = np[2]:detach()
  end
  for _, nb in ipairs(named_tensors(self, "_buffers", false, true)) do
    sd[nb[1]] = nb[2]:detach()
  end
  return sd
end

--- Copy tensors from `sd` (name -> tensor) into the parameters and buffers.
-- Shape mismatches are always errors. With strict (the default), missing or
-- unexpected keys are errors too, naming them; otherwise they are returned.
-- Values are converted to each parameter's dtype and device.
-- @tparam table sd
-- @tparam[opt] table opts `strict` (default true)
-- @return {missing_keys = {...}, unexpected_keys = {...}}
function Module:load_state_dict(sd, opts)
  if type(sd) ~= "table" then
    error("ember.nn.Module.load_state_dict: expected a table name -> tensor, got " .. type(sd), 2)
  end
  opts = check_opts("ember.nn.Module.load_state_dict", opts, 3)
  local strict = opts.strict ~= false
  local targets = {}
  for _, np in ipairs(named_tensors(self, "_parameters", false)) do targets[np[1]] = np[2] end
  for _, nb in ipairs(named_tensors(self, "_buffers", false, true)) do targets[nb[1]] = nb[2] end

  local missing, unexpected, mismatched = {}, {}, {}
  for _, name in ipairs(sorted_keys(targets)) do
    local src = sd[name]
    if src == nil then
      missing[#missing + 1] = name
    elseif not is_tensor(src) then
      mismatched[#mismatched + 1] = fmt("%s: expected a tensor, got %s", name, type(src))
    elseif not same_shape(src.shape, targets[name].shape) then
      mismatched[#mismatched + 1] = fmt("%s: checkpoint has shape %s, model has %s", name,
        shape_str(src.shape), shape_str(targets[name].shape))
    end
  end
  for _, name in ipairs(sorted_keys(sd)) do
    if targets[name] == nil then unexpected[#unexpected + 1] = tostring(name) end
  end

  local problems = {}
  if #mismatched > 0 then problems[#problems + 1] = "size mismatch for " ..
    table.concat(mismatched, "; ") end
  if strict and #missing > 0 then problems[#problems + 1] = "missing keys: " ..
    table.concat(missing, ", ") end
  if strict and #unexpected > 0 then problems[#problems + 1] = "unexpected keys: " ..
    table.concat(unexpected, ", ") end
  if #problems > 0 then
    error("ember.nn.Module.load_state_dict: " .. table.concat(problems, "; "), 2)
  end

  no_grad(function()
    for name, dst in pairs(targets) do
      local src = sd[name]
      if src ~= nil then dst:copy_(src) end
    end
  end)
  return {missing_keys = missing, unexpected_keys = unexpected}
end
return Module
