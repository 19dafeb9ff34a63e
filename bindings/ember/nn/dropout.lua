--- ember.nn.Dropout (torch/nn/modules/dropout.py): F.dropout(x, p, self.training),
-- so m:train() draws masks and m:eval() passes x through unchanged.
-- @module ember.nn.dropout

local F = require "ember.functional"
local util = require "ember.util"
local module = require "ember.nn.module"

local CTOR_LEVEL = module.CTOR_LEVEL

--- Zero each element with probability p while training, scaling the rest by 1/(1-p).
-- @type Dropout
local Dropout = module.Module:extend("Dropout")

function Dropout:__init(p)
  p = p == nil and 0.5 or p
  if type(p) ~= "number" or not (p >= 0 and p <= 1) then
    error(("ember.nn.Dropout: expected p in [0, 1], got %s"):format(tostring(p)), CTOR_LEVEL)
  end
  self.p = p
end

function Dropout:forward(x)
  return F.dropout(x, self.p, self.training)
end

function Dropout:extra_repr()
  return "p=" .. util.float_repr(self.p)
end

return Dropout
