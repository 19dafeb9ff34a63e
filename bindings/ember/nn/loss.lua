--- ember.nn loss modules (torch/nn/modules/loss.py): MSELoss, L1Loss,
-- NLLLoss, BCEWithLogitsLoss, CrossEntropyLoss. Each keeps its options and
-- calls its F.* function: loss_fn(input, target). Class weights are buffers
-- (they follow m:to() and appear in state_dict, as in PyTorch).
-- @module ember.nn.loss

local F = require "ember.functional"
local util = require "ember.util"
local module = require "ember.nn.module"

local CTOR_LEVEL = module.CTOR_LEVEL
local M = {}

-- A loss class named `name` calling F[fname] with the options in `keys`
-- (tensor-valued ones in `buffers`).
local function loss_class(name, fname, keys, buffers)
  local cls = module.Module:extend(name)
  local allowed = {}
  for _, k in ipairs(keys) do allowed[k] = true end
  function cls:__init(opts)
    opts = util.check_opts("ember.nn." .. name, opts, CTOR_LEVEL)
    for k in pairs(opts) do
      if not allowed[k] then
        error(("ember.nn.%s: unknown option '%s' (expected %s)"):format(name, tostring(k), table.concat(keys, ", ")),
          CTOR_LEVEL)
      end
    end
    local r = opts.reduction or "mean"
    if r ~= "mean" and r ~= "sum" and r ~= "none" then
      error(("ember.nn.%s: expected reduction \"mean\", \"sum\" or \"none\", got %s"):format(name, tostring(r)),
        CTOR_LEVEL)
    end
    self.reduction = r
    for _, k in ipairs(keys) do
      if k ~= "reduction" then
        if buffers[k] then
          if opts[k] ~= nil then self:register_buffer(k, opts[k]) end
        else
          self[k] = opts[k]
        end
      end
    end
  end
  function cls:forward(input, target)
    local o = {reduction = self.reduction}
    for _, k in ipairs(keys) do
      if k ~= "reduction" then
        if buffers[k] then o[k] = self._buffers[k] else o[k] = rawget(self, k) end
      end
    end
    return F[fname](input, target, o)
  end
  function cls:extra_repr() return "" end
  M[name] = cls
  return cls
end

loss_class("MSELoss", "mse_loss", {"reduction"}, {})
loss_class("L1Loss", "l1_loss", {"reduction"}, {})
loss_class("NLLLoss", "nll_loss", {"weight", "ignore_index", "reduction"}, {weight = true})
loss_class("BCEWithLogitsLoss", "binary_cross_entropy_with_logits", {"weight", "pos_weight", "reduction"},
  {weight = true, pos_weight = true})
loss_class("CrossEntropyLoss", "cross_entropy", {"ignore_index", "label_smoothing", "reduction"}, {})

return M
