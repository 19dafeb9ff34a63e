-- overlap_spec.lua — AdamW overlapped with backward (ember/optim_overlap.lua):
-- opt:step_in_backward() makes each parameter's update run from its
-- post-accumulate-grad hook once its gradient is final. On the CPU the hook
-- updates inline, so these specs check, bit for bit against the plain
-- zero_grad / backward / step loop: losses, parameters and optimizer state,
-- with and without weight decay, two groups and an lr schedule, autocast with
-- shadow weights, gradient accumulation, a parameter used twice, unused
-- parameters; that the updates really happen inside backward; the two
-- clipping modes against hand-written references; and the errors. The CUDA
-- variants (side stream, graph capture) are tests/gpu/overlap_spec.lua.
local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local nn, F = ember.nn, ember.nn.functional
local core = ember.core or require "ember.core"

local maxdiff = H.maxdiff

local D, HID, V, B = 24, 40, 11, 16

-- fc1 -> silu -> rmsnorm -> fc2, and `shared` (used twice in the forward),
-- `late` (used only by the first micro-batch), `unused` (never).
local function model()
  ember.manual_seed(5)
  local m = {fc1 = nn.Linear(D, HID), fc2 = nn.Linear(HID, V)}
  m.norm = ember.ones({HID})
  m.norm.requires_grad = true
  m.shared = ember.randn({HID}) * 0.1
  m.shared.requires_grad = true
  m.late = ember.randn({V}) * 0.1
  m.late.requires_grad = true
  m.unused = ember.randn({3})
  m.unused.requires_grad = true
  m.params = {m.fc1.weight, m.fc1.bias, m.fc2.weight, m.fc2.bias, m.norm, m.shared, m.late, m.unused}
  return m
end

local function data(k)
  ember.manual_seed(100 + k)
  return ember.randn({B, D}), ember.randint(0, V, {B})
end

local function forward(m, x, y, o)
  local function f()
    local h = F.silu(m.fc1(x)) + m.shared
    h = F.rmsnorm(h, m.norm) * m.shared       -- `shared` reached twice
    local logits = m.fc2(h)
    if o.late then logits = logits + m.late end
    return F.cross_entropy(logits, y)
  end
  if o.autocast then return ember.autocast(o.autocast, f) end
  return f()
end

