--- Decode throughput of the reference TransformerLM, batch 1: tokens/s of
-- ember.generate (greedy, one host read of each token, as a real generation
-- loop does) with the KV cache and the decode step as a CUDA graph ("graph"),
-- with the cache eagerly ("cache"), and without a cache, the whole sequence
-- again for every token ("nocache"). --torch runs the same model, modes and
-- loop in PyTorch (scripts/torch/bench_generate.py) and prints its figures
-- beside Ember's.
--
--   ember run scripts/bench_generate.lua --model small
--   ember run scripts/bench_generate.lua --model small --torch --json runs/generate.jsonl
--   ember run scripts/bench_generate.lua --model tiny --device cpu --modes cache,nocache --tokens 32
--
-- Each mode: --warmup untimed generations, then --reps timed ones; a run
-- prefills a random prompt of --prompt-len tokens and generates --tokens
-- tokens (no end-of-text stop). Decode tokens/s = (tokens - 1) / the time
-- from the first generated token to the last (the prefill, which yields the
-- first token, and the graph capture are timed apart); the median of the
-- reps is reported. --precision bf16 converts the weights to bf16 (the KV
-- cache is bf16 too); amp keeps f32 weights under ember.autocast("bf16");
-- fp32 is f32 throughout. Target (issue 13): >= 1000 tokens/s for small,
-- bf16, batch 1, with the cache, on an H100.
local ember = require "ember"
local argparse = require "argparse"
local nn = ember.nn

local script_dir = (arg and arg[0] or ""):match("^(.*/)") or "./"
local MF = dofile(script_dir .. "lib/model_flags.lua")
local S = dofile(script_dir .. "lib/study.lua")
local root = script_dir .. "../"

local parser = argparse("bench_generate.lua",
  "Decode tokens/s of the reference TransformerLM at batch 1: KV cache + CUDA graph, KV cache, no cache.")
parser:option("--model", "Model size (nn.configs).", "small"):choices(nn.config_names or
  {"tiny", "small", "medium", "large", "xl", "2.7b"})
parser:option("--d-model", "Override d_model."):convert(math.tointeger)
parser:option("--d-ff", "Override d_ff."):convert(math.tointeger)
parser:option("--layers", "Override num_layers."):convert(math.tointeger)
parser:option("--heads", "Override num_heads."):convert(math.tointeger)
parser:option("--vocab", "Vocabulary size.", "10000"):convert(math.tointeger)
parser:option("--context", "The model's context length (the KV cache holds prompt + tokens).", "1024")
  :convert(math.tointeger)
parser:option("--prompt-len", "Tokens of the (random) prompt.", "64"):convert(math.tointeger)
parser:option("--tokens", "Tokens generated per run.", "256"):convert(math.tointeger)
parser:option("--precision", "bf16 (bf16 weights), amp (f32 weights, bf16 autocast) or fp32.", "bf16")
  :choices({"bf16", "amp", "fp32"})
parser:option("--modes", "Comma list of graph, cache, nocache (default: all that apply to the device).")
parser:option("--warmup", "Untimed generations per mode.", "1"):convert(math.tointeger)
parser:option("--reps", "Timed generations per mode (the median is reported).", "3"):convert(math.tointeger)
parser:option("--device", "cpu or cuda (default: cuda when available).")
parser:option("--seed", "Seed of the weights and the prompt.", "0"):convert(math.tointeger)
parser:flag("--torch", "Also time PyTorch (python3 scripts/torch/bench_generate.py, same model and loop).")
parser:option("--json", "Append one JSON line per mode to this file.")
local args = parser:parse(arg)

local function fail(msg) io.stderr:write("bench_generate.lua: ", msg, "\n") os.exit(2) end
S.check_counts(args, {"vocab", "context", "prompt_len", "tokens", "reps", "seed"}, fail)
local on_cuda = S.resolve_device(args, fail)
if args.prompt_len + args.tokens > args.context then
  fail(("--prompt-len + --tokens (%d) must fit in --context (%d)"):format(args.prompt_len + args.tokens, args.context))
