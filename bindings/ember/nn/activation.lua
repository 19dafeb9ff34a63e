--- ember.nn activation modules (torch/nn/modules/activation.py): GELU.
-- @module ember.nn.activation

local F = require "ember.functional"
local module = require "ember.nn.module"

local CTOR_LEVEL = module.CTOR_LEVEL
local M = {}

--- GELU({approximate = "none" | "tanh"}): F.gelu(x, {approximate = ...}).
-- @type GELU
local GELU = module.Module:extend("GELU")
M.GELU = GELU

function GELU:__init(opts)
  local approx = "none"
  if type(opts) == "string" then approx = opts
  elseif type(opts) == "table" then approx = opts.approximate or "none"
  elseif opts ~= nil then
    error(("ember.nn.GELU: expected an options table, got %s"):format(type(opts)), CTOR_LEVEL)
  end
  if approx ~= "none" and approx ~= "tanh" then
    error(("ember.nn.GELU: expected approximate \"none\" or \"tanh\", got %s"):format(tostring(approx)), CTOR_LEVEL)
  end
  self.approximate = approx
end

function GELU:forward(x)
  return F.gelu(x, {approximate = self.approximate})
end

function GELU:extra_repr()
  return self.approximate == "none" and "" or ("approximate='%s'"):format(self.approximate)
end

return M
