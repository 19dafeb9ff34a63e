--- DDP strategy "bucketed" (what PyTorch's DistributedDataParallel does):
-- parameters are grouped into buckets of about bucket_mb; each bucket owns one
-- flat gradient buffer and every p.grad is a VIEW into it, so backward
-- accumulates straight into the buffer (Ember adds into an existing .grad in
-- place) and no copy is ever made. When the last gradient of a bucket lands,
-- its async all-reduce starts; finish_gradient_synchronization only waits.
-- Few collectives (latency paid per bucket) that overlap with backward.
--
-- Buckets are filled in reverse registration order (roughly the order
-- backward produces gradients), and the first one is small (first_bucket_mb,
-- 1 MiB by default, as PyTorch) so communication starts early. A bucket holds
-- parameters while their total stays within its cap; a parameter larger than
-- the cap gets a bucket of its own; a dtype or device change starts a new one.
-- Buckets are launched in order, so every rank issues the same collectives in
-- the same order even when a parameter is unused on one rank (its bucket then
-- waits for finish, where the missing gradient counts as zeros).
-- @module ember.ddp_bucketed

local ember = require "ember"
local ddp = require "ember.ddp"

local Bucketed = ddp.Strategy:extend("bucketed")

local MiB = 2 ^ 20

--- Plan buckets: params (registration order) -> array of buckets, first to
-- launch first, each {params = {...}, indices = {i...}, bytes =, numel =,
-- dtype =, device =}; indices point into params.
-- @param params array of tensors
-- @tparam number bucket_bytes cap of every bucket but the first
-- @tparam number first_bucket_bytes cap of the first bucket
function Bucketed.plan(params, bucket_bytes, first_bucket_bytes)
  local buckets, cur = {}, nil
  local function cap() return #buckets == 0 and first_bucket_bytes or bucket_bytes end
  local function close()
    if cur then buckets[#buckets + 1] = cur end
    cur = nil
  end
  for i = #params, 1, -1 do
    local p = params[i]
    local bytes = p:numel() * p:element_size()
    if cur and (cur.dtype ~= p.dtype or cur.device ~= p.device or cur.bytes + bytes > cap()) then
      close()
    end
    cur = cur or {params = {}, indices = {}, bytes = 0, numel = 0, dtype = p.dtype,
      device = p.device}
    cur.params[#cur.params + 1] = p
    cur.indices[#cur.indices + 1] = i
    cur.bytes, cur.numel = cur.bytes + bytes, cur.numel + p:numel()
    if cur.bytes >= cap() then close() end
  end
  close()
  return buckets
end

function Bucketed:setup(opts)
  local bucket_mb = opts.bucket_mb or 25
  local first_mb = math.min(opts.first_bucket_mb or 1, bucket_mb)
  self.buckets = Bucketed.plan(self.params, bucket_mb * MiB, first_mb * MiB)
  ember.no_grad(function()
    for bi, b in ipairs(self.buckets) do
      b.buffer = ember.zeros({b.numel}, {dtype = b.dtype, device = b.device})
      b.views, b.ready, b.pending = {}, {}, #b.params
      local off = 0
      for j, p in ipairs(b.params) do
        local view = b.buffer:narrow(0, off, p:numel()):view(p.shape)
        off = off + p:numel()
        b.views[j] = view
        local g = p.grad
        if g ~= nil then view:copy_(g) end        -- keep a gradient the model already has
        p.grad = view
        self:add_hook(p, function(param) self:grad_ready(bi, j, param) end)
      end
    end
  end)
  self.next = 1            -- the next bucket to launch
end

-- Make p.grad the bucket view again if something replaced it (zero_grad with
-- set_to_none, or a gradient made before the view was set): copy its value in.
local function adopt(view, p)
  local g = p.grad
  if g == nil then
    view:zero_()
  elseif g:data_ptr() ~= view:data_ptr() then
    view:copy_(g)
  else
    return
  end
  p.grad = view
end

--- Inside no_sync: keep the accumulated gradient in its bucket view.
function Bucketed:unsynced_grad(p)
  for _, b in ipairs(self.buckets) do
    for j, q in ipairs(b.params) do
      if q == p then ember.no_grad(adopt, b.views[j], p) return end
    end
  end
end

--- Hook: gradient j of bucket bi is complete.
function Bucketed:grad_ready(bi, j, p)
  local b = self.buckets[bi]
  if b.ready[j] then
    error("ember.nn.parallel.DDP: a parameter got a second gradient before " ..
      "finish_gradient_synchronization (two backward passes in one step?)")
  end
  ember.no_grad(adopt, b.views[j], p)
  b.ready[j] = true
  b.pending = b.pending - 1
  if b.pending == 0 then self:launch_ready() end
end

--- Start the all-reduce of every complete bucket, in order.
function Bucketed:launch_ready()
  local dist = require "ember.dist"
  while self.buckets[self.next] and self.buckets[self.next].pending == 0 do
    local b = self.buckets[self.next]
    b.work = dist.all_reduce(b.buffer, {op = "avg", async = true})
    self.next = self.next + 1
  end
end

--- Reset per-step state and point every p.grad at its bucket view (a
-- gradient dropped by zero_grad comes back as zeros in the view).
function Bucketed:on_train_batch_start()
  ember.no_grad(function()
    for _, b in ipairs(self.buckets) do
      if b.work then b.work:wait(); b.work = nil end
      local all_dropped = true           -- the usual case after opt:zero_grad()
      for _, p in ipairs(b.params) do
        if p.grad ~= nil then all_dropped = false; break end
      end
      if all_dropped then
        b.buffer:zero_()                 -- one fill per bucket, not one per parameter
        for j, p in ipairs(b.params) do p.grad = b.views[j] end
      else
        for j, p in ipairs(b.params) do adopt(b.views[j], p) end
      end
      b.ready, b.pending = {}, #b.params
    end
  end)
  self.next = 1
end

function Bucketed:finish_gradient_synchronization()
  ember.no_grad(function()
    for _, b in ipairs(self.buckets) do
      -- parameters that got no gradient on this rank: zeros (or what the view holds)
      for j, p in ipairs(b.params) do
        if not b.ready[j] then adopt(b.views[j], p); b.ready[j] = true end
      end
      b.pending = 0
    end
  end)
  self:launch_ready()
  for _, b in ipairs(self.buckets) do b.work:wait(); b.work = nil end
  for _, b in ipairs(self.buckets) do b.ready, b.pending = {}, #b.params end
  self.next = 1
end

--- The bucket plan as parameter names, first bucket first (for logs and tests).
function Bucketed:bucket_names()
  local name_of = {}
  for _, np in ipairs(self.module:named_parameters()) do name_of[np[2]] = np[1] end
  local out = {}
  for i, b in ipairs(self.buckets) do
    out[i] = {}
    for j, p in ipairs(b.params) do out[i][j] = name_of[p] end
  end
  return out
end

return Bucketed
