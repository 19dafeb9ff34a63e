--- ember.nn.Module: the base class of every module, with PyTorch's registry
-- (what assigning a field registers, and in which order: see ember/nn.lua).
--
-- This file holds the class machinery, registration, traversal, modes and
-- the repr; ember/nn/module_state.lua adds the methods that move or copy the
-- tensors (`to`, `state_dict`, `load_state_dict`). Calling an instance is
-- `forward` directly (one metamethod, no wrapper) unless a measurement tool
-- tracks module paths.
-- @module ember.nn.module

local M = {}
-- Registered first: module_state.lua, required at the end, requires us back.
package.loaded["ember.nn.module"] = M

local core = require "ember.core"
local util = require "ember.util"
local parameter = require "ember.nn.parameter"
local context = require "ember.context"

local fmt, math_type, rawget = string.format, math.type, rawget
local is_tensor = util.is_tensor
local note_parameter = parameter.note

-- Error levels: the argument checks of a constructor are called from its
-- __init, which Module.new calls, which the class's __call tail-calls: level
-- 4 is the caller of `nn.Linear(...)`.
M.CTOR_LEVEL = 4

-- Construction helpers the layers share (ember/nn/*.lua), so every
-- constructor checks its arguments in the same order with the same messages.
-- They are one call deeper than __init: their error level is CTOR_LEVEL + 1.

--- A constructor's checks in one call: each (argname, value) pair of ... a
-- positive integer, then opts a table or nil; returns opts ({} for nil).
-- An error names fname and the line that called the constructor.
function M.check_ctor(fname, opts, ...)
  for i = 1, select("#", ...), 2 do
    local argname, v = select(i, ...)
    util.check_positive_int(fname, argname, v, M.CTOR_LEVEL + 1)
  end
  opts = util.check_opts(fname, opts, M.CTOR_LEVEL + 1)
  return opts
end

--- What the norms over the last dim (LayerNorm, RMSNorm) share: the checks
-- of (d, opts), self.d, self.eps (opts.eps, 1e-5 by default) and a weight of
-- ones; returns opts.
function M.init_norm(self, fname, d, opts)
  util.check_positive_int(fname, "d", d, M.CTOR_LEVEL + 1)
  opts = util.check_opts(fname, opts, M.CTOR_LEVEL + 1)
  self.d, self.eps = d, opts.eps or 1e-5
  self.weight = parameter.new({d}, opts.dtype, opts.device, function(t) t:fill_(1) end)
  return opts
end

--- The norms' extra_repr: "(d,), eps=...", as PyTorch prints them.
function M.norm_repr(self)
  return fmt("(%d,), eps=%s", self.d, util.float_repr(self.eps))
end

--- Base class of every module.
-- @type Module
local Module = {}
M.Module = Module

-- Instance field lookup: raw fields, then parameters, buffers, children, then
-- the class chain (PyTorch's __getattr__ order for registered things). It
-- runs for every method call and submodule access of a forward, so it is
-- flat: one rawget (an instance made outside Module.new may lack the
-- registries), then plain field reads, which the VM resolves on the raw
-- table without coming back here.
local function make_index(cls)
  return function(self, k)
    local mods = rawget(self, "_modules")
    if mods then
      local v
      if math_type(k) == "integer" then
        -- containers (ModuleList, Sequential): m[1] is child "0"
        v = mods[tostring(k - 1)]
      else
        v = self._parameters[k]
        if v == nil then v = self._buffers[k] end
        if v == nil then v = mods[k] end
      end
      if v ~= nil then return v end
    end
    return cls[k]
  end
end

local function is_module(v)
  if type(v) ~= "table" then return false end
  local mt = getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__ember_module") == true and
    rawget(v, "_modules") ~= nil
end
M.is_module = is_module

-- parameters() and modules() walk the tree and build names on the way: a
-- few hundred µs for a 12-layer model, on every zero_grad. Their lists are
-- cached per module, and every change to any registry (registration,
-- removal, reassignment, `to` replacing a tensor) drops every module's
-- cache: a module can sit in several trees and knows only its last parent,
-- and a removed parameter must not stay referenced (its memory held) by a
-- stale list. Code that writes `_parameters`/`_modules` directly must call
-- M.changed().
local WEAK_KEYS = {__mode = "k"}
local caches = setmetatable({}, WEAK_KEYS)   -- module -> {[kind] = list}
local function changed() caches = setmetatable({}, WEAK_KEYS) end
M.changed = changed

-- The cached list `kind` of self, built by build(self) when missing.
local function cached(self, kind, build)
  local c = caches[self]
  if c == nil then
    c = {}
    caches[self] = c
  end
  local list = c[kind]
  if list == nil then
    list = build(self)
    c[kind] = list
  end
  return list
end

-- A fresh copy of a cached list, for callers that may change what they get.
local function copy(list) return table.move(list, 1, #list, 1, {}) end

-- Append name to an ordered registry unless already present.
local function add_name(order, name)
  for _, n in ipairs(order) do if n == name then return end end
  order[#order + 1] = name
end

local function remove_name(order, name)
  for i, n in ipairs(order) do
    if n == name then table.remove(order, i) return end
  end
end

-- Remove name from every registry (it is about to be reassigned).
local function unregister(self, name)
  for _, kind in ipairs({"_parameters", "_buffers", "_modules"}) do
    local reg = rawget(self, kind)
    if reg[name] ~= nil then
      reg[name] = nil
      remove_name(rawget(self, kind .. "_order"), name)
      changed()
    end
  end
end

local function module_newindex(self, k, v)
  local params, bufs, mods = rawget(self, "_parameters"), rawget(self, "_buffers"),
    rawget(self, "_modules")
  if is_module(v) then
    return self:register_module(k, v)
  elseif is_tensor(v) and (params[k] ~= nil or (v.requires_grad and v.is_leaf)) then
    return self:register_parameter(k, v)
  elseif is_tensor(v) and bufs[k] ~= nil then
    bufs[k] = v
    changed()
    return
  elseif v == nil and (params[k] ~= nil or bufs[k] ~= nil or mods[k] ~= nil) then
    unregister(self, k)
    return
  elseif params[k] ~= nil or mods[k] ~= nil then
    error(fmt("ember.nn.Module: cannot assign a %s to '%s' (a registered %s); " ..
      "assign nil first", type(v), tostring(k), params[k] and "parameter" or "module"), 2)
  end
  rawset(self, k, v)
end

-- While a measurement tool tracks module paths (ember.context), calls run
-- inside their path ("layers.3.attn"); otherwise a plain forward call.
local function module_call(self, ...)
  if context.enabled then return context.call_module(self, ...) end
  return self:forward(...)
end

local function module_tostring(self)
  return self:__repr()
end

-- Metamethods each class table carries (metatables do not inherit them).
local METAMETHODS = {"__call", "__tostring", "__newindex", "__len"}

--- Create a subclass.
-- @tparam string name class name (shown by tostring)
-- @return the class; calling it creates an instance and runs `__init`
function Module:extend(name)
  if type(name) ~= "string" then
    error("ember.nn.Module.extend: expected a class name (string), got " .. type(name), 2)
  end
  local parent = self
  local cls = {}
  for _, mm in ipairs(METAMETHODS) do cls[mm] = rawget(parent, mm) end
  cls.__name = name
  cls.__ember_module = true
  cls.__index = make_index(cls)
  cls.super = parent
  return setmetatable(cls, {
    __index = parent,
    __call = function(c, ...) return c.new(c, ...) end,
    __tostring = function() return "ember.nn." .. name .. " (class)" end,
  })
end

--- Create an instance of class `cls` (what calling the class does): empty
-- registries, training mode, then `cls.__init(self, ...)`.
function Module.new(cls, ...)
  local self = {
    _parameters = {}, _parameters_order = {},
    _buffers = {}, _buffers_order = {}, _non_persistent = {},
    _modules = {}, _modules_order = {},
    training = true,
  }
  setmetatable(self, cls)
  self:__init(...)
  return self
end

Module.__name = "Module"
Module.__ember_module = true
Module.__index = make_index(Module)
Module.__newindex = module_newindex
Module.__call = module_call
Module.__tostring = module_tostring
setmetatable(Module, {
  __call = function(c, ...) return c.new(c, ...) end,
  __tostring = function() return "ember.nn.Module (class)" end,
})

--- Constructor body; subclasses override it (no need to call the base).
function Module:__init() end

--- The computation; subclasses override it. `m(...)` calls it.
function Module:forward()
  error(fmt("ember.nn.%s: forward is not implemented", self.__name), 2)
end

--- Class name of the module ("Linear").
function Module:type_name() return self.__name end

-- The checks of register_parameter/module/buffer: a name without '.', and v
-- nil or passing ok(v). Level 3 is the caller of register_*.
local function check_entry(method, name, v, ok, what)
  if type(name) ~= "string" or name == "" or name:find(".", 1, true) then
    error("ember.nn.Module." .. method .. ": expected a non-empty name without '.', got " ..
      tostring(name), 3)
  end
  if v ~= nil and not ok(v) then
    error(fmt("ember.nn.Module.%s: expected %s or nil for '%s', got %s", method, what, name,
      type(v)), 3)
  end
end

--- Register (or replace) a parameter; `nil` removes it.
-- @tparam string name
-- @param p a tensor (made a leaf requiring grad by the caller) or nil
function Module:register_parameter(name, p)
  check_entry("register_parameter", name, p, is_tensor, "a tensor")
  if rawget(self, name) ~= nil then rawset(self, name, nil) end
  local params = rawget(self, "_parameters")
  if params[name] == nil then unregister(self, name) end
  if p == nil then
    unregister(self, name)
    return
  end
  params[name] = p
  add_name(rawget(self, "_parameters_order"), name)
  changed()
  note_parameter(p)
end

--- Register (or replace) a child module; `nil` removes it.
function Module:register_module(name, m)
  check_entry("register_module", name, m, is_module, "a module")
  if rawget(self, name) ~= nil then rawset(self, name, nil) end
  local mods = rawget(self, "_modules")
  if mods[name] == nil then unregister(self, name) end
  if m == nil then
    unregister(self, name)
    return
  end
  mods[name] = m
  -- its place in the tree, for the module paths of profiles (ember.context)
  rawset(m, "_ember_name", name)
  rawset(m, "_ember_parent", self)
  add_name(rawget(self, "_modules_order"), name)
  changed()
end
Module.add_module = Module.register_module

--- Register a buffer: a tensor saved in state_dict (when persistent) and
-- moved by `to`, but not trained.
-- @tparam string name
-- @param t tensor or nil
-- @tparam[opt=true] boolean persistent
function Module:register_buffer(name, t, persistent)
  check_entry("register_buffer", name, t, is_tensor, "a tensor")
  if rawget(self, name) ~= nil then rawset(self, name, nil) end
  unregister(self, name)
  if t == nil then return end
  rawget(self, "_buffers")[name] = t
  add_name(rawget(self, "_buffers_order"), name)
  rawget(self, "_non_persistent")[name] = (persistent == false) or nil
  changed()
end

--- Direct children as an array, in registration order.
function Module:children()
  local out, mods = {}, rawget(self, "_modules")
  for _, name in ipairs(rawget(self, "_modules_order")) do out[#out + 1] = mods[name] end
  return out
end

--- Direct children as an array of {name, module}.
function Module:named_children()
  local out, mods = {}, rawget(self, "_modules")
  for _, name in ipairs(rawget(self, "_modules_order")) do
    out[#out + 1] = {name, mods[name]}
  end
  return out
end

--- Every module in the tree as {name, module}, depth-first pre-order; the
-- root is named "". Shared modules appear once.
function Module:named_modules(prefix, out, seen)
  prefix, out, seen = prefix or "", out or {}, seen or {}
  if seen[self] then return out end
  seen[self] = true
  out[#out + 1] = {prefix, self}
  for _, nc in ipairs(self:named_children()) do
    local child_prefix = prefix == "" and nc[1] or (prefix .. "." .. nc[1])
    nc[2]:named_modules(child_prefix, out, seen)
  end
  return out
end

local function build_modules(self)
  local out = {}
  for i, nm in ipairs(self:named_modules()) do out[i] = nm[2] end
  return out
end

--- Every module in the tree (self first), depth-first pre-order.
function Module:modules()
  return copy(cached(self, "modules", build_modules))
end

-- Walk (name, tensor) of one registry kind over the tree; dedup drops a
-- tensor seen before (weight tying), as PyTorch's remove_duplicate does.
local function named_tensors(self, kind, dedup, persistent_only)
  local out, seen = {}, {}
  for _, nm in ipairs(self:named_modules()) do
    local prefix, m = nm[1], nm[2]
    local reg = rawget(m, kind)
    local skip = persistent_only and rawget(m, "_non_persistent") or {}
    for _, name in ipairs(rawget(m, kind .. "_order")) do
      local t = reg[name]
      if not skip[name] and not (dedup and seen[t]) then
        seen[t] = true
        out[#out + 1] = {prefix == "" and name or (prefix .. "." .. name), t}
      end
    end
  end
  return out
end

--- Parameters as an array of {name, tensor} with dotted names, in
-- registration order (PyTorch's order); a shared tensor appears once.
function Module:named_parameters()
  return named_tensors(self, "_parameters", true)
end

local function build_parameters(self)
  local out = {}
  for i, np in ipairs(self:named_parameters()) do out[i] = np[2] end
  return out
end

-- The parameter list, not copied: for the methods below, which only read it
-- (a subclass's own parameters() wins).
local function parameter_list(self)
  if self.parameters ~= Module.parameters then return self:parameters() end
  return cached(self, "parameters", build_parameters)
end

--- Parameters as an array of tensors, in registration order.
function Module:parameters()
  return copy(cached(self, "parameters", build_parameters))
end

--- Buffers as an array of {name, tensor}.
function Module:named_buffers()
  return named_tensors(self, "_buffers", true)
end

--- Buffers as an array of tensors.
function Module:buffers()
  local out = {}
  for i, nb in ipairs(self:named_buffers()) do out[i] = nb[2] end
  return out
end

--- Total number of parameter elements (shared tensors counted once).
-- @tparam[opt=false] boolean trainable_only count only requires_grad ones
function Module:num_parameters(trainable_only)
  local n = 0
  for _, p in ipairs(parameter_list(self)) do
    if not trainable_only or p.requires_grad then n = n + p:numel() end
  end
  return n
end

--- Reset gradients: set each to nil (PyTorch's default set_to_none=true),
-- or with `set_to_none == false` fill existing ones with zeros in place
-- (keeps grads that are views into flat buffers).
-- @tparam[opt=true] boolean set_to_none
function Module:zero_grad(set_to_none)
  util.zero_grads(parameter_list(self), set_to_none)   -- one C call; see util.zero_grads
end

--- Turn requires_grad on or off for every parameter (freezing).
function Module:requires_grad_(on)
  if on == nil then on = true end
  for _, p in ipairs(parameter_list(self)) do p.requires_grad = on end
  return self
end

--- Call fn(m) on every child (recursively) and then on self; returns self.
function Module:apply(fn)
  for _, child in ipairs(self:children()) do child:apply(fn) end
  fn(self)
  return self
end

--- Set training mode (default true) on self and all descendants.
function Module:train(mode)
  if mode == nil then mode = true end
  for _, m in ipairs(cached(self, "modules", build_modules)) do rawset(m, "training", mode and true or false) end
  return self
end

--- Evaluation mode: train(false).
function Module:eval() return self:train(false) end

--- Extra information shown inside the parentheses by tostring.
function Module:extra_repr() return "" end

local function add_indent(s, n)
  local pad = string.rep(" ", n)
  return (s:gsub("\n", "\n" .. pad))
end

-- Repr lines of the children; ModuleList overrides it to fold repeats.
function Module:_child_repr_lines()
  local lines = {}
  for _, nc in ipairs(self:named_children()) do
    lines[#lines + 1] = "(" .. nc[1] .. "): " .. add_indent(nc[2]:__repr(), 2)
  end
  return lines
end

--- The module tree as PyTorch's repr prints it.
function Module:__repr()
  local extra = self:extra_repr()
  local lines = {}
  if extra ~= "" then
    for line in (extra .. "\n"):gmatch("(.-)\n") do lines[#lines + 1] = line end
  end
  local n_extra = #lines
  for _, l in ipairs(self:_child_repr_lines()) do lines[#lines + 1] = l end
  local s = self.__name .. "("
  if #lines > 0 then
    if n_extra == 1 and #lines == 1 then
      s = s .. lines[1]
    else
      s = s .. "\n  " .. table.concat(lines, "\n  ") .. "\n"
    end
  end
  return s .. ")"
end

-- for the files that extend Module (containers, module_state)
M.add_indent, M.named_tensors = add_indent, named_tensors

require "ember.nn.module_state"   -- to, state_dict, load_state_dict

return M
