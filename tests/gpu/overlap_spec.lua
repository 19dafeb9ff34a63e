-- overlap_spec.lua (GPU) — AdamW overlapped with backward on CUDA
-- (ember/optim_overlap.lua): the updates run on a side stream forked from
-- the main one by an event after each bucket's gradients, joined at
-- opt:step(). Checked bit for bit against the plain step on CUDA: eager
-- (f32 and autocast bf16 with shadow weights, one launch per parameter and
-- buckets, the side stream and inline), gradient accumulation, clip =
-- "exact", and a whole step captured with ember.cuda.graph and replayed;
-- free_grads the same ways, and its peak against keeping the gradients. The
-- CPU side (and the clipping references) is tests/lua/overlap_spec.lua.
local ember = require "ember"
local nn, F = ember.nn, ember.nn.functional
local core = ember.core

local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "compare.lua")
local same_bits = C.assert_same_bits

-- big enough that an update on the side stream is still running while the
-- main stream goes on: a missing fork or join shows as different bits
local D, HID, V, B = 512, 2048, 4096, 256

local function model()
  ember.manual_seed(7)
  local m = {fc1 = nn.Linear(D, HID, {device = "cuda"}), fc2 = nn.Linear(HID, HID, {device = "cuda"}),
             fc3 = nn.Linear(HID, V, {device = "cuda"})}
  m.norm = ember.ones({HID}):to("cuda")
  m.norm.requires_grad = true
  m.params = {m.fc1.weight, m.fc1.bias, m.fc2.weight, m.fc2.bias, m.fc3.weight, m.fc3.bias, m.norm}
  return m
end

local function data(k)
  ember.manual_seed(100 + k)
  return ember.randn({B, D}):to("cuda"), ember.randint(0, V, {B}):to("cuda")
end

local function forward(m, x, y, dtype)
  local function f()
    local h = F.rmsnorm(F.silu(m.fc1(x)), m.norm)
    return F.cross_entropy(m.fc3(F.silu(m.fc2(h))), y)
  end
  if dtype then return ember.autocast(dtype, f) end
  return f()
end

-- o: overlap, dtype, bucket_mb, side_stream, micro, max_norm, clip, graph, steps
local function train(o)
  local m = model()
  local opt = ember.optim.AdamW(m.params, {lr = 1e-3, weight_decay = 0.1, overlap_bucket_mb = o.bucket_mb})
  local batches = {}
  for k = 1, (o.micro or 1) do batches[k] = {data(k)} end
  local function step()
    opt:zero_grad()
    local micro = o.micro or 1
    local last
    for k = 1, micro do
      local loss = forward(m, batches[k][1], batches[k][2], o.dtype)
      if micro > 1 then loss = loss / micro end
      if o.overlap and k == micro then
        opt:step_in_backward{max_norm = o.max_norm, clip = o.clip, side_stream = o.side_stream,
          free_grads = o.free_grads}
      end
      loss:backward()
      last = loss
    end
    if not o.overlap and o.max_norm then nn.utils.clip_grad_norm(m.params, o.max_norm) end
    opt:step()
    return last
  end
  local losses = {}
  local steps = o.steps or 5
  if o.graph then
    for s = 1, 2 do losses[s] = step():item() end        -- eager warm-up: state, shadows, streams exist
    opt:zero_grad()
    local loss
    local g = ember.cuda.graph(function() loss = step() end, {warmup = 0})
    for s = 3, steps do
      g:replay()
      ember.cuda.synchronize()
      losses[s] = loss:item()
    end
    g:close()
  else
    for s = 1, steps do losses[s] = step():item() end
  end
  ember.cuda.synchronize()
  return {losses = losses, m = m, opt = opt}
end

local function same_training(a, b)
  assert.are.same(b.losses, a.losses)
  for i, p in ipairs(a.m.params) do same_bits(p, b.m.params[i], "param " .. i) end
  for i, p in ipairs(a.m.params) do
    local sa, sb = a.opt.state[p], b.opt.state[b.m.params[i]]
    same_bits(sa.exp_avg, sb.exp_avg, "exp_avg " .. i)
    same_bits(sa.exp_avg_sq, sb.exp_avg_sq, "exp_avg_sq " .. i)
    same_bits(sa.step, sb.step, "step " .. i)
  end
end

