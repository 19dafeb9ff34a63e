--- DDP strategy "overlap": each parameter's all-reduce starts, asynchronously,
-- from its post-accumulate-grad hook, while backward computes the gradients of
-- earlier layers; finish_gradient_synchronization only waits. One collective
-- per parameter (latency paid per tensor) but communication hides behind
-- compute.
--
-- The decision a reader may question: all-reduces start in a fixed order
-- (reverse registration order, roughly the order backward produces them), not
-- in hook order. Collectives must be issued in the same order on every rank,
-- and hook order can differ between ranks (a parameter unused on one rank
-- never fires its hook there). A parameter whose gradient comes late holds
-- back the ones after it; one that never gets a gradient is reduced as zeros
-- at finish.
-- @module ember.ddp_overlap

local ddp = require "ember.ddp"
local dist = require "ember.dist"

local Overlap = ddp.Strategy:extend("overlap")

function Overlap:setup()
  self.order = {}
  for i = #self.params, 1, -1 do self.order[#self.order + 1] = self.params[i] end
  self.ready, self.works, self.next = {}, {}, 1
  for k, p in ipairs(self.order) do
    self:add_hook(p, function()
      if self.ready[k] then
        error("ember.nn.parallel.DDP: a parameter got a second gradient before " ..
          "finish_gradient_synchronization (two backward passes in one step?)")
      end
      self.ready[k] = true
      self:launch_ready()
    end)
  end
end

--- Start the all-reduce of every parameter that is ready, in order.
function Overlap:launch_ready()
  while self.ready[self.next] do
    local p = self.order[self.next]
    self.works[#self.works + 1] = dist.all_reduce(p.grad, {op = "avg", async = true})
    self.next = self.next + 1
  end
end

function Overlap:on_train_batch_start()
  self.ready, self.works, self.next = {}, {}, 1
end

function Overlap:finish_gradient_synchronization()
  -- parameters that got no gradient on this rank reduce as zeros
  for k = self.next, #self.order do
    if not self.ready[k] then
      ddp.grad_or_zeros(self.order[k])
      self.ready[k] = true
    end
  end
  self:launch_ready()
  for _, w in ipairs(self.works) do w:wait() end
  self:on_train_batch_start()      -- ready for the next step even without the call
end

return Overlap
