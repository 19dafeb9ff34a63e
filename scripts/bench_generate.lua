--- Decode throughput of the reference TransformerLM: tokens/s of
-- ember.generate (greedy, one host read of each token, as a real generation
-- loop does) with the KV cache and the decode step as a CUDA graph ("graph"),
-- with the cache eagerly ("cache"), and without a cache, the whole sequence
-- again for every token ("nocache"). --torch runs the same model, modes and
-- loop in PyTorch (scripts/torch/bench_generate.py) and prints its figures
-- beside Ember's.
--
-- --batch B > 1 decodes B random prompts together. ember.generate itself is
-- batch 1 (one prompt, one text), so that loop is the same greedy one written
-- over the API ember.generate is built on: ember.generate.Decoder on an
-- nn.KVCache of batch B (prefill (B, P), then a (B, 1) step per token, CUDA
-- graph included), or the whole (B, T) sequence again for nocache; one host
-- read of the B ids per step. Tokens/s counts every sequence's tokens; the
-- per-sequence rate is beside it. --torch stays batch 1 (its twin has none).
--
--   ember run scripts/bench_generate.lua --model small
--   ember run scripts/bench_generate.lua --model small --torch --json runs/generate.jsonl
--   ember run scripts/bench_generate.lua --model small --batch 8 --modes graph,cache
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
  "Decode tokens/s of the reference TransformerLM (batch 1, or --batch B prompts at once): " ..
  "KV cache + CUDA graph, KV cache, no cache.")
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
parser:option("--batch", "Prompts decoded together. 1: ember.generate (batch 1 only); B > 1: the same greedy " ..
  "loop over ember.generate.Decoder with an nn.KVCache of batch B; tokens/s counts all B sequences.", "1")
  :convert(math.tointeger)
parser:option("--precision", "bf16 (bf16 weights), amp (f32 weights, bf16 autocast) or fp32.", "bf16")
  :choices({"bf16", "amp", "fp32"})
parser:option("--modes", "Comma list of graph, cache, nocache (default: all that apply to the device).")
parser:option("--warmup", "Untimed generations per mode.", "1"):convert(math.tointeger)
parser:option("--reps", "Timed generations per mode (the median is reported).", "3"):convert(math.tointeger)
parser:flag("--check", "With --batch > 1: also generate each prompt alone with ember.generate and say whether " ..
  "every mode's batched sequences equal those (greedy; a near-tie of two logits may differ in bf16).")
parser:option("--device", "cpu or cuda (default: cuda when available).")
parser:option("--seed", "Seed of the weights and the prompt.", "0"):convert(math.tointeger)
parser:flag("--torch", "Also time PyTorch (python3 scripts/torch/bench_generate.py, same model and loop).")
parser:option("--json", "Append one JSON line per mode to this file.")
local args = parser:parse(arg)

local function fail(msg) io.stderr:write("bench_generate.lua: ", msg, "\n") os.exit(2) end
S.check_counts(args, {"vocab", "context", "prompt_len", "tokens", "reps", "seed", "batch"}, fail)
if args.torch and args.batch > 1 then
  fail("--torch compares batch 1 only (scripts/torch/bench_generate.py has no batch): drop --torch or --batch")
end
local B = args.batch
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

ember.manual_seed(args.seed)
local model = nn.TransformerLM(cfg)
if args.precision == "bf16" then model:to("bf16") end
model:eval()
-- the decode step's attention the caches take (EMBER_KV_DECODE: masked, or flash where it applies)
local kv_decode = nn.KVCache(model, {max_len = 1, dtype = args.precision == "amp" and "bf16" or nil}).decode_impl
print(("config: %s d_model=%d d_ff=%d layers=%d heads=%d vocab=%d context=%d params=%.1fM batch=%d " ..
  "prompt=%d tokens=%d precision=%s warmup=%d reps=%d kv_decode=%s"):format(args.model, cfg.d_model, cfg.d_ff,
  cfg.num_layers, cfg.num_heads, cfg.vocab_size, cfg.context_length, n_params / 1e6, B, args.prompt_len,
  args.tokens, args.precision, args.warmup, args.reps, kv_decode))