describe("AdamW step_in_backward on CUDA", function()
  assert.is_true(ember.cuda.is_available(), "the GPU specs need a CUDA device")

  local plain_f32, plain_bf16
  setup(function()
    plain_f32 = train {overlap = false}
    plain_bf16 = train {overlap = false, dtype = "bf16"}
  end)

  for _, case in ipairs {
    {name = "f32, one launch per parameter, side stream", bucket_mb = 0},
    {name = "f32, 8 MiB buckets, side stream", bucket_mb = 8},
    {name = "f32, one launch per parameter, inline (side_stream = false)", bucket_mb = 0, side_stream = false},
    {name = "autocast bf16 with shadow weights, side stream", bucket_mb = 0, dtype = "bf16"},
    {name = "free_grads, f32, one launch per parameter, side stream", bucket_mb = 0, free_grads = true},
    {name = "free_grads, f32, one launch per parameter, inline", bucket_mb = 0, side_stream = false, free_grads = true},
    {name = "free_grads, autocast bf16, 8 MiB buckets, side stream", bucket_mb = 8, dtype = "bf16", free_grads = true},
  } do
    it(case.name .. ": the bits of the plain step", function()
      local over = train(setmetatable({overlap = true}, {__index = case}))
      same_training(over, case.dtype and plain_bf16 or plain_f32)
      if case.side_stream ~= false then
        assert.is_truthy(over.opt._sides and over.opt._sides["cuda:0"], "the side stream was used")
      end
      assert.is_nil(over.opt._joins, "joined at step()")
      for i, p in ipairs(over.m.params) do
        assert.are.equal(not case.free_grads, core.has_grad(p), "param " .. i .. " has a gradient after step()")
      end
      if case.dtype then
        same_bits(core.shadow_weight(over.m.fc1.weight), over.m.fc1.weight:to(case.dtype), "shadow = cast")
      end
    end)
  end

  it("gradient accumulation over 2 micro-batches (armed before the second): the bits of the plain step", function()
    same_training(train {overlap = true, micro = 2, bucket_mb = 0}, train {overlap = false, micro = 2})
  end)

  it("clip = \"exact\": the bits of clip_grad_norm + step", function()
    same_training(train {overlap = true, max_norm = 0.5, bucket_mb = 0}, train {overlap = false, max_norm = 0.5})
  end)

  it("a captured step (ember.cuda.graph) replays with the bits of eager plain training", function()
    same_training(train {overlap = true, graph = true, bucket_mb = 0, steps = 6}, train {overlap = false, steps = 6})
    same_training(train {overlap = true, graph = true, bucket_mb = 8, dtype = "bf16", steps = 6},
      train {overlap = false, dtype = "bf16", steps = 6})
  end)

  it("free_grads in a captured step (events and waits captured) replays with the bits of eager plain training",
    function()
    same_training(train {overlap = true, graph = true, bucket_mb = 0, dtype = "bf16", free_grads = true, steps = 6},
      train {overlap = false, dtype = "bf16", steps = 6})
  end)

  it("free_grads: the step's peak drops by most of the gradients (8 layers, side stream and inline)", function()
    -- 8 square layers of 4 MiB of f32 gradient each: kept, all 32 MiB are alive at the end of
    -- backward; dropped, at most FREE_LAG + 1 = 3 layers' (side stream) or one (inline), plus ~4 MiB
    -- of activations; the bounds leave a layer's worth of slack
    local L, W = 8, 1024
    local function peak(o)
      ember.manual_seed(3)
      local layers, params = {}, {}
      for i = 1, L do
        layers[i] = nn.Linear(W, W, {bias = false, device = "cuda"})
        params[i] = layers[i].weight
      end
      local opt = ember.optim.AdamW(params, {lr = 1e-3, overlap_bucket_mb = 0})
      local x = ember.randn({64, W}):to("cuda")
      local function step()
        opt:zero_grad()
        local h = x
        for i = 1, L do h = F.silu(layers[i](h)) end
        local loss = h:square():mean()
        opt:step_in_backward{side_stream = o.side_stream, free_grads = o.free_grads}
        loss:backward()
        opt:step()
      end
      step()
      opt:zero_grad()
      collectgarbage()
      ember.cuda.synchronize()
      ember.cuda.reset_peak_memory_stats()
      local base = ember.cuda.memory_allocated()
      step()
      ember.cuda.synchronize()
      return ember.cuda.max_memory_allocated() - base
    end
    local layer = W * W * 4
    local kept = peak {free_grads = false}
    local side = peak {free_grads = true}
    local inline = peak {free_grads = true, side_stream = false}
    assert.is_true(kept >= L * layer, ("kept: %.1f MiB"):format(kept / 2 ^ 20))
    assert.is_true(side <= kept - (L - 5) * layer, ("side stream: %.1f MiB against %.1f kept"):format(side / 2 ^ 20,
      kept / 2 ^ 20))
    assert.is_true(inline <= kept - (L - 3) * layer, ("inline: %.1f MiB against %.1f kept"):format(inline / 2 ^ 20,
      kept / 2 ^ 20))
  end)

  it("clip = \"previous\" captured (device-side norms, no host sync) replays with the bits of eager", function()
    -- max_norm far below the gradient norm (3e-4 at step 5 on the H100, 2026-11-27), so every step clips
    local max_norm = 1e-6
    local eager = train {overlap = true, bucket_mb = 0, max_norm = max_norm, clip = "previous", steps = 5}
    local graph = train {overlap = true, graph = true, bucket_mb = 0, max_norm = max_norm, clip = "previous", steps = 5}
    same_training(graph, eager)
    local n = graph.opt:grad_norm()
    assert.are.equal("cuda:0", n.device)
    assert.is_true(n:item() > max_norm, "the clip was active: norm " .. n:item())
    -- and it is not the exact clip
    local exact = train {overlap = true, bucket_mb = 0, max_norm = max_norm, steps = 5}
    assert.are_not.same(exact.losses, eager.losses)
  end)
end)
