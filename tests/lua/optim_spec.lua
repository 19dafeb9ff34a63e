-- optim_spec.lua — ember.optim against scalar Lua re-implementations of
-- PyTorch's formulas, state (de)serialisation, schedules and gradient clipping.
--
-- Run from the repository root (after building into build-lua):
--   LUA_PATH="build-lua/lua/?.lua;build-lua/lua/?/init.lua;;" \
--   LUA_CPATH="build-lua/lua/?.so;;" busted tests/lua/optim_spec.lua

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local nn, optim = ember.nn, ember.optim

local flat = H.flat

-- Elementwise |a − b| ≤ tol over Lua arrays.
local function assert_close(a, b, tol, what) return H.assert_close(a, b, 0, tol, what) end

local function param(shape)
  local p = ember.randn(shape)
  p.requires_grad = true
  return p
end

-- PyTorch's AdamW on Lua numbers (torch.optim.AdamW, amsgrad=False).
local function adamw_ref(p, grads, o)
  local m, v = {}, {}
  for i = 1, #p do m[i], v[i] = 0, 0 end
  for t, g in ipairs(grads) do
    for i = 1, #p do
      p[i] = p[i] - o.lr * o.wd * p[i]
      m[i] = o.b1 * m[i] + (1 - o.b1) * g[i]
      v[i] = o.b2 * v[i] + (1 - o.b2) * g[i] * g[i]
      local mhat = m[i] / (1 - o.b1 ^ t)
      local vhat = v[i] / (1 - o.b2 ^ t)
      p[i] = p[i] - o.lr * mhat / (math.sqrt(vhat) + o.eps)
    end
  end
  return p, m, v
end

-- PyTorch's SGD on Lua numbers (dampening 0, no nesterov).
local function sgd_ref(p, grads, o)
  local buf
  for _, g in ipairs(grads) do
    for i = 1, #p do
      local d = g[i] + o.wd * p[i]
      if o.momentum ~= 0 then
        if buf == nil then buf = {} end
        buf[i] = buf[i] == nil and d or o.momentum * buf[i] + d
        d = buf[i]
      end
      p[i] = p[i] - o.lr * d
    end
  end
  return p
end

