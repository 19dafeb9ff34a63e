--- ember.nn.parallel: DDP and its strategies (ember/ddp*.lua), loaded on
-- first use, so `require "ember.nn"` costs nothing when no one trains on
-- several ranks: `nn.parallel.DDP` is ember.ddp's DDP.
-- @module ember.nn.parallel

return setmetatable({}, {__index = function(t, k)
  local v = require("ember.ddp")[k]
  if v ~= nil then rawset(t, k, v) end
  return v
end})
