-- shadow_spec.lua (GPU) — shadow weights on CUDA (kernels/adamw.cu writes the
-- bf16/f16 copy in the AdamW kernel; engine/autocast.c reads it): training
-- with shadows gives the bits of training without, on CUDA and inside a
-- captured CUDA graph; one step from the same state and gradients gives the
-- CPU's bits (parameters and shadows); a hand-written parameter is cast
-- again. The CPU side is tests/lua/shadow_spec.lua.
local ember = require "ember"
local nn, F = ember.nn, ember.nn.functional
local core = ember.core

local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "compare.lua")
local same_bits = C.assert_same_bits

local D, HID, V = 256, 512, 1000

local function model(device)
  ember.manual_seed(7)
  local m = {fc1 = nn.Linear(D, HID, {bias = false, device = device}), fc2 = nn.Linear(HID, V, {device = device})}
  m.norm = ember.ones({HID}):to(device)
  m.norm.requires_grad = true
  m.params = {m.fc1.weight, m.fc2.weight, m.fc2.bias, m.norm}
  return m
end

local function data(device)
  ember.manual_seed(11)
  return ember.randn({64, D}):to(device), ember.randint(0, V, {64}):to(device)
end

local function forward(m, x, y, dtype)
  return ember.autocast(dtype, function()
    return F.cross_entropy(m.fc2(F.rmsnorm(F.silu(m.fc1(x)), m.norm)), y)
  end)
end

local function train(dtype, shadow, steps, opts)
  opts = opts or {}
  local m = model("cuda")
  local opt = ember.optim.AdamW(m.params, {lr = 1e-2, weight_decay = 0.1, shadow_weights = shadow})
  local x, y = data("cuda")
  local losses = {}
  local function step()
    for _, p in ipairs(m.params) do p.grad = nil end
    local loss = forward(m, x, y, dtype)
    loss:backward()
    opt:step()
    return loss
  end
  if opts.graph then
    for s = 1, 2 do losses[s] = step():item() end            -- eager warm-up: state and shadows exist
    for _, p in ipairs(m.params) do p.grad = nil end
    local loss
    local g = ember.cuda.graph(function() loss = step() end, {warmup = 0})
    for s = 3, steps do
      g:replay()
      ember.cuda.synchronize()
      losses[s] = loss:item()
    end
    g:close()
  else
    for s = 1, steps do
      losses[s] = step():item()
      if opts.edit then opts.edit(m, s) end
    end
  end
  return losses, m
end

describe("shadow weights on CUDA", function()
  assert.is_true(ember.cuda.is_available(), "the GPU specs need a CUDA device")

  for _, dtype in ipairs {"bf16", "f16"} do
    it(dtype .. ": training with shadows gives the bits of training without (losses, parameters)", function()
      local l1, m1 = train(dtype, true, 6)
      local l0, m0 = train(dtype, false, 6)
      assert.are.same(l0, l1)
      for i, p in ipairs(m1.params) do same_bits(p, m0.params[i], "param " .. i) end
      for i = 1, 2 do
        local s = core.shadow_weight(m1.params[i])
        assert.is_not_nil(s, "param " .. i .. " has a current shadow")
        same_bits(s, m1.params[i]:to(dtype), "shadow " .. i .. " = the CUDA cast")
        assert.is_nil(core.shadow_weight(m0.params[i]))
      end
    end)
  end

  it("inside a captured graph: replays give the bits of eager training without shadows", function()
    local lg, mg = train("bf16", true, 6, {graph = true})
    local l0, m0 = train("bf16", false, 6)
    assert.are.same(l0, lg)
    for i, p in ipairs(mg.params) do same_bits(p, m0.params[i], "param " .. i) end
    same_bits(core.shadow_weight(mg.fc1.weight), mg.fc1.weight:to("bf16"), "shadow after the replays")
  end)

  it("one step from the same state and gradients: CUDA's parameters and shadows are the CPU's bits", function()
    local function one(device)
      local m = model(device)
      local opt = ember.optim.AdamW(m.params, {lr = 1e-2, weight_decay = 0.1})
      local x, y = data(device)
      forward(m, x, y, "bf16")                              -- autocast asks for the shadows
      ember.manual_seed(5)
      for _, p in ipairs(m.params) do p.grad = ember.randn(p.shape):to(device) end
      opt:step()
      for _, p in ipairs(m.params) do p.grad = ember.randn(p.shape):to(device) end
      opt:step()
      return m
    end
    local mc, mg = one("cpu"), one("cuda")
    for i, p in ipairs(mg.params) do same_bits(p, mc.params[i], "param " .. i) end
    for i = 1, 2 do
      same_bits(core.shadow_weight(mg.params[i]), core.shadow_weight(mc.params[i]), "shadow " .. i)
    end
  end)

  it("a parameter written by hand after a step is cast again, not read from the stale shadow", function()
    local function edit(m, s)
      if s == 2 then
        ember.no_grad(function() m.fc1.weight:mul_(1.5) end)
        assert.is_nil(core.shadow_weight(m.fc1.weight))
      end
    end
    local l1, m1 = train("bf16", true, 4, {edit = edit})
    local l0, m0 = train("bf16", false, 4, {edit = edit})
    assert.are.same(l0, l1)
    for i, p in ipairs(m1.params) do same_bits(p, m0.params[i], "param " .. i) end
  end)
end)
