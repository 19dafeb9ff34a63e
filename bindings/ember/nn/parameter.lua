--- ember.nn parameters: `nn.Parameter`, how layers make theirs, and the weak
-- registry of live parameters that memory history reads.
--
-- A parameter is any leaf tensor with `requires_grad = true`. Layers fill a
-- new one in f32 and then convert, so a seed gives the same values in any
-- dtype (PyTorch's init functions do the same on their own CPU generator).
-- @module ember.nn.parameter

local core = require "ember.core"
local ember = require "ember"
local util = require "ember.util"

local M = {}
local DTYPES, is_tensor = util.DTYPES, util.is_tensor

-- Every registered parameter, weakly: memory history tags their storages
-- "parameter" (and their grads "gradient") when recording starts after they
-- were made (ember.memory reads it as nn._live_parameters). While recording,
-- registering tags at once.
M.live = setmetatable({}, {__mode = "k"})

--- Note p as a live parameter and tag its storage.
function M.note(p)
  M.live[p] = true
  core.mem_tag(p, "parameter")
end

--- Make a leaf parameter: a float tensor of `shape` on `device` with dtype
-- `dtype`, filled by `init(t)` in f32 (so a seed gives the same values in any
-- dtype), requiring grad.
function M.new(shape, dtype, device, init)
  local t = ember.empty(shape, {device = device})
  init(t)
  if dtype ~= nil and DTYPES[dtype] ~= "f32" then t = t:to(dtype) end
  t.requires_grad = true
  return t
end

--- A parameter: `t` as a leaf that requires grad (detached if it had history).
-- @param t float tensor
-- @tparam[opt=true] boolean requires_grad
function M.Parameter(t, requires_grad)
  if not is_tensor(t) then
    error("ember.nn.Parameter: expected a tensor, got " .. type(t), 2)
  end
  if not t.is_leaf then t = t:detach() end
  t.requires_grad = requires_grad ~= false
  return t
end

return M