describe("ember.optim.AdamW", function()
  before_each(function() ember.manual_seed(11) end)

  it("follows PyTorch's formula over 6 steps with weight decay and bias correction", function()
    local a, b = param({3, 4}), param({5})
    local o = {lr = 0.05, b1 = 0.8, b2 = 0.95, eps = 1e-6, wd = 0.1}
    local opt = optim.AdamW({a, b}, {lr = o.lr, betas = {o.b1, o.b2}, eps = o.eps,
      weight_decay = o.wd})
    local ra, rb = flat(a), flat(b)
    local ga, gb = {}, {}
    for s = 1, 6 do
      -- gradients of varying scale so the bias correction matters
      local g1, g2 = ember.randn(3, 4) * s, ember.randn(5) * (0.1 * s)
      ga[s], gb[s] = flat(g1), flat(g2)
      a.grad, b.grad = g1, g2
      opt:step()
    end
    local pa, ma, va = adamw_ref(ra, ga, o)
    local pb = adamw_ref(rb, gb, o)
    -- f32 kernel vs f64 Lua: relative error of a few ulps per step
    assert_close(flat(a), pa, 2e-6, "a")
    assert_close(flat(b), pb, 2e-6, "b")
    local st = opt.state[a]
    assert.are.equal(6, st.step)
    assert_close(flat(st.exp_avg), ma, 1e-5, "exp_avg")
    assert_close(flat(st.exp_avg_sq), va, 1e-4, "exp_avg_sq")
  end)

  it("uses PyTorch's defaults lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01", function()
    local p = param({4})
    local opt = optim.AdamW({p})
    local g = opt.param_groups[1]
    assert.are.same({1e-3, 0.9, 0.999, 1e-8, 0.01}, {g.lr, g.betas[1], g.betas[2], g.eps,
      g.weight_decay})
    local r = flat(p)
    local grad = ember.randn(4)
    p.grad = grad
    opt:step()
    assert_close(flat(p), (adamw_ref(r, {flat(grad)},
      {lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01})), 1e-6, "p")
  end)

  it("skips parameters whose grad is nil, without creating state", function()
    local a, b = param({3}), param({3})
    local opt = optim.AdamW({a, b}, {lr = 0.1})
    local before = flat(b)
    a.grad = ember.ones(3)
    opt:step()
    assert.are.same(before, flat(b))
    assert.is_nil(opt.state[b])
    assert.are.equal(1, opt.state[a].step)
  end)

  it("honours per-group learning rates", function()
    local a, b = param({4}), param({4})
    local opt = optim.AdamW({{params = {a}}, {params = {b}, lr = 0}}, {lr = 0.1,
      weight_decay = 0})
    local ra, rb = flat(a), flat(b)
    a.grad, b.grad = ember.ones(4), ember.ones(4)
    opt:step()
    -- first Adam step moves each coordinate by lr·g/(|g| + eps) ≈ lr
    for i = 1, 4 do assert.is_true(math.abs(flat(a)[i] - (ra[i] - 0.1)) < 1e-5) end
    assert.are.same(rb, flat(b))
    assert.are.equal(0, opt.param_groups[2].lr)
    assert.are.equal(0.1, opt.param_groups[1].lr)
  end)

  it("trains a model whose parameters were moved with to() after the optimizer was made", function()
    local m = nn.Linear(3, 1)
    local opt = optim.AdamW(m:parameters(), {lr = 0.1})
    m:to("f64")
    local w0 = flat(m.weight)
    m(ember.randn(8, 3, {dtype = "f64"})):sum():backward()
    opt:step()
    assert.are_not.same(w0, flat(m.weight))
  end)

  it("rejects invalid hyper-parameters and an empty parameter list", function()
    assert.error_matches(function() optim.AdamW({param({2})}, {betas = {1.5, 0.9}}) end,
      "ember.optim.AdamW: expected betas[1] in [0, 1), got 1.5", 1, true)
    assert.error_matches(function() optim.AdamW({}, {}) end,
      "ember.optim.AdamW: got an empty parameter list", 1, true)
  end)

  it("buckets by device, dtype and step: mixed f32/f64 parameters at different steps each follow the formula",
    function()
    -- a (f32) and c (f64) share no bucket; b (f32) starts a step later than a
    local a, b = param({3}), param({4})
    local c = nn.Parameter(ember.randn(2, {dtype = "f64"}))
    local o = {lr = 0.05, b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.1}
    local opt = optim.AdamW({a, b, c}, {lr = o.lr, betas = {o.b1, o.b2}, eps = o.eps, weight_decay = o.wd})
    local ra, rb, rc = flat(a), flat(b), flat(c)
    local ga, gb, gc = {}, {}, {}
    for s = 1, 3 do
      local g1, g2, g3 = ember.randn(3), ember.randn(4), ember.randn(2, {dtype = "f64"})
      ga[s], gc[s] = flat(g1), flat(g3)
      a.grad, c.grad = g1, g3
      if s > 1 then gb[s - 1] = flat(g2); b.grad = g2 end
      opt:step()
    end
    assert_close(flat(a), (adamw_ref(ra, ga, o)), 2e-6, "a")
    assert_close(flat(b), (adamw_ref(rb, gb, o)), 2e-6, "b")
    assert_close(flat(c), (adamw_ref(rc, gc, o)), 1e-12, "c")
    assert.are.same({3, 2, 3}, {opt.state[a].step, opt.state[b].step, opt.state[c].step})
  end)

  it("core.placements numbers each (device, dtype) pair, CPU ones below PLACEMENT_CPU_END", function()
    local core = ember.core
    local k = core.placements({ember.ones(2), ember.zeros(3), ember.ones(1, {dtype = "f64"}),
      ember.ones(1, {dtype = "bf16"})})
    assert.are.equal(4, #k)
    assert.are.equal(k[1], k[2])
    assert.are_not.equal(k[1], k[3])
    assert.are_not.equal(k[3], k[4])
    for i = 1, 4 do assert.is_true(math.type(k[i]) == "integer" and k[i] >= 0 and k[i] < core.PLACEMENT_CPU_END) end
    assert.error_matches(function() core.placements({ember.ones(1), 3}) end, "element 2 is not a tensor", 1, true)
  end)

  it("zero_grad sets every grad to nil", function()
    local p = param({2})
    local opt = optim.AdamW({p})
    p.grad = ember.ones(2)
    opt:zero_grad()
    assert.is_nil(p.grad)
  end)
end)

describe("ember.optim.SGD", function()
  before_each(function() ember.manual_seed(12) end)

  it("follows PyTorch's momentum formula (buffer = first grad) with weight decay", function()
    local p = param({6})
    local o = {lr = 0.1, momentum = 0.9, wd = 0.01}
    local opt = optim.SGD({p}, {lr = o.lr, momentum = o.momentum, weight_decay = o.wd})
    local r, gs = flat(p), {}
    for s = 1, 4 do
      local g = ember.randn(6)
      gs[s] = flat(g)
      p.grad = g
      opt:step()
    end
    assert_close(flat(p), sgd_ref(r, gs, o), 1e-5, "p")
  end)

  it("without momentum is p -= lr·g", function()
    local p = param({5})
    local opt = optim.SGD({p}, {lr = 0.5})
    local r = flat(p)
    local g = ember.randn(5)
    p.grad = g
    opt:step()
    assert_close(flat(p), sgd_ref(r, {flat(g)}, {lr = 0.5, momentum = 0, wd = 0}), 1e-6, "p")
    assert.is_nil(opt.state[p])
  end)

  it("starts a momentum buffer from the grad for a parameter that joins late", function()
    local a, b = param({3}), param({3})
    local o = {lr = 0.1, momentum = 0.5, wd = 0}
    local opt = optim.SGD({a, b}, {lr = o.lr, momentum = o.momentum})
    local rb = flat(b)
    a.grad = ember.ones(3)
    opt:step()                                   -- b has no grad yet
    local g1, g2 = ember.randn(3), ember.randn(3)
    a.grad, b.grad = ember.ones(3), g1
    opt:step()
    b.grad = g2
    opt:step()
    assert_close(flat(b), sgd_ref(rb, {flat(g1), flat(g2)}, o), 1e-6, "b")
  end)
end)

describe("ember.optim state_dict", function()
  -- Run `steps` AdamW steps with grads from the seed, return params and opt.
  local function run(seed, steps, opt_state)
    ember.manual_seed(seed)
    local a, b = param({2, 3}), param({4})
    local opt = optim.AdamW({a, b}, {lr = 0.01, weight_decay = 0.1})
    if opt_state then opt:load_state_dict(opt_state) end
    for _ = 1, steps do
      a.grad, b.grad = ember.randn(2, 3), ember.randn(4)
      opt:step()
    end
    return a, b, opt
  end

  it("has PyTorch's layout with 1-based parameter indices", function()
    local _, _, opt = run(5, 2)
    local sd = opt:state_dict()
    assert.are.same({1, 2}, sd.param_groups[1].params)
    assert.are.equal(0.01, sd.param_groups[1].lr)
    assert.are.equal(2, sd.state[1].step)
    assert.are.same({2, 3}, sd.state[1].exp_avg.shape)
    assert.are.same({4}, sd.state[2].exp_avg_sq.shape)
  end)

  it("resumes exactly: loading the state and the parameters gives the same next step", function()
    local a1, b1, opt1 = run(5, 3)
    local sd = opt1:state_dict()
    local flat_sd = optim.state_to_tensors(sd)
    assert.is_true(ember.is_tensor(flat_sd["state.1.exp_avg"]))
    assert.is_true(ember.is_tensor(flat_sd["param_groups.1.lr"]))
    -- a fresh optimizer over copies of the parameters, from the flattened state
    local a2, b2 = a1:detach():clone(), b1:detach():clone()
    a2.requires_grad, b2.requires_grad = true, true
    local opt2 = optim.AdamW({a2, b2}, {lr = 1, weight_decay = 0})
    opt2:load_state_dict(optim.tensors_to_state(flat_sd))
    assert.are.equal(0.01, opt2.param_groups[1].lr)
    assert.are.equal(0.1, opt2.param_groups[1].weight_decay)
    assert.are.equal(3, opt2.state[a2].step)
    assert.are_not.equal(opt1.state[a1].exp_avg, opt2.state[a2].exp_avg)
    local ga, gb = ember.randn(2, 3), ember.randn(4)
    a1.grad, b1.grad = ga, gb
    a2.grad, b2.grad = ga:clone(), gb:clone()
    opt1:step()
    opt2:step()
    assert.are.same(flat(a1), flat(a2))
    assert.are.same(flat(b1), flat(b2))
  end)

  it("survives a trip through a safetensors file (ember.save / ember.load)", function()
    local a1, _, opt1 = run(6, 2)
    local path = os.tmpname()
    ember.save(path, optim.state_to_tensors(opt1:state_dict()))
    local sd = optim.tensors_to_state(ember.load(path))
    os.remove(path)
    assert.are.equal(2, sd.state[1].step)
    assert.are.equal("integer", math.type(sd.state[1].step))
    assert.are.same({1, 2}, sd.param_groups[1].params)
    assert.are.same({0.9, 0.999}, sd.param_groups[1].betas)
    assert.are.same(flat(opt1.state[a1].exp_avg_sq), flat(sd.state[1].exp_avg_sq))
    local a2, b2 = param({2, 3}), param({4})
    local opt2 = optim.AdamW({a2, b2})
    opt2:load_state_dict(sd)
    assert.are.equal(0.01, opt2.param_groups[1].lr)
    assert.are.same(flat(opt1.state[a1].exp_avg), flat(opt2.state[a2].exp_avg))
  end)

  it("rejects a state whose groups do not match", function()
    local _, _, opt = run(5, 1)
    local other = optim.AdamW({param({2, 3})})
    assert.error_matches(function() other:load_state_dict(opt:state_dict()) end,
      "group 1 has 2 parameter(s) in the state, 1 in the optimizer", 1, true)
  end)
end)

describe("ember.optim.cosine_schedule", function()
  local lr = optim.cosine_schedule{max_lr = 1.0, min_lr = 0.1, warmup = 10, total = 110}

  it("warms up linearly from 0", function()
    assert.are.equal(0, lr(0))
    assert.is_true(math.abs(lr(5) - 0.5) < 1e-12)
    assert.is_true(math.abs(lr(9) - 0.9) < 1e-12)
  end)

  it("decays along a cosine from max_lr at the end of warm-up to min_lr at total", function()
    assert.is_true(math.abs(lr(10) - 1.0) < 1e-12)
    assert.is_true(math.abs(lr(60) - 0.55) < 1e-12)                 -- halfway
    local q = 0.1 + 0.5 * (1 + math.cos(math.pi * 0.25)) * 0.9
    assert.is_true(math.abs(lr(35) - q) < 1e-12)                    -- a quarter in
    assert.is_true(math.abs(lr(110) - 0.1) < 1e-12)
  end)

  it("stays at min_lr after total", function()
    assert.are.equal(0.1, lr(111))
    assert.are.equal(0.1, lr(10000))
  end)

  it("drives an optimizer through LRScheduler", function()
    local p = param({2})
    local opt = optim.SGD({p}, {lr = 123})
    local sched = optim.LRScheduler(opt, lr)
    assert.are.equal(0, opt.param_groups[1].lr)
    for _ = 1, 60 do sched:step() end
    assert.is_true(math.abs(opt.param_groups[1].lr - 0.55) < 1e-12)
    assert.are.same({opt.param_groups[1].lr}, sched:get_last_lr())
  end)

  it("rejects total < warmup", function()
    assert.error_matches(function()
      optim.cosine_schedule{max_lr = 1, min_lr = 0, warmup = 10, total = 5}
    end, "ember.optim.cosine_schedule: expected total >= 10, got 5", 1, true)
  end)
end)

describe("ember.nn.utils.clip_grad_norm", function()
  local function with_grads(g1, g2)
    local a, b, c = param({2}), param({1}), param({3})
    a.grad, b.grad = ember.tensor(g1), ember.tensor(g2)
    return {a, b, c}
  end

  it("returns the global L2 norm and scales every grad by max_norm/(total+1e-6)", function()
    local ps = with_grads({3, 0}, {4})                     -- total 5; c has no grad
    local total = nn.utils.clip_grad_norm(ps, 1.0)
    assert.is_true(math.abs(total - 5) < 1e-6)
    local s = 1.0 / (5 + 1e-6)
    assert_close(flat(ps[1].grad), {3 * s, 0}, 1e-7, "a.grad")
    assert_close(flat(ps[2].grad), {4 * s}, 1e-7, "b.grad")
    assert.is_nil(ps[3].grad)
  end)

  it("leaves gradients alone when the norm is within max_norm", function()
    local ps = with_grads({3, 0}, {4})
    assert.is_true(math.abs(nn.utils.clip_grad_norm(ps, 5.5) - 5) < 1e-6)
    assert.are.same({3, 0}, flat(ps[1].grad))
    assert.are.same({4}, flat(ps[2].grad))
  end)

  it("returns 0 when no parameter has a gradient", function()
    assert.are.equal(0, nn.utils.clip_grad_norm({param({2})}, 1.0))
  end)
end)
