-- gpt2_spec.lua (GPU) — nn.GPT2 on CUDA: the same weights give the CPU's
-- logits (f32, eval mode), bf16 autocast stays close, and a few AdamW steps
-- with dropout lower the loss on the GPU.
local ember = require "ember"
local nn, F = ember.nn, ember.nn.functional

local CFG = {vocab_size = 64, context_length = 32, d_model = 64, num_layers = 2, num_heads = 4, dropout = 0.1}

describe("nn.GPT2 on CUDA", function()
  it("gives the CPU's logits with the same weights (f32 within 1e-4, bf16 autocast within 5e-2)", function()
    ember.manual_seed(11)
    local m = nn.GPT2(CFG)
    m:eval()
    local ids = ember.randint(0, CFG.vocab_size, {2, 20})
    local ref = m(ids)
    m:to("cuda")
    local got = m(ids:cuda())
    assert.are.equal("cuda:0", got.device)
    local scale = ref:abs():max():item()
    assert.is_true((got:cpu() - ref):abs():max():item() <= 1e-4 * math.max(1, scale))
    local half = ember.autocast("bf16", function() return m(ids:cuda()) end)
    assert.is_true((half:to({dtype = "f32", device = "cpu"}) - ref):abs():max():item() <= 5e-2 * math.max(1, scale))
  end)

  it("trains: 30 AdamW steps with dropout under bf16 autocast halve the loss", function()
    ember.manual_seed(12)
    local m = nn.GPT2(CFG)
    m:to("cuda")
    m:train()
    local opt = ember.optim.AdamW(m:parameters(), {lr = 3e-3})
    local ids = ember.randint(0, CFG.vocab_size, {4, CFG.context_length + 1}):cuda()
    local x, y = ids:narrow(1, 0, CFG.context_length), ids:narrow(1, 1, CFG.context_length)
    local first, last
    for step = 1, 30 do
      opt:zero_grad()
      local loss = ember.autocast("bf16", function() return F.cross_entropy(m(x), y) end)
      loss:backward()
      opt:step()
      if step == 1 then first = loss:item() end
      last = loss:item()
    end
    assert.is_true(last < first * 0.5, ("loss %.3f -> %.3f"):format(first, last))
  end)
end)