-- batch 1 draws the prompt as before, so its figures and ids stay comparable
local prompts = B == 1 and {ember.randint(0, cfg.vocab_size, {args.prompt_len}):tolist()}
  or ember.randint(0, cfg.vocab_size, {B, args.prompt_len}):tolist()
local prompt = prompts[1]
local device = model.lm_head.weight.device
local clock = ember.core.clock

--- ember.generate's greedy loop for B prompts at once: (ids[b][i], info) with
-- info as ember.generate's (prefill_s, decode_s, capture_s, graph,
-- generated_tokens). The first token ends the prefill (as there).
local function generate_batch(opts)
  local autocast, n = opts.autocast, opts.max_tokens
  local function forward(f)
    return ember.no_grad(function() if autocast then return ember.autocast(autocast, f) end return f() end)
  end
  local x = ember.tensor(prompts, {dtype = "i64", device = device})
  local ids, info = {}, {graph = false}
  for b = 1, B do ids[b] = {} end
  local dec
  local t0 = clock()
  local ok, err = pcall(function()
    local logits
    if opts.cache then
      local kv = nn.KVCache(model, {batch = B, max_len = args.prompt_len + n,
        dtype = autocast or model.lm_head.weight.dtype})
      dec = ember.generate.Decoder(model, kv, {graph = opts.graph, autocast = autocast})
      logits = dec:prefill(x)
    else
      logits = forward(function() return model(x) end)
    end
    local t_decode
    for i = 1, n do
      local id_t = ember.generate.sample(logits:select(1, logits.shape[2] - 1), {temperature = 0})   -- (B, 1)
      local rows = id_t:tolist()                   -- the one host read per step
      for b = 1, B do ids[b][i] = rows[b][1] end
      if i == 1 then t_decode = ember.generate.end_prefill(info, dec, n > 1, t0) end
      if i == n then break end
      if dec then
        logits = dec:step(id_t)
      else
        x = ember.cat({x, id_t}, 1)
        logits = forward(function() return model(x) end)
      end
    end
    info.decode_s = clock() - t_decode
  end)
  if dec then dec:close() end
  if not ok then error(err, 0) end
  info.generated_tokens = n
  return ids, info
end

--- (ids per sequence, info) of one generation in this mode's options.
local function generate(opts)
  if B > 1 then return generate_batch(opts) end
  local _, info = ember.generate(model, nil, prompt, opts)
  return {info.ids}, info
end

local function median(xs) return require("ember.bench").stats(xs).median end

--- One mode: {decode_tokens_per_s (all B sequences), seq_tokens_per_s, ms_per_token (per step), prefill_ms,
-- capture_ms, samples, ids (of the first rep)} (medians).
local function run_mode(mode)
  local opts = {max_tokens = args.tokens, temperature = 0, eos = false, cache = mode ~= "nocache",
    graph = mode == "graph", autocast = args.precision == "amp" and "bf16" or nil}
  if not on_cuda then opts.graph = nil end
  for _ = 1, args.warmup do generate(opts) end
  local decode_s, prefill_s, capture_s, samples, first_ids = {}, {}, {}, {}, nil
  for r = 1, args.reps do
    S.free_all(false)
    local ids, info = generate(opts)
    first_ids = first_ids or ids
    if info.generated_tokens ~= args.tokens then
      error(("generated %d tokens, expected %d (%s)"):format(info.generated_tokens, args.tokens, info.finish_reason))
    end
    decode_s[r], prefill_s[r], capture_s[r] = info.decode_s, info.prefill_s, info.capture_s or 0
    samples[r] = B * (args.tokens - 1) / info.decode_s
    io.stdout:write(("  %-8s rep %d/%d: %8.1f tokens/s decode%s, prefill %.2f ms%s\n"):format(mode, r, args.reps,
      samples[r], B > 1 and (" (%d x %.1f)"):format(B, samples[r] / B) or "", info.prefill_s * 1e3,
      info.graph and (", graph captured in %.1f ms"):format(info.capture_s * 1e3) or ""))
  end
  local d = median(decode_s)
  return {decode_tokens_per_s = B * (args.tokens - 1) / d, seq_tokens_per_s = (args.tokens - 1) / d,
    ms_per_token = d * 1e3 / (args.tokens - 1), prefill_ms = median(prefill_s) * 1e3,
    capture_ms = median(capture_s) * 1e3, samples_tokens_per_s = samples, ids = first_ids}
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

