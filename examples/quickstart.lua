-- Ember quickstart: build a tiny LLaMA-style LM, train it a few steps on one
-- batch, watch the loss fall.   ember run examples/quickstart.lua
local ember = require "ember"
local nn, optim = ember.nn, ember.optim

ember.manual_seed(0)
local cfg = nn.configs.tiny{vocab_size = 256, context_length = 32}
local model = nn.TransformerLM(cfg)
print(("model: %d parameters, d_model %d, %d layers"):format(model:num_parameters(), cfg.d_model, cfg.num_layers))

local opt = optim.AdamW(model:parameters(), {lr = 1e-2, weight_decay = 0.01})
local x = ember.randint(0, cfg.vocab_size, {4, 33})
local inputs, targets = x:narrow(1, 0, 32), x:narrow(1, 1, 32)

for step = 1, 30 do
  local logits = model(inputs)                                -- (4, 32, 256)
  local loss = ember.nn.functional.cross_entropy(logits, targets)
  opt:zero_grad()
  loss:backward()
  ember.nn.utils.clip_grad_norm(model:parameters(), 1.0)
  opt:step()
  if step == 1 or step % 5 == 0 then print(("step %2d  loss %.4f"):format(step, loss:item())) end
end
