-- ember.context: module paths and phases seen by the engine while tracking.
local ember = require "ember"
local context = require "ember.context"
local core, nn = ember.core, ember.nn

describe("ember.context", function()
  local model, seen, orig
  before_each(function()
    model = nn.TransformerLM(nn.configs.tiny{vocab_size = 50, context_length = 8})
    seen = {}
    orig = nn.Linear.forward
    nn.Linear.forward = function(self, x)
      seen[#seen + 1] = core.ctx_module() .. "|" .. core.ctx_phase()
      return orig(self, x)
    end
  end)
  after_each(function()
    nn.Linear.forward = orig
    while context.enabled do context.track(false) end
  end)

  it("names modules by their registered path while tracking", function()
    context.track(true)
    model(ember.randint(0, 50, {2, 8}))
    assert.are.equal("layers.0.attn.q_proj|forward", seen[1])
    assert.are.equal("layers.1.ffn.w2|forward", seen[#seen - 1])
    assert.are.equal("lm_head|forward", seen[#seen])
    assert.are.equal("", core.ctx_module())
    assert.are.equal("none", core.ctx_phase())
    assert.are.equal("layers.1.attn", context.path_of(model.layers[2].attn))
  end)

  it("leaves paths alone while off", function()
    model(ember.randint(0, 50, {2, 8}))
    assert.are.equal("|none", seen[1])
  end)

  it("restores the path and phase when forward raises", function()
    context.track(true)
    nn.Linear.forward = function() error("boom") end
    local ok, err = pcall(model, ember.randint(0, 50, {2, 8}))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("boom"))
    assert.are.equal("", core.ctx_module())
    assert.are.equal("none", core.ctx_phase())
  end)

  it("is counted: two holders, two releases", function()
    assert.is_true(context.track(true))
    assert.is_true(context.track(true))
    assert.is_true(context.track(false))
    assert.is_false(context.track(false))
    assert.is_false(context.track(false))
  end)

  it("marks the optimizer phase and restores it", function()
    local p = ember.randn({4}, {requires_grad = true})
    local opt = ember.optim.SGD({p}, {lr = 0.1})
    p:sum():backward()
    local phase
    local real = core.sgd_
    core.sgd_ = function(...) phase = core.ctx_phase() return real(...) end
    local ok, err = pcall(opt.step, opt)
    core.sgd_ = real
    assert.is_true(ok, err)
    assert.are.equal("optimizer", phase)
    assert.are.equal("none", core.ctx_phase())
  end)

  it("is in the backward phase during backward, and none after", function()
    local p = ember.randn({4}, {requires_grad = true})
    local phase
    p:register_post_accumulate_grad_hook(function() phase = core.ctx_phase() end)
    p:mul(2):sum():backward()
    assert.are.equal("backward", phase)
    assert.are.equal("none", core.ctx_phase())
  end)

  it("runs fn in a phase and rejects unknown phases", function()
    assert.are.equal("backward", context.phase("backward", core.ctx_phase))
    assert.are.equal("none", core.ctx_phase())
    assert.has_error(function() context.phase("sideways", print) end,
      'ember.ctx_set_phase: expected "forward", "backward", "optimizer" or "none", got "sideways"')
  end)
end)
