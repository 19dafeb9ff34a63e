-- lm_spec.lua (GPU) — the tiny reference TransformerLM trained on CUDA
-- against the same run on the CPU (same seed ⇒ same weights and batch: the
-- Philox streams are identical across devices), a whole training step
-- captured as a CUDA graph against eager steps, and out-of-memory as a
-- catchable error after which the process carries on.
local ember = require "ember"
local nn, optim, F = ember.nn, ember.optim, ember.nn.functional

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local V, T, B, STEPS = 256, 64, 4, 10
-- Attention implementations on CUDA: naive in f32; naive and flash (bf16
-- only) under bf16 autocast. Graphs and OOM use the default, "auto" (flash
-- under autocast, naive in f32).
local ATTN = "auto"

-- A fresh tiny LM, its AdamW and one fixed batch on `device`.
local function setup(device, attn)
  ember.manual_seed(42)
  local model = nn.TransformerLM(nn.configs.tiny{vocab_size = V, context_length = T,
    device = device, attn_impl = attn or "naive"})
  local opt = optim.AdamW(model:parameters(), {lr = 3e-3, weight_decay = 0.01})
  local data = ember.randint(0, V, {B, T + 1}, {device = device})
  return model, opt, data:narrow(1, 0, T), data:narrow(1, 1, T)
end

-- One training step; returns the loss tensor (no host sync).
local function step_fn(model, opt, x, y, precision)
  local function loss_fn() return F.cross_entropy(model(x), y) end
  return function()
    opt:zero_grad()
    local loss = precision == "bf16" and ember.autocast("bf16", loss_fn) or loss_fn()
    loss:backward()
    opt:step()
    return loss
  end
end

local function train(device, precision, attn)
  local model, opt, x, y = setup(device, attn)
  local step = step_fn(model, opt, x, y, precision)
  local losses = {}
  for i = 1, STEPS do losses[i] = step():item() end
  return losses
end

