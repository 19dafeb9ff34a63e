--- ember.nn.utils: gradient clipping (torch/nn/utils/clip_grad.py).
-- @module ember.nn.utils

local core = require "ember.core"
local util = require "ember.util"
local module = require "ember.nn.module"

local is_tensor, no_grad, is_module = util.is_tensor, util.no_grad, module.is_module
local M = {}

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
function M.clip_grad_norm(params, max_norm)
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
M.clip_grad_norm_ = M.clip_grad_norm

return M
