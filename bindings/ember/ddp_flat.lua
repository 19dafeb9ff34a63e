--- DDP strategy "flat": after backward, every gradient is copied into one flat
-- buffer, the buffer is all-reduced once, and the averages are copied back.
-- One collective instead of one per parameter (latency paid once), at the cost
-- of a second copy of the gradients and two copies per step. The buffer is
-- allocated once at wrap time; parameters of another dtype or device get a
-- buffer (and an all-reduce) of their own.
-- @module ember.ddp_flat

local ember = require "ember"
local ddp = require "ember.ddp"
local dist = require "ember.dist"

local Flat = ddp.Strategy:extend("flat")

function Flat:setup()
  -- group parameters by dtype and device: a buffer has one of each
  self.groups = {}
  local by_key = {}
  for _, p in ipairs(self.params) do
    local key = p.dtype .. "|" .. p.device
    local g = by_key[key]
    if g == nil then
      g = {params = {}, numel = 0, dtype = p.dtype, device = p.device}
      by_key[key] = g
      self.groups[#self.groups + 1] = g
    end
    g.params[#g.params + 1] = p
    g.numel = g.numel + p:numel()
  end
  for _, g in ipairs(self.groups) do
    g.buffer = ember.empty({g.numel}, {dtype = g.dtype, device = g.device})
    g.slices = {}
    local off = 0
    for i, p in ipairs(g.params) do
      g.slices[i] = g.buffer:narrow(0, off, p:numel()):view(p.shape)
      off = off + p:numel()
    end
  end
end

function Flat:finish_gradient_synchronization()
  ember.no_grad(function()
    for _, g in ipairs(self.groups) do
      for i, p in ipairs(g.params) do
        local grad = p.grad
        if grad ~= nil then g.slices[i]:copy_(grad) else g.slices[i]:zero_() end
      end
      dist.all_reduce(g.buffer, {op = "avg"})
      for i, p in ipairs(g.params) do
        local grad = p.grad
        if grad ~= nil then grad:copy_(g.slices[i]) else p.grad = g.slices[i]:clone() end
      end
    end
  end)
end

return Flat