-- Greedy ids of the modes side by side: the same unless two logits nearly tie
-- (bf16, or another summation order), so a difference is shown, not fatal.
local function first_difference(a, b)
  for s = 1, #a do
    for i = 1, #a[s] do
      if a[s][i] ~= b[s][i] then return s, i end
    end
  end
end
local ref
for _, mode in ipairs(modes) do
  local ids = results[mode].ids
  if ids and not ref then
    ref = mode
  elseif ids then
    local s, i = first_difference(results[ref].ids, ids)
    print(s and ("ids: %s and %s differ first at sequence %d, token %d"):format(ref, mode, s, i)
      or ("ids: %s and %s generate the same %d x %d tokens"):format(ref, mode, B, args.tokens))
  end
end

if args.check and B > 1 then
  local alone = {}
  for b = 1, B do
    local _, info = ember.generate(model, nil, prompts[b], {max_tokens = args.tokens, temperature = 0, eos = false,
      graph = false, autocast = args.precision == "amp" and "bf16" or nil})
    alone[b] = info.ids
  end
  for _, mode in ipairs(modes) do
    local ids = results[mode].ids
    if ids then
      local s, i = first_difference(alone, ids)
      print(s and ("check: %s: sequence %d differs from ember.generate's (batch 1) first at token %d"):format(mode, s, i)
        or ("check: %s: all %d sequences equal ember.generate's, one prompt at a time"):format(mode, B))
    end
  end
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
if B == 1 then
  print("| mode | decode tokens/s | ms/token | prefill ms | graph capture ms | torch tokens/s | torch ms/token |")
  print("|---|---|---|---|---|---|---|")
else
  print(("| mode | decode tokens/s (batch %d) | tokens/s per sequence | ms/step | prefill ms | graph capture ms |")
    :format(B))
  print("|---|---|---|---|---|---|")
end
for _, mode in ipairs(modes) do
  local r, t = results[mode], torch[mode]
  local function num(v, f) return v and (f):format(v) or "-" end
  local head = ("| %s | %s | %s"):format(mode, r.status and r.status or num(r.decode_tokens_per_s, "%.1f"),
    B > 1 and (num(r.seq_tokens_per_s, "%.1f") .. " | ") or "")
  print(head .. ("%s | %s | %s |"):format(num(r.ms_per_token, "%.3f"), num(r.prefill_ms, "%.2f"),
    mode == "graph" and num(r.capture_ms, "%.1f") or "-") .. (B > 1 and "" or (" %s | %s |"):format(
    t and (t.decode_tokens_per_s and ("%.1f"):format(t.decode_tokens_per_s) or (t.status or "error")) or "-",
    t and num(t.ms_per_token, "%.3f") or "-")))
  if args.json then
    S.append_json(args.json, {tool = "ember", study = "generate", mode = mode, commit = facts.commit,
      device = facts.device, driver = facts.driver, date = facts.date, host = facts.host,
      config = {model = args.model, d_model = cfg.d_model, d_ff = cfg.d_ff, layers = cfg.num_layers,
        heads = cfg.num_heads, vocab = cfg.vocab_size, context = cfg.context_length, params = n_params, batch = B,
        prompt_len = args.prompt_len, tokens = args.tokens, precision = args.precision, warmup = args.warmup,
        reps = args.reps, seed = args.seed, device_kind = args.device, kv_decode = kv_decode},
      status = r.status or "ok", error = r.error, decode_tokens_per_s = r.decode_tokens_per_s,
      seq_tokens_per_s = r.seq_tokens_per_s, ms_per_token = r.ms_per_token, prefill_ms = r.prefill_ms, capture_ms = mode == "graph" and r.capture_ms or nil,
      samples_tokens_per_s = r.samples_tokens_per_s, torch = t}, fail)
  end
end
local best = results.graph or results.cache
if best and best.decode_tokens_per_s and args.model == "small" and args.precision == "bf16" and B == 1 then
  print(("target: >= 1000 tokens/s (small, bf16, batch 1, KV cache, H100); here %.0f tokens/s with the %s"):format(
    best.decode_tokens_per_s, results.graph and "cache and the graph" or "cache"))
end
