--- model_flags.lua — what the scripts that train the reference TransformerLM
-- (bench_model.lua, bench_ddp.lua, bench_zero.lua, memory_profile.lua) share,
-- written once so their options, checks and steps cannot drift apart: the
-- model options (--model and its overrides, --vocab, --batch, --context),
-- the nn config they build, a fresh seeded model, the
-- random batch, the loss under autocast, the training step, the timed step loop, and the
-- command line a driver hands on to its ranks. scripts/torch/common.py is
-- the same for the PyTorch twins. Load it with dofile (not a package):
--   local MF = dofile(script_dir .. "lib/model_flags.lua")
local ember = require "ember"
local nn, F = ember.nn, ember.nn.functional

local M = {}

--- The options that pick the model and the batch (argparse parser in).
-- help: {batch =, context =} replaces those two descriptions.
function M.add_options(parser, help)
  help = help or {}
  parser:option("--model", "Model size (nn.configs).", "small"):choices(nn.config_names or
    {"tiny", "small", "medium", "large", "xl", "2.7b"})
  parser:option("--d-model", "Override d_model."):convert(math.tointeger)
  parser:option("--d-ff", "Override d_ff."):convert(math.tointeger)
  parser:option("--layers", "Override num_layers."):convert(math.tointeger)
  parser:option("--heads", "Override num_heads."):convert(math.tointeger)
  parser:option("--vocab", "Vocabulary size.", "10000"):convert(math.tointeger)
  parser:option("--batch", help.batch or "Batch size per GPU (rank).", "4"):convert(math.tointeger)
  parser:option("--context", help.context or "Context length T.", "512"):convert(math.tointeger)
end

--- The nn config of args.model with the overrides given, on args.device, with
-- args.attn as attn_impl when set; context (default args.context) is the
-- context length.
function M.config(args, context)
  local cfg = nn.configs[args.model]{vocab_size = args.vocab, context_length = context or args.context}
  cfg.d_model = args.d_model or cfg.d_model
  cfg.d_ff = args.d_ff or cfg.d_ff
  cfg.num_layers = args.layers or cfg.num_layers
  cfg.num_heads = args.heads or cfg.num_heads
  if args.attn then cfg.attn_impl = args.attn end
  cfg.device = args.device
  return cfg
end

--- The JSON config of a distributed study (the fields Ember's and PyTorch's
-- lines share) with `extra` fields added, and the parameter count.
function M.study_config(study, args, cfg, extra)
  local n_params = nn.count_parameters(cfg)
  local config = {study = study, model = args.model, d_model = cfg.d_model, d_ff = cfg.d_ff,
    layers = cfg.num_layers, heads = cfg.num_heads, vocab = cfg.vocab_size, context = args.context,
    batch = args.batch, precision = args.precision, warmup = args.warmup, steps = args.steps, lr = args.lr,
    seed = args.seed, params = n_params, device_kind = args.device}
  for k, v in pairs(extra or {}) do config[k] = v end
  return config, n_params
end

--- A TransformerLM(cfg) built afresh with `seed`, after a full collection
-- (the previous configuration's tensors freed) and a reset of the peak.
function M.fresh_model(cfg, seed, on_cuda)
  collectgarbage()
  collectgarbage()
  if on_cuda then
    ember.cuda.synchronize()
    ember.cuda.reset_peak_memory_stats()
  end
  ember.manual_seed(seed)
  return nn.TransformerLM(cfg)
end

--- A random (batch, T + 1) token batch from the current seed: inputs x and
-- next-token targets y, each (batch, T).
function M.batch(batch, T, vocab, device)
  local data = ember.randint(0, vocab, {batch, T + 1}, {device = device})
  return data:narrow(1, 0, T), data:narrow(1, 1, T)
end

--- fn() -> cross_entropy(model(x), y), under ember.autocast("bf16") when
-- precision is "bf16" (backward runs outside it, as in PyTorch).
function M.loss_fn(model, x, y, precision)
  local function loss() return F.cross_entropy(model(x), y) end
  if precision == "bf16" then return function() return ember.autocast("bf16", loss) end end
  return loss
end

--- The training step bench_model.lua times (and memory_step.lua records):
-- zero_grad (gradients to nil: backward allocates them fresh), forward()
-- (which marks its own phase), arm(opt) when given (opt:step_in_backward),
-- backward in its phase, then opt:step() when there is an optimizer.
-- Returns the step function; each call returns the loss.
function M.train_step(model, opt, forward, arm)
  local context = ember.context
  return function()
    model:zero_grad()
    local loss = forward()
    if opt and arm then arm(opt) end
    context.phase("backward", loss.backward, loss)
    if opt then opt:step() end     -- the optimizer marks its own phase (the join, with overlap)
    return loss
  end
end

--- ms of each of n calls of step, timed by the host clock between two calls
-- of sync (the device's synchronisation).
function M.timed_steps(step, n, sync)
  local samples = {}
  for i = 1, n do
    sync()
    local t0 = ember.core.clock()
    step()
    sync()
    samples[i] = (ember.core.clock() - t0) * 1e3
  end
  return samples
end

--- {"--model", "small", "--vocab", "10000", ...}: the model options and then
-- `extra` (argument keys, like "lr" or "bucket_mb"), each one args has, as a
-- command line; what a driver hands on to its ranks and the PyTorch twin.
function M.argv(args, extra)
  local out = {}
  local keys = {"model", "d_model", "d_ff", "layers", "heads", "vocab", "batch", "context"}
  for _, k in ipairs(extra or {}) do keys[#keys + 1] = k end
  for _, k in ipairs(keys) do
    if args[k] ~= nil then
      out[#out + 1] = "--" .. k:gsub("_", "-")
      out[#out + 1] = tostring(args[k])
    end
  end
  return out
end

return M
