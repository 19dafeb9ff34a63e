--- ember.ddp_planner: choose DDP's bucket size from one measured backward,
-- instead of guessing (PyTorch leaves bucket_cap_mb = 25 to the user).
--
--   local planner = require "ember.ddp_planner"
--   local plan = planner.plan_buckets(model, function() return F.cross_entropy(model(x), y) end,
--     {print = true})                    -- ember.dist initialised; every rank calls it
--   local ddp = ember.nn.parallel.DDP(model, {strategy = "bucketed", bucket_mb = plan.suggested_mb})
--
-- Three steps, each usable alone:
--   1. ready_times(model, loss_fn): one backward (after an untimed one) with a
--      post-accumulate-grad hook per trainable parameter. On CUDA each hook
--      records an event on the current stream, so its time is when the GPU
--      finished that gradient, not when the host queued it; times are ms from
--      an event recorded just before backward (after a synchronize). On the
--      CPU the hooks read the host clock (the CPU backend runs synchronously).
--   2. measure_link(opts): all-reduces of a few sizes timed back to back (as
--      scripts/bench_allreduce.lua does), fitted to t = latency + bytes / bandwidth
--      (least squares; the slowest rank's times).
--   3. simulate(timeline, link, bucket_mb, first_bucket_mb): the buckets that
--      ddp_bucketed.lua would build (its own plan function, so the two cannot
--      disagree), each ready when its last gradient is; a bucket's all-reduce
--      starts at max(its ready time, the previous all-reduce's end) (one comm
--      stream: collectives run one after the other) and lasts latency +
--      bytes / bandwidth. Exposed communication = the last all-reduce's end −
--      the end of backward (at least 0): what the step waits for after
--      backward in finish_gradient_synchronization.
-- plan_buckets runs the three over candidate bucket sizes and suggests the
-- one with the least predicted exposed communication (among candidates within
-- 2% or 5 µs of the best, the one with the fewest buckets: fewer calls cost
-- less host time, which the model leaves out).
--
-- What the model leaves out: compute slowed by a concurrent all-reduce (SM
-- and memory contention), the host time of launching collectives, and the
-- copies a strategy makes; bench_ddp.lua --plan prints predicted beside
-- measured exposed communication so the gap is visible.
-- @module ember.ddp_planner

local M = {}

local MiB = 2 ^ 20
local fmt = string.format

M.DEFAULT_CANDIDATES_MB = {1, 2, 5, 10, 25, 50, 100, 250, 1000}

local function on_cuda_device(device) return type(device) == "string" and device:match("^cuda") ~= nil end

-- ---------------------------------------------------------------------------
-- 1. when each gradient is ready

--- One measured backward. `loss_fn()` runs the forward (under autocast if the
-- caller wants) and returns the loss. Returns a timeline {params = {{index =
-- i (registration order), bytes =, numel =, dtype =, device =, ready_ms =}},
-- backward_ms =, device =}. opts: warmup (1 untimed forward+backward first),
-- params (default: the model's trainable parameters).
function M.ready_times(model, loss_fn, opts)
  opts = opts or {}
  local ember = require "ember"
  local params = opts.params
  if params == nil then
    params = {}
    for _, p in ipairs(model:parameters()) do if p.requires_grad then params[#params + 1] = p end end
  end
  if #params == 0 then error("ember.ddp_planner.ready_times: the model has no trainable parameters", 2) end
  local device = params[1].device
  local cuda = on_cuda_device(device)
  local function sync() if cuda then ember.cuda.synchronize() end end
  for _ = 1, opts.warmup or 1 do
    model:zero_grad()
    loss_fn():backward()
  end
  model:zero_grad()
  local loss = loss_fn()
  local events, host, hooks = {}, {}, {}
  for i, p in ipairs(params) do
    if cuda then events[i] = ember.cuda.Event{enable_timing = true} end
    hooks[i] = p:register_post_accumulate_grad_hook(function()
      if cuda then events[i]:record(); host[i] = true else host[i] = ember.core.clock() end
    end)
  end
  sync()
  local start, stop = cuda and ember.cuda.Event{enable_timing = true}, cuda and ember.cuda.Event{enable_timing = true}
  local t0 = ember.core.clock()
  if cuda then start:record() end
  local ok, err = pcall(loss.backward, loss)
  if cuda then stop:record() end
  sync()
  local t1 = ember.core.clock()
  for _, h in ipairs(hooks) do h.remove() end
  if not ok then error(err, 0) end
  local out = {params = {}, device = device,
    backward_ms = cuda and start:elapsed_time(stop) or (t1 - t0) * 1e3}
  for i, p in ipairs(params) do
    local ready
    if cuda then
      ready = host[i] and start:elapsed_time(events[i]) or nil   -- nil: no gradient this step
    else
      ready = host[i] and (host[i] - t0) * 1e3 or nil
    end
    out.params[i] = {index = i, numel = p:numel(), bytes = p:numel() * p:element_size(),
      dtype = p.dtype, device = p.device, ready_ms = ready or out.backward_ms}
  end
  model:zero_grad()
  return out
end

-- ---------------------------------------------------------------------------
-- 2. the link: latency and bandwidth of one all-reduce

--- Least-squares fit of t = latency + bytes / bandwidth over samples
-- {{bytes =, ms =}, ...}: {latency_ms =, bytes_per_ms =} (latency clamped
-- at 0; one sample: the whole time is bandwidth).
function M.fit_link(samples)
  local n, sx, sy, sxx, sxy = #samples, 0, 0, 0, 0
  for _, s in ipairs(samples) do
    sx, sy, sxx, sxy = sx + s.bytes, sy + s.ms, sxx + s.bytes * s.bytes, sxy + s.bytes * s.ms
  end
  local den = n * sxx - sx * sx
  local slope, icept
  if n < 2 or den == 0 then
    slope, icept = sy / sx, 0
  else
    slope = (n * sxy - sx * sy) / den
    icept = (sy - slope * sx) / n
  end
  if slope <= 0 then slope = sy / sx end
  if icept < 0 then icept = 0 end
  return {latency_ms = icept, bytes_per_ms = 1 / slope, samples = samples}
end

--- Time all-reduces of opts.sizes_mb ({1, 4, 16, 64} MiB) on every rank
-- (ember.dist initialised; a collective: every rank calls it) and fit the
-- link. opts: device, dtype ("f32"), warmup (3), iters (10).
function M.measure_link(opts)
  opts = opts or {}
  local ember = require "ember"
  local dist = ember.dist
  local device = opts.device or (ember.cuda.is_available() and "cuda" or "cpu")
  local cuda = on_cuda_device(device)
  local samples = {}
  for _, mb in ipairs(opts.sizes_mb or {1, 4, 16, 64}) do
    local t = ember.zeros({math.max(1, math.floor(mb * MiB / 4))}, {dtype = opts.dtype or "f32", device = device})
    for _ = 1, opts.warmup or 3 do dist.all_reduce(t) end
    dist.barrier()
    local iters = opts.iters or 10
    local ms
    if cuda then
      local e0, e1 = ember.cuda.Event{enable_timing = true}, ember.cuda.Event{enable_timing = true}
      e0:record()
      for _ = 1, iters do dist.all_reduce(t) end
      e1:record()
      e1:synchronize()
      ms = e0:elapsed_time(e1) / iters
    else
      local t0 = ember.core.clock()
      for _ = 1, iters do dist.all_reduce(t) end
      ms = (ember.core.clock() - t0) * 1e3 / iters
    end
    local m = ember.tensor({ms}, {dtype = "f64", device = device})
    dist.all_reduce(m, {op = "max"})
    samples[#samples + 1] = {bytes = t:numel() * t:element_size(), ms = m:item()}
  end
  return M.fit_link(samples)
end

-- ---------------------------------------------------------------------------
-- 3. the simulation

-- A stand-in for a parameter, enough for ddp_bucketed's plan function.
local function fake_param(e)
  return {dtype = e.dtype or "f32", device = e.device or "cpu", index = e.index,
    numel = function() return e.numel or e.bytes end,
    element_size = function() return e.numel and e.bytes / e.numel or 1 end}
end

--- Buckets of a timeline for bucket_mb / first_bucket_mb (ddp_bucketed's
-- rules: reverse registration order, a small first bucket): a list of
-- {bytes =, ready_ms =, params = {index...}}, first to launch first.
function M.buckets(timeline, bucket_mb, first_bucket_mb)
  local plan = require("ember.ddp_bucketed").plan
  local fakes = {}
  for i, e in ipairs(timeline.params) do fakes[i] = fake_param(e) end
  local first = math.min(first_bucket_mb or 1, bucket_mb)
  local out = {}
  for k, b in ipairs(plan(fakes, bucket_mb * MiB, first * MiB)) do
    local ready, idx = 0, {}
    for j, i in ipairs(b.indices) do
      idx[j] = i
      ready = math.max(ready, timeline.params[i].ready_ms)
    end
    out[k] = {bytes = b.bytes, ready_ms = ready, params = idx}
  end
  return out
end

--- Predicted exposed communication (ms) of bucketed DDP with bucket_mb:
-- returns exposed_ms and {buckets = n, comm_ms = sum of all-reduce times,
-- end_ms = last all-reduce's end, schedule = {{start =, finish =, bytes =}}}.
-- timeline: {params = {{bytes, ready_ms, [numel, dtype, device]}...} in
-- registration order, backward_ms}; link: {latency_ms, bytes_per_ms}.
function M.simulate(timeline, link, bucket_mb, first_bucket_mb)
  local buckets = M.buckets(timeline, bucket_mb, first_bucket_mb)
  local prev_end, comm, schedule = 0, 0, {}
  for k, b in ipairs(buckets) do
    local dur = link.latency_ms + b.bytes / link.bytes_per_ms
    local start = math.max(b.ready_ms, prev_end)
    prev_end = start + dur
    comm = comm + dur
    schedule[k] = {start = start, finish = prev_end, bytes = b.bytes, ready = b.ready_ms}
  end
  local bwd = timeline.backward_ms
  if bwd == nil then
    bwd = 0
    for _, e in ipairs(timeline.params) do bwd = math.max(bwd, e.ready_ms) end
  end
  return math.max(0, prev_end - bwd), {buckets = #buckets, comm_ms = comm, end_ms = prev_end,
    schedule = schedule}
end

--- Simulate every candidate; returns {suggested_mb =, candidates = {{bucket_mb
-- =, exposed_ms =, buckets =, comm_ms =}}} (candidates in the given order).
function M.suggest(timeline, link, candidates_mb, first_bucket_mb)
  local rows, best = {}, math.huge
  for i, mb in ipairs(candidates_mb or M.DEFAULT_CANDIDATES_MB) do
    local exposed, info = M.simulate(timeline, link, mb, first_bucket_mb)
    rows[i] = {bucket_mb = mb, exposed_ms = exposed, buckets = info.buckets, comm_ms = info.comm_ms}
    best = math.min(best, exposed)
  end
  local pick
  for _, r in ipairs(rows) do
    if r.exposed_ms <= best * 1.02 + 0.005 and (pick == nil or r.buckets < pick.buckets or
        (r.buckets == pick.buckets and r.exposed_ms < pick.exposed_ms)) then
      pick = r
    end
  end
  return {suggested_mb = pick.bucket_mb, candidates = rows}
end

--- The plan as text: one line per candidate, the suggestion marked.
function M.format(plan)
  local lines = {fmt("bucket plan: backward %.3f ms, link latency %.1f us, bandwidth %.2f GB/s (algbw)",
    plan.timeline and plan.timeline.backward_ms or 0 / 0, (plan.link and plan.link.latency_ms or 0 / 0) * 1e3,
    (plan.link and plan.link.bytes_per_ms or 0 / 0) * 1e3 / 1e9)}
  lines[#lines + 1] = fmt("  %10s %8s %14s %18s", "bucket MB", "buckets", "all-reduce ms", "predicted exposed")
  for _, r in ipairs(plan.candidates) do
    lines[#lines + 1] = fmt("  %10g %8d %14.3f %15.3f ms%s", r.bucket_mb, r.buckets, r.comm_ms, r.exposed_ms,
      r.bucket_mb == plan.suggested_mb and "   <- suggested" or "")
  end
  return table.concat(lines, "\n")
end

--- Measure, fit and simulate: the suggested bucket size for `model`.
-- Every rank must call it (the link measurement is a collective). opts:
-- candidates_mb, first_bucket_mb (1), link (skip measuring: {latency_ms,
-- bytes_per_ms}), link_sizes_mb, warmup, print (print the table on rank 0).
-- Returns {suggested_mb, candidates, timeline, link}.
function M.plan_buckets(model, loss_fn, opts)
  opts = opts or {}
  local ember = require "ember"
  local timeline = M.ready_times(model, loss_fn, {warmup = opts.warmup})
  local link = opts.link or M.measure_link({device = timeline.device, sizes_mb = opts.link_sizes_mb})
  local plan = M.suggest(timeline, link, opts.candidates_mb, opts.first_bucket_mb)
  plan.timeline, plan.link = timeline, link
  if opts.print and (not ember.dist.is_initialized() or ember.dist.rank() == 0) then
    print(M.format(plan))
  end
  return plan
end

return M
