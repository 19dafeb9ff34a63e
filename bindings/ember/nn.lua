--- ember.nn: modules with PyTorch's semantics, and the reference TransformerLM.
--
-- A module is a Lua table whose class is its metatable. Assigning a module or
-- a parameter to a field registers it, in assignment order, exactly as
-- PyTorch's `__setattr__` does, so `parameters()` comes out in PyTorch's
-- order and `named_parameters()` gives the dotted names a PyTorch
-- checkpoint uses ("layers.0.attn.q_proj.weight"). Registered things live in
-- `_parameters`, `_buffers` and `_modules` (never as raw fields), so
-- reassigning `self.weight` always goes through the registry.
--
-- A parameter is any leaf tensor with `requires_grad = true` (make one with
-- `nn.Parameter(t)`); a plain tensor assigned to a field is just a field. Use
-- `register_buffer` for state that belongs in `state_dict` but is not
-- trained.
--
--     local MLP = nn.Module:extend("MLP")
--     function MLP:__init(d)
--       self.fc1 = nn.Linear(d, 4 * d)
--       self.fc2 = nn.Linear(4 * d, d)
--     end
--     function MLP:forward(x) return self.fc2(F.relu(self.fc1(x))) end
--     local m = MLP(16)            -- m(x) calls m:forward(x)
--
-- `m:to(device|dtype)` converts parameters *in place* (p:set_), so the
-- tensors an optimizer already holds stay the model's parameters.
-- @module ember.nn

local nn = {}
-- Registered before requiring "ember" so that init.lua, which requires us,
-- gets this table rather than a second copy of the module.
package.loaded["ember.nn"] = nn

local core = require "ember.core"
local ember = require "ember"
local F = require "ember.functional"
nn.functional = F

local fmt = string.format

-- ---------------------------------------------------------------------------
-- helpers

local function is_tensor(v)
  if type(v) ~= "userdata" then return false end
  local f = ember.is_tensor
  if f then return f(v) end
  return true
end

--- Run fn with gradient recording off (in-place writes into parameters).
local function no_grad(fn)
  return ember.no_grad(fn)
end

local function shape_str(shape)
  local parts = {}
  for i, s in ipairs(shape) do parts[i] = tostring(s) end
  return "[" .. table.concat(parts, ", ") .. "]"
end

