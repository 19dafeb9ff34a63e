--- The Lua half of the PyTorch parity check (tests/reference/parity.py).
-- Builds a small reference TransformerLM, runs one batch forward and
-- backward, and writes into --out:
--   weights.safetensors  the state dict, API.md's names (no renaming)
--   case.safetensors     input_ids, targets, logits, loss and one
--                        "grad.<name>" per parameter (all f32 except ids),
--                        metadata: device, precision, seed, config
-- parity.py loads the weights into bench/torch_lm.py's model, runs the same
-- batch and compares.
--
--   ember run tests/reference/write_case.lua --device cuda --precision bf16 --out /tmp/parity/cuda-bf16
local ember = require "ember"
local argparse = require "argparse"
local nn, F = ember.nn, ember.nn.functional

local parser = argparse("write_case.lua", "Write one TransformerLM parity case for parity.py.")
parser:option("--out", "Output directory (created)."):args(1)
parser:option("--device", "cpu or cuda.", "cpu")
parser:option("--precision", "fp32, or bf16 autocast for the forward.", "fp32")
  :choices({"fp32", "bf16"})
parser:option("--attn", "Attention implementation.", "naive"):choices({"naive", "flash"})
parser:option("--seed", "Seed for the weights and the batch.", "1234"):convert(math.tointeger)
local args = parser:parse(arg)
if not args.out then parser:error("--out is required") end

-- Small, but with every feature the big models use: several heads, RoPE,
-- SwiGLU with d_ff != d_model, 2 layers, a vocab that is not a power of two.
local cfg = {vocab_size = 97, context_length = 32, d_model = 64, d_ff = 160, num_layers = 2,
  num_heads = 4, rope_theta = 10000, attn_impl = args.attn, device = args.device}
local B, T = 3, 24

ember.manual_seed(args.seed)
local model = nn.TransformerLM(cfg)
local data = ember.randint(0, cfg.vocab_size, {B, T + 1}, {device = args.device})
local x, y = data:narrow(1, 0, T):contiguous(), data:narrow(1, 1, T):contiguous()

local function fwd()
  local logits = model(x)
  return logits, F.cross_entropy(logits, y)
end
local logits, loss
if args.precision == "bf16" then
  logits, loss = ember.autocast("bf16", fwd)
else
  logits, loss = fwd()
end
loss:backward()

assert(os.execute("mkdir -p '" .. args.out .. "'"), "cannot create " .. args.out)
local weights, case = {}, {
  input_ids = x:cpu(), targets = y:cpu(),
  logits = logits:float():cpu(), loss = loss:float():cpu(),
}
for _, np in ipairs(model:named_parameters()) do
  local name, p = np[1], np[2]
  weights[name] = p:detach():cpu()
  case["grad." .. name] = p.grad:float():cpu()
end
local meta = {device = args.device, precision = args.precision, attn = args.attn,
  seed = tostring(args.seed), batch = tostring(B), context = tostring(T)}
for k, v in pairs(cfg) do if k ~= "device" then meta["cfg." .. k] = tostring(v) end end
ember.save(args.out .. "/weights.safetensors", weights)
ember.save(args.out .. "/case.safetensors", case, {metadata = meta})
print(("write_case: %s %s loss %.6f -> %s"):format(args.device, args.precision, loss:item(), args.out))
