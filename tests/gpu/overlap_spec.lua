-- overlap_spec.lua (GPU) — AdamW overlapped with backward on CUDA
-- (ember/optim_overlap.lua): the updates run on a side stream forked from
-- the main one by an event after each bucket's gradients, joined at
-- opt:step(). Checked bit for bit against the plain step on CUDA: eager
-- (f32 and autocast bf16 with shadow weights, one launch per parameter and
-- buckets, the side stream and inline), gradient accumulation, clip =
-- "exact", and a whole step captured with ember.cuda.graph and replayed. The
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
        opt:step_in_backward{max_norm = o.max_norm, clip = o.clip, side_stream = o.side_stream}
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
  } do
    it(case.name .. ": the bits of the plain step", function()
      local over = train(setmetatable({overlap = true}, {__index = case}))
      same_training(over, case.dtype and plain_bf16 or plain_f32)
      if case.side_stream ~= false then
        assert.is_truthy(over.opt._sides and over.opt._sides["cuda:0"], "the side stream was used")
      end
      assert.is_nil(over.opt._joins, "joined at step()")
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
