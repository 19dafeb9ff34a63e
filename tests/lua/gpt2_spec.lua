-- gpt2_spec.lua — nn.GPT2, a GPT-2-style model built only from public ops
-- (layer_norm, gelu tanh, dropout, learned positions, tied head): its shapes,
-- names and initialisation, eval-mode determinism, dropout in train mode, and
-- a few AdamW steps on the CPU that must bring the loss down.
local ember = require "ember"
local nn, F = ember.nn, ember.nn.functional

local CFG = {vocab_size = 48, context_length = 16, d_model = 32, num_layers = 2, num_heads = 4, dropout = 0.1}

local function tiny(over)
  local c = {}
  for k, v in pairs(CFG) do c[k] = v end
  for k, v in pairs(over or {}) do c[k] = v end
  ember.manual_seed(7)
  return nn.GPT2(c)
end

describe("nn.GPT2", function()
  it("maps (B, T) ids to (B, T, vocab) logits and (T) ids to (T, vocab)", function()
    local m = tiny()
    m:eval()
    local ids = ember.randint(0, CFG.vocab_size, {3, 10})
    assert.same({3, 10, CFG.vocab_size}, m(ids).shape)
    assert.same({10, CFG.vocab_size}, m(ids:select(0, 1)).shape)
  end)

  it("has GPT-2's parameter names, a tied head and GPT-2's initialisation", function()
    local m = tiny({num_layers = 4})
    local names, n = {}, 0
    for _, np in ipairs(m:named_parameters()) do names[np[1]] = np[2]; n = n + 1 end
    for _, want in ipairs({"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias", "h.0.attn.c_attn.weight",
                           "h.0.attn.c_attn.bias", "h.3.attn.c_proj.weight", "h.3.mlp.c_fc.weight",
                           "h.3.mlp.c_proj.bias", "ln_f.weight", "ln_f.bias"}) do
      assert.is_not_nil(names[want], want)
    end
    assert.are.equal(2 + 4 * 12 + 2, n, "no separate lm_head weight: the head is wte")
    local function std(t) return t:to("f64"):var():item() ^ 0.5 end
    assert.near(0.02, std(names["h.0.attn.c_attn.weight"]), 0.004)
    assert.near(0.02 / math.sqrt(8), std(names["h.3.attn.c_proj.weight"]), 0.0015)
    assert.are.equal(0, names["h.0.attn.c_attn.bias"]:abs():sum():item())
    assert.are.equal(CFG.d_model, names["ln_f.weight"]:sum():item(), "LayerNorm weights start at 1")
  end)

  it("is deterministic in eval mode and draws dropout masks in train mode", function()
    local m = tiny({dropout = 0.5})
    local ids = ember.randint(0, CFG.vocab_size, {2, 8})
    m:eval()
    assert.are.equal(0, (m(ids) - m(ids)):abs():max():item())
    m:train()
    assert.is_true((m(ids) - m(ids)):abs():max():item() > 0, "two train-mode forwards drew the same masks")
  end)

  it("learns: 40 AdamW steps on a fixed batch cut the loss to under half", function()
    local m = tiny({dropout = 0})
    m:train()
    local opt = ember.optim.AdamW(m:parameters(), {lr = 3e-3, weight_decay = 0.01})
    ember.manual_seed(3)
    local ids = ember.randint(0, CFG.vocab_size, {4, CFG.context_length + 1})
    local x, y = ids:narrow(1, 0, CFG.context_length), ids:narrow(1, 1, CFG.context_length)
    local first, last
    for step = 1, 40 do
      opt:zero_grad()
      local loss = F.cross_entropy(m(x), y)
      loss:backward()
      opt:step()
      if step == 1 then first = loss:item() end
      last = loss:item()
    end
    assert.is_true(first > math.log(CFG.vocab_size) * 0.8, "the first loss should be near log(vocab)")
    assert.is_true(last < first * 0.5, ("loss %.3f -> %.3f"):format(first, last))
  end)

  it("refuses a bad config and a sequence past its context, naming them", function()
    assert.error_matches(function() nn.GPT2({vocab_size = 10, context_length = 8, d_model = 30, num_layers = 1,
      num_heads = 4}) end, "ember.nn.GPT2: expected d_model divisible by num_heads, got d_model 30 and num_heads 4",
      1, true)
    assert.error_matches(function() nn.GPT2({vocab_size = 10, context_length = 8, d_model = 32, num_layers = 0,
      num_heads = 4}) end, "ember.nn.GPT2: expected cfg.num_layers to be a positive integer, got 0", 1, true)
    assert.error_matches(function() tiny({dropout = 1}) end, "expected cfg.dropout in [0, 1), got 1", 1, true)
    local m = tiny()
    assert.error_matches(function() m(ember.zeros({1, 17}, {dtype = "i64"})) end,
      "ember.nn.GPT2: expected at most context_length = 16 tokens, got 17", 1, true)
  end)
end)