local function same_shape(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

-- dtype names and the aliases the core accepts, mapped to canonical names
local DTYPES = {
  f32 = "f32", float32 = "f32", float = "f32", f64 = "f64", float64 = "f64", double = "f64",
  bf16 = "bf16", bfloat16 = "bf16", f16 = "f16", float16 = "f16", half = "f16",
  i32 = "i32", int32 = "i32", int = "i32", i64 = "i64", int64 = "i64", long = "i64",
  u16 = "u16", uint16 = "u16", u8 = "u8", uint8 = "u8", byte = "u8", bool = "bool",
}
local FLOAT_DTYPES = {f32 = true, f64 = true, bf16 = true, f16 = true}

local function is_positive_int(v)
  return math.type(v) == "integer" and v > 0
end

-- Error levels: these helpers are called from a constructor's __init, which
-- Module.new calls, which the class's __call tail-calls: level 4 is the
-- caller of `nn.Linear(...)`.
local CTOR_LEVEL = 4

local function check_positive_int(fname, argname, v)
  if not is_positive_int(v) then
    error(fmt("%s: expected %s to be a positive integer, got %s", fname, argname,
      tostring(v)), CTOR_LEVEL)
  end
end

local function check_opts(fname, opts, level)
  if opts ~= nil and type(opts) ~= "table" then
    error(fmt("%s: expected an options table, got %s", fname, type(opts)), level or CTOR_LEVEL)
  end
  return opts or {}
end

--- Make a leaf parameter: a float tensor of `shape` on `device` with dtype
-- `dtype`, filled by `init(t)` in f32 (so a seed gives the same values in any
-- dtype), requiring grad.
local function new_param(shape, dtype, device, init)
  local t = ember.empty(shape, {device = device})
  init(t)
  if dtype ~= nil and DTYPES[dtype] ~= "f32" then t = t:to(dtype) end
  t.requires_grad = true
  return t
end

-- ---------------------------------------------------------------------------
-- Module and classes

--- Base class of every module.
-- @type Module
local Module = {}
nn.Module = Module

-- Instance field lookup: raw fields, then parameters, buffers, children, then
-- the class chain (PyTorch's __getattr__ order for registered things).
local function make_index(cls)
  return function(self, k)
    local mods = rawget(self, "_modules")
    if mods then
      local v
      if math.type(k) == "integer" then
        -- containers (ModuleList, Sequential): m[1] is child "0"
        v = mods[tostring(k - 1)]
      else
        v = rawget(self, "_parameters")[k]
        if v == nil then v = rawget(self, "_buffers")[k] end
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
nn.is_module = is_module

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
local context = require "ember.context"
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

-- Every registered parameter, weakly: memory history tags their storages
-- "parameter" (and their grads "gradient") when recording starts after they
-- were made (ember.memory). While recording, registering tags at once.
nn._live_parameters = setmetatable({}, {__mode = "k"})
local function note_parameter(p)
  nn._live_parameters[p] = true
  core.mem_tag(p, "parameter")
end

--- Register (or replace) a parameter; `nil` removes it.
-- @tparam string name
-- @param p a tensor (made a leaf requiring grad by the caller) or nil
function Module:register_parameter(name, p)
  if type(name) ~= "string" or name == "" or name:find(".", 1, true) then
    error("ember.nn.Module.register_parameter: expected a non-empty name without '.', got " ..
      tostring(name), 2)
  end
  if p ~= nil and not is_tensor(p) then
    error(fmt("ember.nn.Module.register_parameter: expected a tensor or nil for '%s', got %s",
      name, type(p)), 2)
  end
  if rawget(self, name) ~= nil then rawset(self, name, nil) end
  local params = rawget(self, "_parameters")
  if params[name] == nil then unregister(self, name) end
  if p == nil then
    unregister(self, name)
    return
  end
  params[name] = p
  add_name(rawget(self, "_parameters_order"), name)
  note_parameter(p)
end

--- Register (or replace) a child module; `nil` removes it.
function Module:register_module(name, m)
  if type(name) ~= "string" or name == "" or name:find(".", 1, true) then
    error("ember.nn.Module.register_module: expected a non-empty name without '.', got " ..
      tostring(name), 2)
  end
  if m ~= nil and not is_module(m) then
    error(fmt("ember.nn.Module.register_module: expected a module or nil for '%s', got %s",
      name, type(m)), 2)
  end
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
end
Module.add_module = Module.register_module

--- Register a buffer: a tensor saved in state_dict (when persistent) and
-- moved by `to`, but not trained.
-- @tparam string name
-- @param t tensor or nil
-- @tparam[opt=true] boolean persistent
function Module:register_buffer(name, t, persistent)
  if type(name) ~= "string" or name == "" or name:find(".", 1, true) then
    error("ember.nn.Module.register_buffer: expected a non-empty name without '.', got " ..
      tostring(name), 2)
  end
  if t ~= nil and not is_tensor(t) then
    error(fmt("ember.nn.Module.register_buffer: expected a tensor or nil for '%s', got %s",
      name, type(t)), 2)
  end
  if rawget(self, name) ~= nil then rawset(self, name, nil) end
  unregister(self, name)
  if t == nil then return end
  rawget(self, "_buffers")[name] = t
  add_name(rawget(self, "_buffers_order"), name)
  rawget(self, "_non_persistent")[name] = (persistent == false) or nil
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

--- Every module in the tree (self first), depth-first pre-order.
function Module:modules()
  local out = {}
  for i, nm in ipairs(self:named_modules()) do out[i] = nm[2] end
  return out
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

--- Parameters as an array of tensors, in registration order.
function Module:parameters()
  local out = {}
  for i, np in ipairs(self:named_parameters()) do out[i] = np[2] end
  return out
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
  for _, p in ipairs(self:parameters()) do
    if not trainable_only or p.requires_grad then n = n + p:numel() end
  end
  return n
end

--- Reset gradients: set each to nil (PyTorch's default set_to_none=true),
-- or with `set_to_none == false` fill existing ones with zeros in place
-- (keeps grads that are views into flat buffers).
-- @tparam[opt=true] boolean set_to_none
function Module:zero_grad(set_to_none)
  local params = self:parameters()
  if set_to_none == false then
    no_grad(function()
      for _, p in ipairs(params) do
        local g = p.grad
        if g ~= nil then g:zero_() end
      end
    end)
  else
    for _, p in ipairs(params) do p.grad = nil end
  end
end

--- Turn requires_grad on or off for every parameter (freezing).
function Module:requires_grad_(on)
  if on == nil then on = true end
  for _, p in ipairs(self:parameters()) do p.requires_grad = on end
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
  for _, m in ipairs(self:modules()) do rawset(m, "training", mode and true or false) end
  return self
end

--- Evaluation mode: train(false).
function Module:eval() return self:train(false) end

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

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks)
  return ks
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

--- A parameter: `t` as a leaf that requires grad (detached if it had history).
-- @param t float tensor
-- @tparam[opt=true] boolean requires_grad
function nn.Parameter(t, requires_grad)
  if not is_tensor(t) then
    error("ember.nn.Parameter: expected a tensor, got " .. type(t), 2)
  end
  if not t.is_leaf then t = t:detach() end
  t.requires_grad = requires_grad ~= false
  return t
end

-- ---------------------------------------------------------------------------
-- containers

--- A list of modules, named "0", "1", ... (as PyTorch). Index it 1-based
-- like any Lua array: `layers[1]` is child "0"; `#layers` and `ipairs` work.
-- @type ModuleList
local ModuleList = Module:extend("ModuleList")
nn.ModuleList = ModuleList

function ModuleList:__init(mods)
  for _, m in ipairs(mods or {}) do self:append(m) end
end

--- Append a module; returns self.
function ModuleList:append(m)
  if not is_module(m) then
    error("ember.nn.ModuleList.append: expected a module, got " .. type(m), 2)
  end
  self:register_module(tostring(#rawget(self, "_modules_order")), m)
  return self
end

ModuleList.__len = function(self) return #rawget(self, "_modules_order") end
function ModuleList:forward()
  error("ember.nn.ModuleList: a ModuleList has no forward; iterate over it", 2)
end

-- PyTorch folds runs of identical children: "(0-11): 12 x TransformerBlock(".
function ModuleList:_child_repr_lines()
  local lines, kids = {}, self:named_children()
  local i = 1
  while i <= #kids do
    local r = kids[i][2]:__repr()
    local j = i
    while j < #kids and kids[j + 1][2]:__repr() == r do j = j + 1 end
    if j == i then
      lines[#lines + 1] = "(" .. kids[i][1] .. "): " .. add_indent(r, 2)
    else
      lines[#lines + 1] = fmt("(%s-%s): %d x %s", kids[i][1], kids[j][1], j - i + 1,
        add_indent(r, 2))
    end
    i = j + 1
  end
  return lines
end

--- Modules applied in order: Sequential(a, b, c)(x) = c(b(a(x))).
-- @type Sequential
local Sequential = Module:extend("Sequential")
nn.Sequential = Sequential

function Sequential:__init(...)
  local mods = table.pack(...)
  if mods.n == 1 and type(mods[1]) == "table" and not is_module(mods[1]) then
    mods = mods[1]
    mods.n = #mods
  end
  for i = 1, mods.n do
    if not is_module(mods[i]) then
      error(fmt("ember.nn.Sequential: expected a module at position %d, got %s", i,
        type(mods[i])), 3)
    end
    self:register_module(tostring(i - 1), mods[i])
  end
end

Sequential.__len = ModuleList.__len
function Sequential:forward(x)
  for _, m in ipairs(self:children()) do x = m(x) end
  return x
end

-- ---------------------------------------------------------------------------
-- layers

local function fmt_float(x)
  -- Python's repr of a small float: 1e-05, 0.1, 10000.0
  local s = fmt("%g", x)
  s = s:gsub("e([-+])0*(%d%d)", "e%1%2")
  if not s:find("[%.e]") and not s:find("inf") and not s:find("nan") then s = s .. ".0" end
  return s
end

--- y = x Wᵀ + b, W (out, in) initialised truncated normal with
-- std sqrt(2/(in+out)) cut at ±3 std; b (out) zeros.
-- @type Linear
-- @tparam integer in_features
-- @tparam integer out_features
-- @tparam[opt] table opts `bias` (default true), `dtype`, `device`
local Linear = Module:extend("Linear")
nn.Linear = Linear

function Linear:__init(in_features, out_features, opts)
  check_positive_int("ember.nn.Linear", "in_features", in_features)
  check_positive_int("ember.nn.Linear", "out_features", out_features)
  opts = check_opts("ember.nn.Linear", opts)
  self.in_features, self.out_features = in_features, out_features
  local std = math.sqrt(2 / (in_features + out_features))
  self.weight = new_param({out_features, in_features}, opts.dtype, opts.device,
    function(t) t:trunc_normal_(0, std, -3 * std, 3 * std) end)
  if opts.bias ~= false then
    self.bias = new_param({out_features}, opts.dtype, opts.device,
      function(t) t:zero_() end)
  end
end

function Linear:forward(x)
  return F.linear(x, self.weight, self.bias)
end

function Linear:extra_repr()
  return fmt("in_features=%d, out_features=%d, bias=%s", self.in_features,
    self.out_features, self.bias ~= nil and "True" or "False")
end

--- A lookup table of n vectors of size d, initialised truncated normal
-- std 1 cut at ±3.
-- @type Embedding
local Embedding = Module:extend("Embedding")
nn.Embedding = Embedding

function Embedding:__init(num_embeddings, embedding_dim, opts)
  check_positive_int("ember.nn.Embedding", "num_embeddings", num_embeddings)
  check_positive_int("ember.nn.Embedding", "embedding_dim", embedding_dim)
  opts = check_opts("ember.nn.Embedding", opts)
  self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
  self.weight = new_param({num_embeddings, embedding_dim}, opts.dtype, opts.device,
    function(t) t:trunc_normal_(0, 1, -3, 3) end)
end

function Embedding:forward(ids)
  return F.embedding(ids, self.weight)
end

function Embedding:extra_repr()
  return fmt("%d, %d", self.num_embeddings, self.embedding_dim)
end

--- x / sqrt(mean(x²) + eps) * weight over the last dim, in f32; weight ones.
-- @type RMSNorm
local RMSNorm = Module:extend("RMSNorm")
nn.RMSNorm = RMSNorm

function RMSNorm:__init(d, opts)
  check_positive_int("ember.nn.RMSNorm", "d", d)
  opts = check_opts("ember.nn.RMSNorm", opts)
  self.d, self.eps = d, opts.eps or 1e-5
  self.weight = new_param({d}, opts.dtype, opts.device, function(t) t:fill_(1) end)
end

function RMSNorm:forward(x)
  return F.rmsnorm(x, self.weight, self.eps)
end

function RMSNorm:extra_repr()
  return fmt("(%d,), eps=%s", self.d, fmt_float(self.eps))
end

--- Rotary position embedding over heads of size d_head (no parameters).
-- forward(x (..., T, d_head), pos) with pos an integer tensor (T), default
-- 0..T-1 on x's device.
-- @type RotaryEmbedding
local RotaryEmbedding = Module:extend("RotaryEmbedding")
nn.RotaryEmbedding = RotaryEmbedding

function RotaryEmbedding:__init(d_head, opts)
  check_positive_int("ember.nn.RotaryEmbedding", "d_head", d_head)
  if d_head % 2 ~= 0 then
    error("ember.nn.RotaryEmbedding: expected an even d_head, got " .. d_head, 3)
  end
  opts = check_opts("ember.nn.RotaryEmbedding", opts)
  self.d_head, self.theta, self.max_len = d_head, opts.theta or 10000, opts.max_len
  self._pos_cache = {}
end

--- Positions 0..T-1 on device, cached per (T, device).
function RotaryEmbedding:positions(T, device)
  if self.max_len and T > self.max_len then
    error(fmt("ember.nn.RotaryEmbedding: sequence length %d exceeds max_len %d", T,
      self.max_len), 2)
  end
  local key = tostring(device) .. "/" .. T
  local pos = self._pos_cache[key]
  if pos == nil then
    pos = F.positions(T, device)
    self._pos_cache[key] = pos
  end
  return pos
end

function RotaryEmbedding:forward(x, pos)
  local shape = x.shape
  if shape[#shape] ~= self.d_head then
    error(fmt("ember.nn.RotaryEmbedding: expected last dim %d (d_head), got shape %s",
      self.d_head, shape_str(shape)), 2)
  end
  pos = pos or self:positions(shape[#shape - 1], x.device)
  return F.rope(x, pos, self.theta)
end

function RotaryEmbedding:extra_repr()
  return fmt("d_head=%d, theta=%s", self.d_head, fmt_float(self.theta))
end

local ATTN_IMPLS = {}
for _, impl in ipairs({"auto", "naive", "flash"}) do
  local opts = {causal = true, impl = impl}
  ATTN_IMPLS[impl] = function(q, k, v) return F.scaled_dot_product_attention(q, k, v, opts) end
end

local function resolve_attn_fn(fname, opts, level)
  if opts.attn_fn ~= nil then
    if type(opts.attn_fn) ~= "function" and not (type(opts.attn_fn) == "table" and
        getmetatable(opts.attn_fn) and getmetatable(opts.attn_fn).__call) then
      error(fmt("%s: expected attn_fn to be a function(q, k, v), got %s", fname,
        type(opts.attn_fn)), level)
    end
    return opts.attn_fn
  end
  local fn = ATTN_IMPLS[opts.attn_impl or "auto"]
  if fn then return fn end
  error(fmt("%s: expected attn_impl 'auto', 'naive' or 'flash', got %s", fname,
    tostring(opts.attn_impl)), level)
end

--- Multi-head causal self-attention with RoPE, no biases. Heads are
-- contiguous slices of d_model. The attention itself is `self.attn_fn(q, k,
-- v)` on (B, H, T, d_head) tensors (swap it to benchmark kernels).
-- @type CausalSelfAttention
-- @tparam integer d_model
-- @tparam integer num_heads
-- @tparam[opt] table opts `rope_theta` (default 10000; false turns RoPE
--   off), `max_len`, `attn_fn` or `attn_impl` ("auto", the default: flash on
--   CUDA in bf16/f16 or autocast, naive elsewhere; "naive"; "flash"), `dtype`, `device`
local CausalSelfAttention = Module:extend("CausalSelfAttention")
nn.CausalSelfAttention = CausalSelfAttention

function CausalSelfAttention:__init(d_model, num_heads, opts)
  local fname = "ember.nn.CausalSelfAttention"
  check_positive_int(fname, "d_model", d_model)
  check_positive_int(fname, "num_heads", num_heads)
  if d_model % num_heads ~= 0 then
    error(fmt("%s: expected d_model divisible by num_heads, got %d and %d", fname, d_model,
      num_heads), 3)
  end
  opts = check_opts(fname, opts)
  self.d_model, self.num_heads, self.d_head = d_model, num_heads, d_model // num_heads
  self.attn_fn = resolve_attn_fn(fname, opts, CTOR_LEVEL)
  local lopts = {bias = false, dtype = opts.dtype, device = opts.device}
  self.q_proj = Linear(d_model, d_model, lopts)
  self.k_proj = Linear(d_model, d_model, lopts)
  self.v_proj = Linear(d_model, d_model, lopts)
  self.output_proj = Linear(d_model, d_model, lopts)
  if opts.rope_theta ~= false then
    self.rope = RotaryEmbedding(self.d_head, {theta = opts.rope_theta or 10000,
      max_len = opts.max_len})
  end
end

--- x (..., T, d_model) -> (..., T, d_model); pos optional (T) positions.
function CausalSelfAttention:forward(x, pos)
  local shape = x.shape
  local nd = #shape
  if nd < 2 or shape[nd] ~= self.d_model then
    error(fmt("ember.nn.CausalSelfAttention: expected input (..., T, %d), got shape %s",
      self.d_model, shape_str(shape)), 2)
  end
  local T, H, dh = shape[nd - 1], self.num_heads, self.d_head
  local split = table.move(shape, 1, nd - 1, 1, {})   -- (..., T)
  split[nd], split[nd + 1] = H, dh                    -- (..., T, H, dh)
  local function heads(t)                             -- -> (..., H, T, dh)
    return t:view(table.unpack(split)):transpose(-3, -2)
  end
  local q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
  local rope = self.rope
  if rope then
    pos = pos or rope:positions(T, x.device)
    q, k = rope(q, pos), rope(k, pos)
  end
  local y = self.attn_fn(q, k, v)                     -- (..., H, T, dh)
  y = y:transpose(-3, -2):reshape(table.unpack(shape))
  return self.output_proj(y)
end

function CausalSelfAttention:extra_repr()
  return fmt("d_model=%d, num_heads=%d", self.d_model, self.num_heads)
end

--- SwiGLU feed-forward: w2(silu(w1 x) ⊙ w3 x), no biases.
-- @type SwiGLU
local SwiGLU = Module:extend("SwiGLU")
nn.SwiGLU = SwiGLU

function SwiGLU:__init(d_model, d_ff, opts)
  check_positive_int("ember.nn.SwiGLU", "d_model", d_model)
  check_positive_int("ember.nn.SwiGLU", "d_ff", d_ff)
  opts = check_opts("ember.nn.SwiGLU", opts)
  local lopts = {bias = false, dtype = opts.dtype, device = opts.device}
  self.w1 = Linear(d_model, d_ff, lopts)
  self.w2 = Linear(d_ff, d_model, lopts)
  self.w3 = Linear(d_model, d_ff, lopts)
end

function SwiGLU:forward(x)
  return self.w2(F.swiglu(self.w1(x), self.w3(x)))
end

--- Pre-norm Transformer block: x + attn(ln1(x)), then x + ffn(ln2(x)).
-- @type TransformerBlock
-- @tparam integer d_model
-- @tparam integer num_heads
-- @tparam integer d_ff
-- @tparam[opt] table opts as CausalSelfAttention's, plus `eps`
local TransformerBlock = Module:extend("TransformerBlock")
nn.TransformerBlock = TransformerBlock

function TransformerBlock:__init(d_model, num_heads, d_ff, opts)
  opts = check_opts("ember.nn.TransformerBlock", opts)
  local nopts = {eps = opts.eps, dtype = opts.dtype, device = opts.device}
  self.ln1 = RMSNorm(d_model, nopts)
  self.attn = CausalSelfAttention(d_model, num_heads, opts)
  self.ln2 = RMSNorm(d_model, nopts)
  self.ffn = SwiGLU(d_model, d_ff, opts)
end

function TransformerBlock:forward(x, pos)
  x = x + self.attn(self.ln1(x), pos)
  return x + self.ffn(self.ln2(x))
end

-- ---------------------------------------------------------------------------
-- the reference TransformerLM

local REQUIRED_CFG = {"vocab_size", "context_length", "d_model", "d_ff", "num_layers",
  "num_heads"}

--- Parameter count of a TransformerLM config, without allocating:
-- 2·V·D (embeddings + lm_head) + L·(4·D² + 3·D·F + 2·D) + D.
-- @tparam table cfg
-- @treturn integer
function nn.count_parameters(cfg)
  for _, k in ipairs(REQUIRED_CFG) do
    if not is_positive_int(cfg[k]) then
      error(fmt("ember.nn.count_parameters: expected cfg.%s to be a positive integer, got %s",
        k, tostring(cfg[k])), 2)
    end
  end
  local V, D, F_, L = cfg.vocab_size, cfg.d_model, cfg.d_ff, cfg.num_layers
  return 2 * V * D + L * (4 * D * D + 3 * D * F_ + 2 * D) + D
end

--- LLaMA-style decoder-only language model with the reference names
-- (token_embeddings, layers.{i}.{ln1,attn,ln2,ffn}, ln_final, lm_head).
-- @type TransformerLM
-- @tparam table cfg vocab_size, context_length, d_model, d_ff, num_layers,
--   num_heads, rope_theta (10000), eps (1e-5); optional attn_fn / attn_impl,
--   dtype, device
local TransformerLM = Module:extend("TransformerLM")
nn.TransformerLM = TransformerLM

function TransformerLM:__init(cfg)
  local fname = "ember.nn.TransformerLM"
  if type(cfg) ~= "table" then
    error(fname .. ": expected a config table (see nn.configs), got " .. type(cfg), 3)
  end
  for _, k in ipairs(REQUIRED_CFG) do
    if not is_positive_int(cfg[k]) then
      error(fmt("%s: expected cfg.%s to be a positive integer, got %s", fname, k,
        tostring(cfg[k])), 3)
    end
  end
  if cfg.d_model % cfg.num_heads ~= 0 or (cfg.d_model // cfg.num_heads) % 2 ~= 0 then
    error(fmt("%s: expected d_model divisible by num_heads with an even head size, " ..
      "got d_model %d and num_heads %d", fname, cfg.d_model, cfg.num_heads), 3)
  end
  local config = {}
  for k, v in pairs(cfg) do config[k] = v end
  config.rope_theta = config.rope_theta or 10000
  self.config = config
  self.vocab_size, self.context_length = cfg.vocab_size, cfg.context_length

  local dev, dt = cfg.device, cfg.dtype
  local bopts = {rope_theta = config.rope_theta, max_len = cfg.context_length,
    attn_fn = resolve_attn_fn(fname, cfg, CTOR_LEVEL), eps = cfg.eps, dtype = dt, device = dev}
  self.token_embeddings = Embedding(cfg.vocab_size, cfg.d_model, {dtype = dt, device = dev})
  local layers = ModuleList()
  for _ = 1, cfg.num_layers do
    layers:append(TransformerBlock(cfg.d_model, cfg.num_heads, cfg.d_ff, bopts))
  end
  self.layers = layers
  self.ln_final = RMSNorm(cfg.d_model, {eps = cfg.eps, dtype = dt, device = dev})
  self.lm_head = Linear(cfg.d_model, cfg.vocab_size, {bias = false, dtype = dt, device = dev})
end

--- ids (..., T) integer -> logits (..., T, vocab_size).
function TransformerLM:forward(ids)
  if not is_tensor(ids) then
    error("ember.nn.TransformerLM: expected token ids as an integer tensor, got " ..
      type(ids), 2)
  end
  local shape = ids.shape
  local T = shape[#shape]
  if #shape < 1 or T > self.context_length then
    error(fmt("ember.nn.TransformerLM: expected ids (..., T) with T <= context_length %d, " ..
      "got shape %s", self.context_length, shape_str(shape)), 2)
  end
  local x = self.token_embeddings(ids)
  local layers = self.layers
  local pos
  for i = 1, #layers do
    local block = layers[i]
    if pos == nil and block.attn.rope then pos = block.attn.rope:positions(T, ids.device) end
    x = block(x, pos)
  end
  return self.lm_head(self.ln_final(x))
end

--- Replace the attention function of every block (e.g. a flash kernel).
-- @param fn function(q, k, v) on (B, H, T, d_head), or "auto" / "naive" / "flash"
-- @return self
function TransformerLM:set_attn_fn(fn)
  local fname = "ember.nn.TransformerLM.set_attn_fn"
  local f = resolve_attn_fn(fname, type(fn) == "string" and {attn_impl = fn} or {attn_fn = fn}, 3)
  for _, m in ipairs(self:modules()) do
    if getmetatable(m) == CausalSelfAttention then m.attn_fn = f end
  end
  return self
end

--- Model sizes: `nn.configs.small{vocab_size = 32000}` returns a config
-- table for nn.TransformerLM (vocab 10000 and context 512 unless
-- overridden). tiny is for fast CPU tests.
nn.configs = {}
local SIZES = {
  tiny = {d_model = 64, d_ff = 192, num_layers = 2, num_heads = 4},
  small = {d_model = 768, d_ff = 3072, num_layers = 12, num_heads = 12},
  medium = {d_model = 1024, d_ff = 4096, num_layers = 24, num_heads = 16},
  large = {d_model = 1280, d_ff = 5120, num_layers = 36, num_heads = 20},
  xl = {d_model = 1600, d_ff = 6400, num_layers = 48, num_heads = 25},
  ["2.7b"] = {d_model = 2560, d_ff = 10240, num_layers = 32, num_heads = 32},
}
--- Size names in increasing order.
nn.config_names = {"tiny", "small", "medium", "large", "xl", "2.7b"}
for name, size in pairs(SIZES) do
  nn.configs[name] = function(overrides)
    if overrides ~= nil and type(overrides) ~= "table" then
      error(fmt("ember.nn.configs.%s: expected an overrides table, got %s", name,
        type(overrides)), 2)
    end
    local cfg = {vocab_size = 10000, context_length = 512, rope_theta = 10000}
    for k, v in pairs(size) do cfg[k] = v end
    for k, v in pairs(overrides or {}) do cfg[k] = v end
    return cfg
  end
end

-- ---------------------------------------------------------------------------
-- utilities

nn.utils = {}

--- Clip gradients so their global L2 norm is at most max_norm.
-- total = sqrt(Σ‖g‖²) over every non-nil grad; when total > max_norm each
-- grad is scaled in place by max_norm / (total + 1e-6).
-- On CUDA nothing crosses to the host (so a captured training step can
-- contain it): the sum of squares is one multi-tensor reduction on the
-- device, the scaling one multi-tensor launch that reads the norm from device
-- memory, and the norm comes back as a 0-d f32 tensor on the device (call
-- :item() to read it, which synchronises). On the CPU it is a number.
-- @param params array of tensors (or a module)
-- @tparam number max_norm
-- @return the total norm before clipping: a number (CPU) or a 0-d tensor (CUDA)
function nn.utils.clip_grad_norm(params, max_norm)
  if is_module(params) then params = params:parameters() end
  if is_tensor(params) then params = {params} end
  if type(params) ~= "table" then
    error("ember.nn.utils.clip_grad_norm: expected an array of tensors, got " ..
      type(params), 2)
  end
  if type(max_norm) ~= "number" or max_norm < 0 then
    error("ember.nn.utils.clip_grad_norm: expected max_norm to be a non-negative number, got " ..
      tostring(max_norm), 2)
  end
  local first
  for _, p in ipairs(params) do
    if core.has_grad(p) then first = p break end
  end
  if first == nil then return 0.0 end
  if first.device ~= "cpu" then
    -- gradients read in C: a Lua handle would keep a dropped gradient alive
    local norm
    no_grad(function() norm = core.clip_param_grads_(params, max_norm) end)
    return norm
  end
  local grads = {}
  for _, p in ipairs(params) do
    local g = p.grad
    if g ~= nil then grads[#grads + 1] = g end
  end
  local total = math.sqrt(core.sum_of_squares(grads):item())
  if total > max_norm then
    local coef = max_norm / (total + 1e-6)
    no_grad(function()
      for _, g in ipairs(grads) do g:mul_(coef) end
    end)
  end
  return total
end
nn.utils.clip_grad_norm_ = nn.utils.clip_grad_norm

-- ember.nn.parallel.DDP and its strategies live in ember/ddp*.lua, loaded on first use
nn.parallel = setmetatable({}, {__index = function(t, k)
  local v = require("ember.ddp")[k]
  if v ~= nil then rawset(t, k, v) end
  return v
end})

return nn
