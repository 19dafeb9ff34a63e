--- Generate text with a checkpoint written by scripts/train.lua: the prompt
-- and the continuation stream to stdout as they come; tokens/s (prefill and
-- decode separately) go to stderr.
--
--   ember run scripts/generate.lua --checkpoint runs/tiny --prompt "Once upon a time"
--   ember run scripts/generate.lua --checkpoint runs/small --device cuda --precision bf16 \
--     --max-tokens 200 --temperature 0.8 --top-p 0.95 --num-samples 3
--
-- A checkpoint is a folder: model.safetensors (the model's state_dict, with
-- safetensors metadata `config` = the TransformerLM config as JSON and
-- `step`) and tokenizer.json (tok:save). The work is ember.generate
-- (docs/generation.md): the prompt in one forward filling a KV cache, then
-- one token per step, the step a replayed CUDA graph on CUDA (--no-graph:
-- eager); sampling is temperature, then top-k, then top-p, seeded (sample i
-- uses seed + i - 1). It stops at --max-tokens, at <|endoftext|>, at a
-- --stop string or at the model's context length.
local ember = require "ember"
local argparse = require "argparse"

local script_dir = (arg and arg[0] or ""):match("^(.*/)") or "./"
local S = dofile(script_dir .. "lib/study.lua")

local parser = argparse("generate.lua", "Generate text from a train.lua checkpoint (KV cache, CUDA graph decode).")
parser:option("--checkpoint", "Checkpoint folder (model.safetensors + tokenizer.json)."):args(1)
parser:option("--tokenizer", "Tokenizer JSON instead of the checkpoint's tokenizer.json.")
parser:option("--prompt", "Text to continue (empty: start from <|endoftext|>).", "")
parser:option("--max-tokens", "Tokens to generate at most.", "100"):convert(math.tointeger)
parser:option("--temperature", "Sampling temperature (0: greedy).", "0.8"):convert(tonumber)
parser:option("--top-k", "Keep the k most likely tokens (0: off).", "0"):convert(math.tointeger)
parser:option("--top-p", "Nucleus: keep the most likely tokens up to this mass (1: off).", "0.95"):convert(tonumber)
parser:option("--seed", "Seed of the sampling (sample i uses seed + i - 1).", "0"):convert(math.tointeger)
parser:option("--stop", "Stop when the text contains this string (repeatable)."):count("*")
parser:option("--device", "cpu, cuda or cuda:N (default: cuda when available).")
parser:option("--precision", "Weights in fp32, or converted to bf16.", "fp32"):choices({"fp32", "bf16"})
parser:option("--num-samples", "Independent samples of the same prompt.", "1"):convert(math.tointeger)
parser:flag("--no-graph", "Decode eagerly on CUDA (no CUDA graph).")
parser:flag("--no-cache", "No KV cache: run the whole sequence for every token (slow; for comparisons).")
local args = parser:parse(arg)

local function fail(msg) io.stderr:write("generate.lua: ", msg, "\n") os.exit(2) end
if not args.checkpoint then fail("--checkpoint DIR is required (a folder written by scripts/train.lua)") end
if not args.max_tokens or args.max_tokens < 0 then fail("--max-tokens must be an integer >= 0") end
if not args.temperature or args.temperature < 0 then fail("--temperature must be a number >= 0") end
if not args.top_k or args.top_k < 0 then fail("--top-k must be an integer >= 0") end
if not args.top_p or not (args.top_p > 0 and args.top_p <= 1) then fail("--top-p must be in (0, 1]") end
if not args.seed then fail("--seed must be an integer") end
if not args.num_samples or args.num_samples < 1 then fail("--num-samples must be a positive integer") end
local on_cuda = S.resolve_device(args, fail)
if args.no_graph and not on_cuda then io.stderr:write("generate.lua: --no-graph has no effect on the CPU\n") end

local ok, model, tok, meta = pcall(ember.generate.load, args.checkpoint, {device = args.device,
  dtype = args.precision == "bf16" and "bf16" or nil, tokenizer = args.tokenizer})
if not ok then fail(tostring(model):gsub("^[^%s]+:%d+: ", "")) end
if not tok then fail("no tokenizer: " .. args.checkpoint .. "/tokenizer.json is missing; pass --tokenizer") end
local cfg = model.config
io.stderr:write(("loaded %s: step %s, %.2fM parameters, vocab %d, context %d, d_model %d, %d layers, %d heads; " ..
  "device %s, %s\n"):format(args.checkpoint, tostring(meta.step or "?"), model:num_parameters() / 1e6,
  cfg.vocab_size, cfg.context_length, cfg.d_model, cfg.num_layers, cfg.num_heads, args.device, args.precision))

local function rate(n, s) return s > 0 and ("%.0f tok/s"):format(n / s) or "-" end

for i = 1, args.num_samples do
  if args.num_samples > 1 then io.stdout:write(("--- sample %d (seed %d)\n"):format(i, args.seed + i - 1)) end
  io.stdout:write(args.prompt)
  io.stdout:flush()
  local gen_ok, text, info = pcall(ember.generate, model, tok, args.prompt, {
    max_tokens = args.max_tokens, temperature = args.temperature, top_k = args.top_k, top_p = args.top_p,
    seed = args.seed + i - 1, stop = #args.stop > 0 and args.stop or nil,
    graph = on_cuda and not args.no_graph, cache = not args.no_cache,
    stream = function(piece)
      if piece and piece ~= "" then
        io.stdout:write(piece)
        io.stdout:flush()
      end
    end})
  io.stdout:write("\n")
  io.stdout:flush()
  if not gen_ok then fail(tostring(text):gsub("^[^%s]+:%d+: ", "")) end
  local n_decode = math.max(info.generated_tokens - 1, 0)
  io.stderr:write(("sample %d: %d tokens (%s); prefill %d tokens in %.2f ms (%s); decode %d tokens in %.2f ms (%s)%s%s\n")
    :format(i, info.generated_tokens, info.finish_reason, info.prompt_tokens, info.prefill_s * 1e3,
      rate(info.prompt_tokens, info.prefill_s), n_decode, info.decode_s * 1e3, rate(n_decode, info.decode_s),
      info.graph and (", CUDA graph captured in %.1f ms"):format(info.capture_s * 1e3) or "",
      info.cache and "" or ", no KV cache"))
end