-- Train `steps` steps; o: overlap (arm step_in_backward), micro (micro-batches
-- per step), wd, groups, schedule, autocast, bucket_mb, clip/max_norm, check
-- (called after the armed backward, before step()).
local function train(o)
  local m = model()
  local opts = {lr = 1e-2, weight_decay = o.wd or 0, overlap_bucket_mb = o.bucket_mb}
  local params = m.params
  if o.groups then
    params = {{params = {m.fc1.weight, m.fc1.bias, m.norm}, lr = 3e-3},
              {params = {m.fc2.weight, m.fc2.bias, m.shared, m.late, m.unused}, weight_decay = 0.2}}
  end
  local opt = ember.optim.AdamW(params, opts)
  local losses, norms = {}, {}
  for s = 1, o.steps or 4 do
    if o.schedule then opt:set_lr(1e-2 / s) end
    opt:zero_grad()
    local micro = o.micro or 1
    for k = 1, micro do
      local x, y = data(s * 10 + k)
      local loss = forward(m, x, y, {autocast = o.autocast, late = k == 1})
      if micro > 1 then loss = loss / micro end
      if o.overlap and k == micro then
        opt:step_in_backward{max_norm = o.max_norm, clip = o.clip, free_grads = o.free_grads}
      end
      local before = o.check and o.check.snapshot(m)
      loss:backward()
      if o.check and k == micro then o.check.after_backward(m, before, s) end
      losses[#losses + 1] = loss:item()
    end
    if not o.overlap and o.max_norm then norms[s] = nn.utils.clip_grad_norm(m.params, o.max_norm) end
    opt:step()
    if o.overlap and o.max_norm then norms[s] = opt:grad_norm() end
  end
  return {losses = losses, m = m, opt = opt, norms = norms}
end

local function same_training(a, b)
  assert.are.same(a.losses, b.losses)
  for i, p in ipairs(a.m.params) do assert.are.equal(0, maxdiff(p, b.m.params[i]), "param " .. i) end
  local sa, sb = a.opt:state_dict(), b.opt:state_dict()
  for i, st in pairs(sa.state) do
    assert.are.equal(st.step, sb.state[i].step, "step of param " .. i)
    assert.are.equal(0, maxdiff(st.exp_avg, sb.state[i].exp_avg), "exp_avg " .. i)
    assert.are.equal(0, maxdiff(st.exp_avg_sq, sb.state[i].exp_avg_sq), "exp_avg_sq " .. i)
  end
  for i in pairs(sb.state) do assert.is_not_nil(sa.state[i], "state " .. i .. " in both") end
end

local function snapshot(m)
  local s = {}
  for i, p in ipairs(m.params) do s[i] = p:clone() end
  return s
end

describe("AdamW step_in_backward (CPU)", function()
  for _, case in ipairs {
    {name = "no weight decay, one launch per parameter", wd = 0, bucket_mb = 0},
    {name = "weight decay 0.1, buckets of a few parameters", wd = 0.1, bucket_mb = 0.004},
    {name = "weight decay 0.1, one bucket (flushed by step())", wd = 0.1},
    {name = "two groups (own lr and weight decay) and an lr schedule", groups = true, schedule = true, bucket_mb = 0},
    {name = "autocast bf16 with shadow weights", autocast = "bf16", wd = 0.1, bucket_mb = 0},
    {name = "gradient accumulation over 2 micro-batches", micro = 2, wd = 0.1, bucket_mb = 0},
  } do
    it(case.name .. ": the bits of the plain step (losses, parameters, state)", function()
      local plain = train(setmetatable({overlap = false}, {__index = case}))
      local over = train(setmetatable({overlap = true}, {__index = case}))
      same_training(over, plain)
      -- the unused parameter got no gradient: no state, unchanged
      assert.is_nil(over.opt.state[over.m.unused])
      if case.autocast then
        assert.is_not_nil(core.shadow_weight(over.m.fc1.weight), "the step wrote fc1's shadow")
        assert.are.equal(0, maxdiff(core.shadow_weight(over.m.fc1.weight),
          over.m.fc1.weight:to(case.autocast)), "shadow = cast of the updated weight")
      end
    end)
  end

  it("the reference TransformerLM under autocast bf16: the bits of the plain step", function()
    local function lm(overlap)
      ember.manual_seed(1)
      local m = nn.TransformerLM{vocab_size = 50, context_length = 16, d_model = 32, d_ff = 64,
        num_layers = 2, num_heads = 4}
      local opt = ember.optim.AdamW(m:parameters(), {lr = 1e-2, weight_decay = 0.1, overlap_bucket_mb = 0.01})
      ember.manual_seed(2)
      local x, y = ember.randint(0, 50, {3, 16}), ember.randint(0, 50, {3, 16})
      local losses = {}
      for s = 1, 3 do
        opt:zero_grad()
        local loss = ember.autocast("bf16", function()
          return F.cross_entropy(m(x):reshape({48, 50}), y:reshape({48}))
        end)
        if overlap then opt:step_in_backward() end
        loss:backward()
        opt:step()
        losses[s] = loss:item()
      end
      return losses, m:parameters()
    end
    local l0, p0 = lm(false)
    local l1, p1 = lm(true)
    assert.are.same(l0, l1)
    for i, p in ipairs(p1) do assert.are.equal(0, maxdiff(p, p0[i]), "param " .. i) end
  end)

  it("updates each parameter inside backward, once its gradient is final (one launch per parameter)", function()
    local seen = 0
    train {overlap = true, bucket_mb = 0, micro = 2, steps = 2, check = {
      snapshot = snapshot,
      after_backward = function(m, before)
        seen = seen + 1
        for i, p in ipairs(m.params) do
          local moved = maxdiff(p, before[i]) > 0
          -- `late` is reached only by the first micro-batch: step() updates it; `unused` never
          local expect = p ~= m.late and p ~= m.unused
          assert.are.equal(expect, moved, "param " .. i .. " updated during backward")
        end
      end}}
    assert.are.equal(2, seen)
  end)

  it("a bucket under overlap_bucket_mb waits for step(): nothing moves during backward", function()
    train {overlap = true, steps = 1, check = {
      snapshot = snapshot,
      after_backward = function(m, before)
        for i, p in ipairs(m.params) do assert.are.equal(0, maxdiff(p, before[i]), "param " .. i) end
      end}}
  end)

  it("clip = \"exact\" (the default with max_norm) is clip_grad_norm + step, bit for bit, without overlap", function()
    local plain = train {overlap = false, max_norm = 0.05, wd = 0.1}
    local over = train {overlap = true, max_norm = 0.05, wd = 0.1, bucket_mb = 0, check = {
      snapshot = snapshot,
      after_backward = function(m, before)
        for i, p in ipairs(m.params) do assert.are.equal(0, maxdiff(p, before[i]), "param " .. i) end
      end}}
    same_training(over, plain)
    assert.are.same(plain.norms, over.norms)
    assert.is_true(plain.norms[1] > 0.05, "the clip was active")
  end)

  it("clip = \"previous\" scales by the previous step's norm (the first step by its own)", function()
    local max_norm = 0.05
    -- reference: per-parameter sums of squares into f32 slots, their sum S;
    -- step 1 clips by S_1, step t by S_(t-1); clip_grads_' scaling
    local m = model()
    local opt = ember.optim.AdamW(m.params, {lr = 1e-2, weight_decay = 0.1})
    local prev, ref_losses, ref_norms = nil, {}, {}
    for s = 1, 4 do
      opt:zero_grad()
      local x, y = data(s * 10 + 1)
      local loss = forward(m, x, y, {late = true})
      loss:backward()
      ref_losses[s] = loss:item()
      local ss = {}
      for i, p in ipairs(m.params) do ss[i] = p.grad and core.sum_of_squares({p.grad}):item() or 0 end
      local S = ember.tensor(ss, {dtype = "f32"}):sum()
      local by = prev or S
      local total = math.sqrt(by:item())
      if total > max_norm then
        ember.no_grad(function()
          for _, p in ipairs(m.params) do if p.grad then p.grad:mul_(max_norm / (total + 1e-6)) end end
        end)
      end
      opt:step()
      prev = S
      ref_norms[s] = math.sqrt(S:item())
    end
    local over = train {overlap = true, max_norm = max_norm, clip = "previous", wd = 0.1, bucket_mb = 0.004}
    assert.are.same(ref_losses, over.losses)
    assert.are.same(ref_norms, over.norms)
    for i, p in ipairs(m.params) do assert.are.equal(0, maxdiff(p, over.m.params[i]), "param " .. i) end
    -- not secretly exact: the exact run differs after the first step
    local exact = train {overlap = true, max_norm = max_norm, wd = 0.1}
    assert.are.equal(ref_losses[1], exact.losses[1])
    assert.are.equal(ref_losses[2], exact.losses[2])    -- step 1 was exact in both
    assert.are_not.equal(ref_losses[3], exact.losses[3])
  end)

  it("free_grads: the bits of the plain step; each gradient is dropped once its update ran, the rest at step()",
    function()
    for _, bucket_mb in ipairs({0, 0.004}) do
      local plain = train {overlap = false, wd = 0.1, micro = 2, bucket_mb = bucket_mb}
      local seen = 0
      local over = train {overlap = true, free_grads = true, wd = 0.1, micro = 2, bucket_mb = bucket_mb, check = {
        snapshot = snapshot,
        after_backward = function(m)
          seen = seen + 1
          -- `late` got its gradient from the first micro-batch only: step() updates it; `unused` has none
          assert.is_true(core.has_grad(m.late), "late keeps its gradient until step()")
          assert.is_false(core.has_grad(m.unused))
          if bucket_mb == 0 then
            for i, p in ipairs(m.params) do
              if p ~= m.late then assert.is_false(core.has_grad(p), "param " .. i .. " dropped in backward") end
            end
          end
        end}}
      assert.are.equal(4, seen)
      same_training(over, plain)
      for i, p in ipairs(over.m.params) do assert.is_false(core.has_grad(p), "param " .. i .. " after step()") end
    end
  end)

  it("free_grads with clip = \"exact\": the gradients are dropped after the clipped step", function()
    local plain = train {overlap = false, max_norm = 0.05, wd = 0.1}
    local over = train {overlap = true, free_grads = true, max_norm = 0.05, wd = 0.1, bucket_mb = 0}
    same_training(over, plain)
    for i, p in ipairs(over.m.params) do assert.is_false(core.has_grad(p), "param " .. i) end
  end)

  it("refuses a second backward after arming: a parameter's gradient was final already", function()
    local m = model()
    local opt = ember.optim.AdamW(m.params, {overlap_bucket_mb = 0})
    local x, y = data(1)
    opt:step_in_backward()
    forward(m, x, y, {}):backward()
    local ok, err = pcall(function() forward(m, x, y, {}):backward() end)
    assert.is_false(ok)
    assert.matches("got a second final gradient in one step", tostring(err))
    opt:step()
    -- after step() the next step is plain again: a backward and step work
    opt:zero_grad()
    forward(m, x, y, {}):backward()
    opt:step()
  end)

  it("names bad options and misuse", function()
    local m = model()
    local opt = ember.optim.AdamW(m.params)
    local function err(f) local ok, e = pcall(f) assert.is_false(ok) return tostring(e) end
    assert.matches("clip = \"exact\" or \"previous\", got sometimes",
      err(function() opt:step_in_backward{max_norm = 1, clip = "sometimes"} end))
    assert.matches("clip = previous needs max_norm", err(function() opt:step_in_backward{clip = "previous"} end))
    assert.matches("max_norm to be a number >= 0, got %-1", err(function() opt:step_in_backward{max_norm = -1} end))
    assert.matches("unknown option 'maxnorm' %(expected max_norm, clip, side_stream, free_grads%)",
      err(function() opt:step_in_backward{maxnorm = 1} end))
    assert.matches("expected free_grads = true or false, got string",
      err(function() opt:step_in_backward{free_grads = "yes"} end))
    assert.matches("overlap_bucket_mb", err(function() ember.optim.AdamW(m.params, {overlap_bucket_mb = -1}) end))
    opt:step_in_backward()
    assert.matches("already armed", err(function() opt:step_in_backward() end))
    assert.matches("a closure cannot be used after step_in_backward",
      err(function() opt:step(function() return 0 end) end))
    opt:step()        -- no backward ran: nothing to do, and disarmed
    opt:step_in_backward()
    opt:step()
  end)

  it("a step with no backward after arming is the plain step (parameters with gradients updated)", function()
    local a, b = model(), model()
    local oa, ob = ember.optim.AdamW(a.params), ember.optim.AdamW(b.params)
    local x, y = data(3)
    forward(a, x, y, {late = true}):backward()
    forward(b, x, y, {late = true}):backward()
    oa:step()
    ob:step_in_backward()
    ob:step()
    for i, p in ipairs(a.params) do assert.are.equal(0, maxdiff(p, b.params[i]), "param " .. i) end
  end)

  it("a dropped optimizer leaves no-op hooks: a new optimizer over the same parameters trains normally", function()
    local m = model()
    local old = ember.optim.AdamW(m.params, {overlap_bucket_mb = 0})
    old:step_in_backward()
    old:step()
    old = nil
    collectgarbage()
    collectgarbage()
    local x, y = data(4)
    local opt = ember.optim.AdamW(m.params, {overlap_bucket_mb = 0})
    opt:step_in_backward()
    forward(m, x, y, {late = true}):backward()
    opt:step()
    assert.are.equal(1, opt:state_dict().state[1].step)
  end)
end)
