--- ember.util: the small Lua helpers the package shares (nn, optim, init,
-- amp, bench, ...), so each is written once: type tests, option and integer
-- checks, shape strings, dtype names, grad-mode wrappers.
--
-- Internal to the package (not part of the documented API). It needs only
-- `ember.core`, so any file may require it while `ember` itself is loading;
-- and only the tensor and grad-mode helpers need that, so the pure-Lua sweep
-- tools use the rest where no core.so is built.
-- Error levels: `level` is what error() receives, counted from the helper
-- (1 the helper, 2 its caller, 3 the caller's caller, ...).
-- @module ember.util

local has_core, core = pcall(require, "ember.core")
if not has_core then core = {} end

local M = {}
local fmt = string.format
M.fmt = fmt

-- ---------------------------------------------------------------------------
-- types

local core_is_tensor = core.is_tensor

--- True when v is an Ember tensor.
function M.is_tensor(v)
  return type(v) == "userdata" and core_is_tensor(v)
end

--- True for functions and for values whose metatable has __call.
function M.is_callable(f)
  if type(f) == "function" then return true end
  local mt = getmetatable(f)
  return type(mt) == "table" and mt.__call ~= nil
end

function M.is_positive_int(v)
  return math.type(v) == "integer" and v > 0
end

-- ---------------------------------------------------------------------------
-- argument checks ("fname: expected ..., got ...")

--- opts, or {} when nil; anything but a table is an error.
function M.check_opts(fname, opts, level)
  if opts ~= nil and type(opts) ~= "table" then
    error(fmt("%s: expected an options table, got %s", fname, type(opts)), level)
  end
  return opts or {}
end

function M.check_positive_int(fname, argname, v, level)
  if not M.is_positive_int(v) then
    error(fmt("%s: expected %s to be a positive integer, got %s", fname, argname,
      tostring(v)), level)
  end
end

-- ---------------------------------------------------------------------------
-- shapes, tables, numbers

--- "[2, 3]" for a shape array (PyTorch's wording in error messages).
function M.shape_str(shape)
  local parts = {}
  for i, s in ipairs(shape) do parts[i] = tostring(s) end
  return "[" .. table.concat(parts, ", ") .. "]"
end

function M.same_shape(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

--- The keys of t, sorted: numbers first, then the rest in `<` order.
function M.sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks, function(a, b)
    if type(a) == type(b) then return a < b end
    return type(a) == "number"
  end)
  return ks
end

--- A one-level copy of a table (other values as they are).
function M.copy_value(v)
  if type(v) ~= "table" then return v end
  local c = {}
  for k, x in pairs(v) do c[k] = x end
  return c
end

--- Python's repr of a float: 1e-05, 0.1, 10000.0 (module reprs match PyTorch's).
function M.float_repr(x)
  local s = fmt("%g", x)
  s = s:gsub("e([-+])0*(%d%d)", "e%1%2")
  if not s:find("[%.e]") and not s:find("inf") and not s:find("nan") then s = s .. ".0" end
  return s
end

-- ---------------------------------------------------------------------------
-- dtypes

--- dtype names and the aliases the core accepts, mapped to canonical names.
M.DTYPES = {
  f32 = "f32", float32 = "f32", float = "f32", f64 = "f64", float64 = "f64", double = "f64",
  bf16 = "bf16", bfloat16 = "bf16", f16 = "f16", float16 = "f16", half = "f16",
  i32 = "i32", int32 = "i32", int = "i32", i64 = "i64", int64 = "i64", long = "i64",
  u16 = "u16", uint16 = "u16", u8 = "u8", uint8 = "u8", byte = "u8", bool = "bool",
}
M.FLOAT_DTYPES = {f32 = true, f64 = true, bf16 = true, f16 = true}

-- ---------------------------------------------------------------------------
-- grad mode

local set_grad_enabled = core.set_grad_enabled

--- Run fn(...) with autograd recording switched on/off; restores the mode on error.
local function with_grad_mode(on, fn, ...)
  local prev = set_grad_enabled(on)
  local res = table.pack(pcall(fn, ...))
  set_grad_enabled(prev)
  if not res[1] then error(res[2], 0) end
  return table.unpack(res, 2, res.n)
end
-- A full collection costs about a millisecond; 64 MiB of device memory is
-- worth it (a gradient someone read from Lua, e.g. for logging).
local STRANDED_GC_BYTES = 64 * 2 ^ 20

--- Reset the gradients of params (nil, or zeros in place when set_to_none
-- is false) in one C call, never reading one into Lua: a Lua handle would
-- keep a dropped gradient's memory alive until the next collection. Dropped
-- device gradients that a handle still references come back only when the
-- handle is collected: past 64 MiB of them, collect now, before the next
-- forward. Returns those bytes. (Module:zero_grad, Optimizer:zero_grad.)
function M.zero_grads(params, set_to_none)
  local stranded = core.zero_grad_(params, set_to_none ~= false)
  if stranded >= STRANDED_GC_BYTES then collectgarbage() end
  return stranded
end

function M.no_grad(fn, ...) return with_grad_mode(false, fn, ...) end
function M.enable_grad(fn, ...) return with_grad_mode(true, fn, ...) end

-- ---------------------------------------------------------------------------
-- JSON that round-trips numbers exactly

-- lua-cjson writes 14 significant digits (0.1 + 0.2 comes back as 0.3) and
-- large integers as floats; logs whose losses are compared bit for bit and
-- checkpoints whose learning rates must survive a resume need all 17.
local function json_value(v, depth, out, key_order)
  local t = type(v)
  if t == "number" then
    if math.type(v) == "integer" then out[#out + 1] = fmt("%d", v)
    elseif v ~= v then out[#out + 1] = '"nan"'
    elseif v == math.huge then out[#out + 1] = '"inf"'
    elseif v == -math.huge then out[#out + 1] = '"-inf"'
    else
      local s = fmt("%.15g", v)                  -- the shortest of 15..17 digits that reads back as v
      if tonumber(s) ~= v then s = fmt("%.16g", v) end
      if tonumber(s) ~= v then s = fmt("%.17g", v) end
      out[#out + 1] = s
    end
  elseif t == "string" then
    out[#out + 1] = (require("cjson").encode(v):gsub("\\/", "/"))   -- cjson escapes every "/"
  elseif t == "boolean" then
    out[#out + 1] = tostring(v)
  elseif t == "table" then
    if depth > 32 then error("ember.util.json_encode: tables nested deeper than 32", 0) end
    local n = #v
    if n > 0 or next(v) == nil and getmetatable(v) == M.ARRAY then
      out[#out + 1] = "["
      for i = 1, n do
        if i > 1 then out[#out + 1] = "," end
        json_value(v[i], depth + 1, out)
      end
      out[#out + 1] = "]"
      return
    end
    local keys, seen = {}, {}
    for _, k in ipairs(key_order or {}) do
      if v[k] ~= nil then keys[#keys + 1] = k; seen[k] = true end
    end
    local rest = {}
    for k in pairs(v) do
      if not seen[k] then rest[#rest + 1] = tostring(k) end
    end
    table.sort(rest)
    for _, k in ipairs(rest) do keys[#keys + 1] = k end
    out[#out + 1] = "{"
    for i, k in ipairs(keys) do
      if i > 1 then out[#out + 1] = "," end
      out[#out + 1] = require("cjson").encode(k)
      out[#out + 1] = ":"
      local x = v[k]
      if x == nil then x = v[math.tointeger(tonumber(k))] end
      json_value(x, depth + 1, out)
    end
    out[#out + 1] = "}"
  elseif v == nil then
    out[#out + 1] = "null"
  else
    error("ember.util.json_encode: cannot encode a " .. t, 0)
  end
end

--- Mark an empty table as a JSON array ([] rather than {}).
M.ARRAY = {}

--- v as JSON text: numbers with up to 17 significant digits (the fewest
-- that read back exactly), integers whole, NaN/inf as strings, object keys sorted after those
-- listed in key_order (top level only).
function M.json_encode(v, key_order)
  local out = {}
  json_value(v, 0, out, key_order)
  return table.concat(out)
end

-- ---------------------------------------------------------------------------
-- Ctrl-C at a point of the script's choosing

-- The `ember` executable turns SIGINT into the error "interrupted!" at the
-- next Lua instruction (bindings/cli/cli_state.c). While the registry field
-- below is true it records the Ctrl-C instead, and a loop reads it where
-- stopping is safe (between training steps). A stock lua5.4 ignores the
-- field and raises at once; a second Ctrl-C always ends the process.
local DEFER, PENDING = "ember.defer_interrupt", "ember.interrupt_pending"

--- defer_interrupts(true): Ctrl-C is recorded, not raised; (false): raised
-- again, at once if one was recorded meanwhile and not taken.
function M.defer_interrupts(on)
  local reg = debug.getregistry()
  reg[DEFER] = on and true or nil
  if not on and reg[PENDING] then
    reg[PENDING] = nil
    error("interrupted!", 0)
  end
end

--- True (once) when a Ctrl-C was recorded since the last call.
function M.take_interrupt()
  local reg = debug.getregistry()
  local pending = reg[PENDING] == true
  -- clear only what was read: the hook that records a Ctrl-C can run between
  -- any two instructions, and clearing unconditionally lost one that landed
  -- after the read (a loop polling this spun forever)
  if pending then reg[PENDING] = nil end
  return pending
end

return M
