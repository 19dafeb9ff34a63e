-- A DDP strategy of your own: gradients travel in bf16 (half the bytes of f32),
-- averaged in one all-reduce, then copied back into the f32 gradients.
--   ember launch --nproc 2 examples/custom_ddp.lua
local ember = require "ember"
local nn, optim, dist = ember.nn, ember.optim, ember.dist
local ddp = require "ember.ddp"          -- ddp.Strategy: wrap-time broadcast, forward, state_dict

local Bf16 = ddp.Strategy:extend("bf16")
function Bf16:setup()                    -- self.params: trainable, tied ones once
  local n = 0
  for _, p in ipairs(self.params) do n = n + p:numel() end
  self.wire = ember.zeros({n}, {dtype = "bf16", device = self.params[1].device})
end
function Bf16:finish_gradient_synchronization()
  local off, slices = 0, {}
  for i, p in ipairs(self.params) do
    slices[i] = self.wire:narrow(0, off, p:numel()):view(p.shape)
    slices[i]:copy_(ddp.grad_or_zeros(p))            -- f32 -> bf16 (no grad: zeros)
    off = off + p:numel()
  end
  dist.all_reduce(self.wire, {op = "avg"})
  for i, p in ipairs(self.params) do p.grad:copy_(slices[i]) end   -- bf16 -> f32
end

dist.init()
ember.manual_seed(dist.rank())           -- ranks start apart: the wrap broadcasts rank 0's weights
local model = nn.Sequential(nn.Linear(16, 64), nn.Linear(64, 1))
local net = nn.parallel.DDP(model, {strategy = Bf16})
local opt = optim.AdamW(model:parameters(), {lr = 1e-2})
for step = 1, 30 do
  ember.manual_seed(1000 * step + dist.rank())        -- each rank its own slice of data
  local x = ember.randn(32, 16)
  opt:zero_grad(); net:on_train_batch_start()
  local loss = (net(x) - x:sum(1, {keepdim = true})):pow(2):mean()
  loss:backward(); net:finish_gradient_synchronization(); opt:step()
  if dist.rank() == 0 and step % 10 == 0 then print(("step %d  loss %.4f"):format(step, loss:item())) end
end
local w, hi = model:parameters()[1], model:parameters()[1]:clone()
dist.all_reduce(hi, {op = "max"})                    -- every rank holds the same weights
if dist.rank() == 0 then print("ranks agree: " .. tostring((hi - w):abs():max():item() == 0)) end
dist.destroy()