end
local MODES = {graph = true, cache = true, nocache = true}
local modes = {}
for m in (args.modes or (on_cuda and "graph,cache,nocache" or "cache,nocache")):gmatch("[^,]+") do
  if not MODES[m] then fail("--modes expects a comma list of graph, cache, nocache, got '" .. m .. "'") end
  if m == "graph" and not on_cuda then fail("--modes graph needs --device cuda") end
  modes[#modes + 1] = m
end

local cfg = MF.config(args)
local facts = require("ember.runinfo").collect(args.device)
local n_params = nn.count_parameters(cfg)
S.print_header(facts)
print(("config: %s d_model=%d d_ff=%d layers=%d heads=%d vocab=%d context=%d params=%.1fM batch=1 " ..
  "prompt=%d tokens=%d precision=%s warmup=%d reps=%d"):format(args.model, cfg.d_model, cfg.d_ff, cfg.num_layers,
  cfg.num_heads, cfg.vocab_size, cfg.context_length, n_params / 1e6, args.prompt_len, args.tokens,
  args.precision, args.warmup, args.reps))

ember.manual_seed(args.seed)
local model = nn.TransformerLM(cfg)
if args.precision == "bf16" then model:to("bf16") end
model:eval()
local prompt = ember.randint(0, cfg.vocab_size, {args.prompt_len}):tolist()

local function median(xs)
  local s = table.move(xs, 1, #xs, 1, {})
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
end

--- One mode: {decode_tokens_per_s, ms_per_token, prefill_ms, capture_ms, samples} (medians).
local function run_mode(mode)
  local opts = {max_tokens = args.tokens, temperature = 0, eos = false, cache = mode ~= "nocache",
    graph = mode == "graph", autocast = args.precision == "amp" and "bf16" or nil}
  if not on_cuda then opts.graph = nil end
  for _ = 1, args.warmup do ember.generate(model, nil, prompt, opts) end
  local decode_s, prefill_s, capture_s, samples = {}, {}, {}, {}
  for r = 1, args.reps do
    S.free_all(false)
    local _, info = ember.generate(model, nil, prompt, opts)
    if info.generated_tokens ~= args.tokens then
      error(("generated %d tokens, expected %d (%s)"):format(info.generated_tokens, args.tokens, info.finish_reason))
    end
    decode_s[r], prefill_s[r], capture_s[r] = info.decode_s, info.prefill_s, info.capture_s or 0
    samples[r] = (args.tokens - 1) / info.decode_s
    io.stdout:write(("  %-8s rep %d/%d: %8.1f tokens/s decode, prefill %.2f ms%s\n"):format(mode, r, args.reps,
      samples[r], info.prefill_s * 1e3, info.graph and (", graph captured in %.1f ms"):format(info.capture_s * 1e3)
      or ""))
  end
  local d = median(decode_s)
  return {decode_tokens_per_s = (args.tokens - 1) / d, ms_per_token = d * 1e3 / (args.tokens - 1),
    prefill_ms = median(prefill_s) * 1e3, capture_ms = median(capture_s) * 1e3, samples_tokens_per_s = samples}
end

local results = {}
for _, mode in ipairs(modes) do
  local ok, r = pcall(run_mode, mode)
  if ok then
    results[mode] = r
  else
    results[mode] = {status = S.failure_status(r), error = tostring(r)}
    io.stderr:write(("bench_generate.lua: %s: %s\n"):format(mode, tostring(r)))
  end
  S.free_all(on_cuda)
end

-- PyTorch's figures: the twin prints one JSON line per mode
local torch = {}
if args.torch then
  local cjson = require "cjson"
  local argv = MF.argv(args, {"prompt_len", "tokens", "precision", "warmup", "reps", "seed"})
  local q = {}
  for i, a in ipairs(argv) do q[i] = "'" .. a:gsub("'", "'\\''") .. "'" end
  local cmd = ("EMBER_COMMIT=%s python3 %sscripts/torch/bench_generate.py %s --modes %s --device %s 2>&1")
    :format(facts.commit, root, table.concat(q, " "), table.concat(modes, ","), args.device)
  print("pytorch: " .. cmd)
  local pipe = io.popen(cmd)
  for line in pipe:lines() do
    local ok, rec = pcall(cjson.decode, line)
    if ok and type(rec) == "table" and rec.mode then torch[rec.mode] = rec
    elseif line:match("%S") then print("  torch| " .. line) end
  end
  pipe:close()
end

for _, mode in ipairs(modes) do   -- a failed PyTorch mode says why (the table has one word)
  local t = torch[mode]
  if t and t.error then print(("  torch| %s: %s: %s"):format(mode, t.status or "error", t.error)) end
end
print()
print("| mode | decode tokens/s | ms/token | prefill ms | graph capture ms | torch tokens/s | torch ms/token |")
print("|---|---|---|---|---|---|---|")
for _, mode in ipairs(modes) do
  local r, t = results[mode], torch[mode]
  local function num(v, f) return v and (f):format(v) or "-" end
  print(("| %s | %s | %s | %s | %s | %s | %s |"):format(mode, r.status and r.status or num(r.decode_tokens_per_s, "%.1f"),
    num(r.ms_per_token, "%.3f"), num(r.prefill_ms, "%.2f"), mode == "graph" and num(r.capture_ms, "%.1f") or "-",
    t and (t.decode_tokens_per_s and ("%.1f"):format(t.decode_tokens_per_s) or (t.status or "error")) or "-",
    t and num(t.ms_per_token, "%.3f") or "-"))
  if args.json then
    S.append_json(args.json, {tool = "ember", study = "generate", mode = mode, commit = facts.commit,
      device = facts.device, driver = facts.driver, date = facts.date, host = facts.host,
      config = {model = args.model, d_model = cfg.d_model, d_ff = cfg.d_ff, layers = cfg.num_layers,
        heads = cfg.num_heads, vocab = cfg.vocab_size, context = cfg.context_length, params = n_params, batch = 1,
        prompt_len = args.prompt_len, tokens = args.tokens, precision = args.precision, warmup = args.warmup,
        reps = args.reps, seed = args.seed, device_kind = args.device},
      status = r.status or "ok", error = r.error, decode_tokens_per_s = r.decode_tokens_per_s,
      ms_per_token = r.ms_per_token, prefill_ms = r.prefill_ms, capture_ms = mode == "graph" and r.capture_ms or nil,
      samples_tokens_per_s = r.samples_tokens_per_s, torch = t}, fail)
  end
end
local best = results.graph or results.cache
if best and best.decode_tokens_per_s and args.model == "small" and args.precision == "bf16" then
  print(("target: >= 1000 tokens/s (small, bf16, batch 1, KV cache, H100); here %.0f tokens/s with the %s"):format(
    best.decode_tokens_per_s, results.graph and "cache and the graph" or "cache"))
end