-- Largest |a_i − b_i| / |b_i| over the sequence, and where.
local function max_rel(a, b)
  assert.are.equal(#b, #a)
  local worst, at = 0, 0
  for i = 1, #b do
    local r = math.abs(a[i] - b[i]) / math.abs(b[i])
    if r ~= r then return math.huge, i end
    if r > worst then worst, at = r, i end
  end
  return worst, at
end

local function fmt_seq(s)
  local t = {}
  for i, v in ipairs(s) do t[i] = ("%.6f"):format(v) end
  return table.concat(t, " ")
end

local function expect_close(got, want, tol, what)
  local r, at = max_rel(got, want)
  assert(r <= tol, ("%s: step %d differs by %.3g relative (tolerance %g)\n  cuda: %s\n  cpu:  %s")
    :format(what, at, r, tol, fmt_seq(got), fmt_seq(want)))
end

describe("tiny TransformerLM on CUDA vs the CPU (10 AdamW steps)", function()
  local cpu32, cpu16

  lazy_setup(function()
    cpu32 = train("cpu", "fp32")
    cpu16 = train("cpu", "bf16")
  end)

  it("learns on the CPU (the reference run is meaningful)", function()
    assert.is_true(cpu32[STEPS] < cpu32[1] - 0.1, fmt_seq(cpu32))
  end)

  -- f32: the same math in another summation order; 10 Adam steps amplify
  -- 1e-7 differences a little, never to 1e-4. bf16 autocast: both devices
  -- round matmul inputs to bf16 but accumulate in different orders, so
  -- outputs differ by about one bf16 ulp (4e-3); through 10 steps that stays
  -- within 2e-2 of the loss. CUDA runs every attention this build has
  -- (naive always; flash when ember.core.flash_attention exists) against
  -- the CPU's naive attention.
  it("f32 losses match within 1e-4 relative (naive attention on CUDA)", function()
    expect_close(train("cuda", "fp32", "naive"), cpu32, 1e-4, "f32 naive")
  end)
  for _, attn in ipairs({"naive", "flash"}) do
    it(("bf16 autocast losses match within 2e-2 relative (%s attention on CUDA)"):format(attn), function()
      expect_close(train("cuda", "bf16", attn), cpu16, 2e-2, "bf16 " .. attn)
    end)
  end
end)

describe("a whole training step as a CUDA graph", function()
  -- Eager: STEPS steps. Graph: 2 eager warm-up steps (AdamW state and
  -- workspaces exist before capture), capture step 3, replay it for steps
  -- 3..STEPS. Same kernels on the same data: the losses agree to rounding
  -- noise (atomics in backward may reorder sums), far under 1e-5.
  for _, precision in ipairs({"fp32", "bf16"}) do
    it(("replays forward, backward and AdamW with the eager loss sequence (%s, %s attention)")
        :format(precision, ATTN), function()
      local eager = train("cuda", precision, ATTN)

      local model, opt, x, y = setup("cuda", ATTN)
      local step = step_fn(model, opt, x, y, precision)
      local losses = {}
      for i = 1, 2 do losses[i] = step():item() end
      ember.cuda.synchronize()
      opt:zero_grad()
      local loss
      local g = ember.cuda.graph(function() loss = step() end, {warmup = 0})
      assert.is_not_nil(loss)
      for i = 3, STEPS do
        g:replay()
        losses[i] = loss:item()
      end
      expect_close(losses, eager, 1e-5, "graph " .. precision)
      -- and the replays really trained: the parameters moved on every replay
      assert.is_true(losses[STEPS] < losses[3], fmt_seq(losses))
    end)
  end

  it("replays read new data copied into the static input", function()
    local model, opt, x, y = setup("cuda", ATTN)
    local step = step_fn(model, opt, x, y, "fp32")
    step()
    ember.cuda.synchronize()
    local static_x = x:clone()
    local loss
    opt:zero_grad()
    local g = ember.cuda.graph(function()
      opt:zero_grad()
      loss = F.cross_entropy(model(static_x), y)
      loss:backward()
    end, {warmup = 0})
    g:replay()
    local l1 = loss:item()
    static_x:copy_(ember.randint(0, V, {B, T}, {device = "cuda"}))
    g:replay()
    local l2 = loss:item()
    -- eager on the same new data gives the same loss as the replay
    local l_eager = F.cross_entropy(model(static_x), y):item()
    assert.is_true(math.abs(l1 - l2) > 1e-4, ("replay ignored the new input: %g %g"):format(l1, l2))
    assert.is_true(math.abs(l2 - l_eager) / l_eager < 1e-5, ("%g vs eager %g"):format(l2, l_eager))
  end)
end)

describe("out of memory on CUDA", function()
  local function is_oom(err) return tostring(err):match("^out of memory") ~= nil end

  it("is a catchable error starting 'out of memory', and training goes on after it", function()
    collectgarbage(); collectgarbage()
    local before = ember.cuda.memory_allocated()

    -- one allocation larger than any GPU: 2^40 f32 = 4 TiB
    local ok, err = pcall(ember.empty, {1024, 1024, 1024, 1024}, {device = "cuda"})
    assert.is_false(ok)
    assert.is_true(is_oom(err), tostring(err))

    -- memory running out part-way through a computation: results of 2 GiB
    -- each pile up until the device is full (~40 on an 80 GB GPU)
    local base = ember.randn({1 << 29}, {device = "cuda"})
    local hold = {}
    ok, err = pcall(function() for i = 1, 1000 do hold[i] = base * 1.5 end end)
    assert.is_false(ok)
    assert.is_true(is_oom(err), tostring(err))
    assert.is_true(#hold >= 8, "only " .. #hold .. " 2 GiB results fitted before the OOM")
    hold, base = nil, nil

    -- a model too large for the device fails while its parameters are made
    -- (64 layers of d_model 8192: ~275 GB of f32 weights)
    ok, err = pcall(nn.TransformerLM, {vocab_size = 256, context_length = 64, d_model = 8192,
      d_ff = 32768, num_layers = 64, num_heads = 64, device = "cuda"})
    assert.is_false(ok)
    assert.is_true(is_oom(err), tostring(err))
    collectgarbage(); collectgarbage()

    -- the process carries on: a small model trains
    local model, opt, x, y = setup("cuda", ATTN)
    local step = step_fn(model, opt, x, y, "fp32")
    local l1 = step():item()
    local l2 = step():item()
    assert.is_true(l2 < l1, ("%g then %g"):format(l1, l2))

    -- and nothing from the failed attempts stays allocated
    model, opt, x, y, step = nil, nil, nil, nil, nil
    collectgarbage(); collectgarbage()
    assert.are.equal(before, ember.cuda.memory_allocated())
    -- give the ~78 GB the allocator now caches back to the driver: the specs after this
    -- one create streams and child processes, which need device memory of their own
    -- (matmul_tune_spec's failed with "out of memory" on the H100, 2026-11-27)
    ember.cuda.empty_cache()
  end)
end)
