--- DDP strategy "naive": after backward, one blocking all-reduce per parameter.
-- The simplest correct data parallelism, and the slowest: as many collectives
-- as parameters (each pays the launch latency), and none starts before the
-- whole backward is done. Copy this file to write your own strategy.
-- @module ember.ddp_naive

local ddp = require "ember.ddp"
local dist = require "ember.dist"

local Naive = ddp.Strategy:extend("naive")

function Naive:finish_gradient_synchronization()
  for _, p in ipairs(self.params) do
    -- a missing gradient reduces as zeros: every rank makes the same calls
    dist.all_reduce(ddp.grad_or_zeros(p), {op = "avg"})
  end
end

return Naive
