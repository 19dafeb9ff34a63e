-- shadow_spec.lua — shadow weights (ember/autocast.h): AdamW writes the
-- bf16/f16 copy of each f32 parameter that autocast casts, in the same pass
-- as the update, and autocast reads it instead of casting. Checked here on
-- the CPU: training with and without shadows gives the same bits (losses and
-- parameters), the shadow is the cast of the updated weight bit for bit, and
-- a parameter written by anything but the step is cast again (never a stale
-- shadow). The GPU variants are tests/gpu/shadow_spec.lua.
local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local nn, F = ember.nn, ember.nn.functional
local core = ember.core or require "ember.core"

local maxdiff = H.maxdiff

local D, HID, V = 48, 96, 17

local function model(device)
  ember.manual_seed(7)
  local m = {fc1 = nn.Linear(D, HID, {bias = false, device = device}), fc2 = nn.Linear(HID, V, {device = device})}
  m.norm = ember.ones({HID}):to(device)
  m.norm.requires_grad = true
  m.params = {m.fc1.weight, m.fc2.weight, m.fc2.bias, m.norm}
  return m
end

local function forward(m, x, y, dtype)
  return ember.autocast(dtype, function()
    local h = F.rmsnorm(F.silu(m.fc1(x)), m.norm)
    return F.cross_entropy(m.fc2(h), y)
  end)
end

-- steps of AdamW under autocast; returns the losses and the model
local function train(device, dtype, shadow, steps, edit)
  local m = model(device)
  local opt = ember.optim.AdamW(m.params, {lr = 1e-2, weight_decay = 0.1, shadow_weights = shadow})
  ember.manual_seed(11)
  local x, y = ember.randn({32, D}):to(device), ember.randint(0, V, {32}):to(device)
  local losses = {}
  for s = 1, steps do
    opt:zero_grad()
    local loss = forward(m, x, y, dtype)
    loss:backward()
    opt:step()
    losses[s] = loss:item()
    if edit then edit(m, s) end
  end
  return losses, m
end

describe("shadow weights (CPU)", function()
  for _, dtype in ipairs {"bf16", "f16"} do
    it(dtype .. ": training with shadows gives the bits of training without (losses and parameters)", function()
      local l1, m1 = train("cpu", dtype, true, 5)
      local l0, m0 = train("cpu", dtype, false, 5)
      assert.are.same(l0, l1)
      for i, p in ipairs(m1.params) do assert.are.equal(0, maxdiff(p, m0.params[i]), "param " .. i) end
      -- the shadow path was taken: the linear weights carry current shadows
      -- equal to their casts bit for bit; the no-shadow run carries none
      for i = 1, 2 do
        local s = core.shadow_weight(m1.params[i])
        assert.is_not_nil(s, "param " .. i .. " has a shadow")
        assert.are.equal(dtype, s.dtype)
        assert.are.equal(0, maxdiff(s, m1.params[i]:to(dtype)), "shadow " .. i .. " = cast")
        assert.is_nil(core.shadow_weight(m0.params[i]), "shadow_weights = false keeps none")
      end
    end)
  end

  it("the f32-list parameter (rmsnorm's weight) gets no shadow: autocast never casts it", function()
    local _, m = train("cpu", "bf16", true, 2)
    assert.is_nil(core.shadow_weight(m.norm))
  end)

  it("a parameter written by hand after a step is cast again, not read from the stale shadow", function()
    local function edit(shadows)
      return function(m, s)
        if s ~= 2 then return end
        assert.are.equal(shadows, core.shadow_weight(m.fc1.weight) ~= nil)
        ember.no_grad(function() m.fc1.weight:mul_(1.5) end)
        assert.is_nil(core.shadow_weight(m.fc1.weight), "a write makes the shadow stale")
        assert.are.equal(shadows, core.shadow_weight(m.fc2.weight) ~= nil, "other parameters keep theirs")
      end
    end
    local l1, m1 = train("cpu", "bf16", true, 4, edit(true))
    local l0, m0 = train("cpu", "bf16", false, 4, edit(false))
    assert.are.same(l0, l1)
    for i, p in ipairs(m1.params) do assert.are.equal(0, maxdiff(p, m0.params[i]), "param " .. i) end
    -- and the step after the edit wrote a current shadow again
    assert.are.equal(0, maxdiff(core.shadow_weight(m1.fc1.weight), m1.fc1.weight:to("bf16")))
  end)

  it("set_ to a new storage drops the shadow", function()
    local _, m = train("cpu", "bf16", true, 2)
    local w = m.fc1.weight
    assert.is_not_nil(core.shadow_weight(w))
    w:set_(w:detach():clone())
    assert.is_nil(core.shadow_weight(w))
  end)

  it("a loss computed from the shadows equals one computed from fresh casts", function()
    local _, m = train("cpu", "bf16", true, 3)
    ember.manual_seed(3)
    local x, y = ember.randn({8, D}), ember.randint(0, V, {8})
    local with = forward(m, x, y, "bf16"):item()
    for i = 1, 2 do core.shadow_weights_(m.params[i], false) end
    assert.is_nil(core.shadow_weight(m.fc1.weight))
    assert.are.equal(forward(m, x, y, "bf16"):item(), with)
  end)

  it("rejects a non-boolean shadow_weights", function()
    local ok, err = pcall(ember.optim.AdamW, {ember.zeros({2}, {requires_grad = true})}, {shadow_weights = 1})
    assert.is_false(ok)
    assert.truthy(tostring(err):find("expected shadow_weights = true or false, got number", 1, true), err)
  end)
end)
