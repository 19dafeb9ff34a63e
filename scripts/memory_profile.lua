--- Memory study of CS336 A2 §1.1.6 (memory_profiling): peak device memory of
-- the reference TransformerLM (2.7b by default) for forward-only runs and
-- full training steps, over context lengths and precisions, plus the size of
-- one residual-stream activation. Out of memory is a result ("OOM").
--
--   ember run scripts/memory_profile.lua                                 # 2.7b, ctx 128/256/512, fp32 + bf16
--   ember run scripts/memory_profile.lua --model xl --context 512 --mode train --precision bf16 --json mem.jsonl
--   ember run scripts/memory_profile.lua --snapshot snapshots/           # + one memory-history file per configuration
--   ember run scripts/memory_profile.lua --device cpu --model tiny --context 16,32 --vocab 256   # CPU: memory n/a
--
-- One configuration (precision, mode, context): everything from the previous
-- one freed (full GC, ember.cuda.empty_cache), a fresh model (and AdamW for
-- train) built with the seed, a random (batch, context + 1) batch, then
--   --warmup steps (so lazily made state — AdamW's moments, matmul workspaces
--                   — exists, as in a running training loop),
--   model:zero_grad()                 (gradients dropped: set to nil),
--   at step start = ember.cuda.memory_allocated()
--   ember.cuda.reset_peak_memory_stats(); one step; synchronise
--   peak          = ember.cuda.max_memory_allocated()
-- Steps are bench_model.lua's: fwd = forward + loss under ember.no_grad
-- (inference: no activations kept for a backward); fwd_bwd = forward, loss,
-- backward; train = fwd_bwd + AdamW step. bf16 = ember.autocast("bf16")
-- around forward and loss (backward outside), f32 master weights and state.
--
-- What the static part should be (N parameters, f32): weights 4N bytes,
-- gradients 4N, AdamW moments 8N — a training step starts at 12N (weights +
-- moments, gradients dropped) and peaks at 16N + activations.
-- Residual stream: one (batch, context, d_model) activation is
--   batch · context · d_model · bytes per element   (f32: 4, bf16: 2)
-- printed for each context; under bf16 autocast the residual stream itself
-- stays f32 (x + attn(x) adds a bf16 output to the f32 stream), the matmul
-- outputs are bf16.
--
-- --snapshot DIR records the allocator's history for each configuration
-- (from after the model is built, through the warm-up and the measured step)
-- and writes DIR/<model>_<mode>_<precision>_ctx<T>.json. It needs
-- ember.memory.record_history and ember.memory.snapshot;
-- without them it stops with a message saying so.
local ember = require "ember"
local argparse = require "argparse"
local nn, optim = ember.nn, ember.optim

local script_dir = (arg and arg[0] or ""):match("^(.*/)") or "./"
local S = dofile(script_dir .. "lib/study.lua")
local MF = dofile(script_dir .. "lib/model_flags.lua")

local parser = argparse("memory_profile.lua",
  "Peak memory of forward-only runs and training steps of the reference TransformerLM.")
parser:option("--model", "Model size (nn.configs).", "2.7b"):choices(nn.config_names)
parser:option("--context", "Comma list of context lengths.", "128,256,512")
parser:option("--mode", "Comma list of fwd, fwd_bwd, train.", "fwd,train")
parser:option("--precision", "Comma list of fp32, bf16 (bf16 = autocast).", "fp32,bf16")
parser:option("--batch", "Batch size.", "4"):convert(math.tointeger)
parser:option("--vocab", "Vocabulary size.", "10000"):convert(math.tointeger)
parser:option("--warmup", "Steps before the measured one.", "1"):convert(math.tointeger)
parser:option("--attn", "Attention: auto, flash or naive.", "auto"):choices({"auto", "flash", "naive"})
parser:option("--device", "cpu or cuda[:N] (default: cuda when available).")
parser:option("--seed", "Seed for weights and batch.", "0"):convert(math.tointeger)
parser:option("--lr", "AdamW learning rate.", "1e-4"):convert(tonumber)
parser:option("--snapshot", "Write one memory-history snapshot per configuration into this directory.")
parser:option("--json", "Append one JSON line per configuration to this file.")
parser:option("--markdown", "Write the tables to this Markdown file.")
local args = parser:parse(arg)

local function fail(msg) io.stderr:write("memory_profile.lua: ", msg, "\n") os.exit(2) end

local function word_list(opt, s, allowed, alias)
  local out = {}
  for item in (s .. ","):gmatch("([^,]*),") do
    item = alias and alias[item] or item
    if not allowed[item] then
      fail(("--%s expects a comma list of %s; got '%s'"):format(opt, table.concat(allowed, ", "), s))
    end
    out[#out + 1] = item
  end
  return out
end
local function set(list) for _, v in ipairs(list) do list[v] = true end return list end

local CONTEXTS = S.int_list("context", args.context, fail)
local MODES = word_list("mode", args.mode, set({"fwd", "fwd_bwd", "train"}))
local PRECISIONS = word_list("precision", args.precision, set({"fp32", "bf16"}), {f32 = "fp32"})
S.check_counts(args, {"batch", "vocab", "seed"}, fail)
local on_cuda = S.resolve_device(args, fail)
if args.attn == "flash" and not on_cuda then fail("--attn flash needs --device cuda") end

-- ---------------------------------------------------------------------------
-- memory history (ember.memory, when this build has it)

local function memory_api()
  local mem = rawget(ember, "memory") or ember.memory
  if type(mem) ~= "table" then
    local ok, m = pcall(require, "ember.memory")
    mem = ok and m or nil
  end
  if type(mem) ~= "table" or type(mem.record_history) ~= "function" or type(mem.snapshot) ~= "function" then
    return nil
  end
  return mem
end

local mem_api
if args.snapshot then
  mem_api = memory_api()
  if not mem_api then
    fail("--snapshot needs ember.memory.record_history and ember.memory.snapshot, " ..
      "which this build does not have; run without --snapshot, or on a build with memory history")
  end
  if not os.execute("mkdir -p '" .. args.snapshot:gsub("'", "'\\''") .. "'") then
    fail("cannot create the directory " .. args.snapshot)
  end
end

--- Write the recorded history to path (JSON; memviz.lua reads it).
local function write_snapshot(path) return mem_api.snapshot(path) end

-- ---------------------------------------------------------------------------
-- header

local base_cfg = nn.configs[args.model]{vocab_size = args.vocab}
local N = nn.count_parameters(base_cfg)
local B, D = args.batch, base_cfg.d_model
local GiB, MiB = 2 ^ 30, 2 ^ 20
local runinfo = require "ember.runinfo"
local facts = runinfo.collect(args.device)
S.print_header(facts)
print(("config: %s d_model=%d d_ff=%d layers=%d heads=%d vocab=%d batch=%d context=%s mode=%s precision=%s " ..
  "attn=%s warmup=%d snapshot=%s params=%.1fM")
  :format(args.model, D, base_cfg.d_ff, base_cfg.num_layers, base_cfg.num_heads, args.vocab, B, args.context,
    table.concat(MODES, ","), table.concat(PRECISIONS, ","), args.attn, args.warmup, args.snapshot or "no", N / 1e6))
local function human(b) return b >= GiB and ("%.2f GiB"):format(b / GiB) or ("%.2f MiB"):format(b / MiB) end
print(("static memory, N = %d parameters in f32: weights 4N = %s, gradients 4N = %s, AdamW moments 8N = %s")
  :format(N, human(4 * N), human(4 * N), human(8 * N)))

-- ---------------------------------------------------------------------------
-- one configuration

local function sync() if on_cuda then ember.cuda.synchronize() end end
local function free_all() S.free_all(on_cuda) end

local function measure(prec, mode, T)
  free_all()
  local cfg = MF.config(args, T)
  ember.manual_seed(args.seed)
  local model = nn.TransformerLM(cfg)
  local opt = mode == "train" and optim.AdamW(model:parameters(), {lr = args.lr}) or nil
  local x, y = MF.batch(B, T, args.vocab, args.device)
  local forward = MF.loss_fn(model, x, y, prec)
  local step
  if mode == "fwd" then
    step = function() ember.no_grad(forward) end
  else
    step = function()
      model:zero_grad()
      local loss = forward()
      loss:backward()
      if opt then opt:step() end
    end
  end

  local snap_path
  if mem_api then
    snap_path = ("%s/%s_%s_%s_ctx%d.json"):format(args.snapshot, args.model, mode, prec, T)
    mem_api.record_history(true, {max_entries = 1000000})
  end
  local ok, err = pcall(function()
    for _ = 1, args.warmup do step() end
    model:zero_grad()
    collectgarbage()
    collectgarbage()
    sync()
  end)
  local r = {}
  if ok then
    if on_cuda then
      ember.cuda.reset_peak_memory_stats()
      r.start = ember.cuda.memory_allocated()
    end
    ok, err = pcall(function()
      step()
      sync()
    end)
    if ok and on_cuda then r.peak, r.after = ember.cuda.max_memory_allocated(), ember.cuda.memory_allocated() end
  end
  if mem_api then
    -- the snapshot is written also when the step ran out of memory: that is when it is wanted
    local sok, serr = pcall(write_snapshot, snap_path)
    mem_api.record_history(false)
    if sok then r.snapshot = snap_path else print("snapshot failed: " .. tostring(serr)) end
  end
  if not ok then error(err, 0) end
  return r
end

-- ---------------------------------------------------------------------------
-- the grid

local function gib(b) return b and ("%.2f"):format(b / GiB) or "n/a" end
local cjson = args.json and require "cjson" or nil
local json_file = S.open_json(args.json, fail)

local results, any_error = {}, false
for _, prec in ipairs(PRECISIONS) do
  for _, mode in ipairs(MODES) do
    for _, T in ipairs(CONTEXTS) do
      local ok, r = pcall(measure, prec, mode, T)
      free_all()
      if ok then r.status = "ok"
      else
        local msg = tostring(r)
        r = {status = S.failure_status(msg), error = msg}
        any_error = any_error or r.status == "error"
      end
      r.precision, r.mode, r.context = prec, mode, T
      results[#results + 1] = r
      local head = ("%-4s %-7s context %-5d"):format(prec, mode, T)
      if r.status == "ok" and not on_cuda then
        print(("%s ok (memory n/a: the CPU keeps no allocator statistics)"):format(head))
      elseif r.status == "ok" then
        print(("%s at step start %s GiB   peak %s GiB   peak − start %s GiB%s"):format(head, gib(r.start), gib(r.peak),
          r.peak and gib(r.peak - r.start) or "n/a", r.snapshot and ("   snapshot " .. r.snapshot) or ""))
      else
        print(("%s %s (%s)"):format(head, r.status, (r.error:gsub("\n.*", ""))))
      end
      if json_file then
        local line = {
          tool = "ember", commit = facts.commit, device = facts.device, driver = facts.driver or cjson.null,
          date = os.date("!%Y-%m-%dT%H:%M:%SZ"), model = args.model, d_model = D, params = N, batch = B,
          vocab = args.vocab, context = T, mode = mode, precision = prec, attn = args.attn, warmup = args.warmup,
          status = r.status, error = r.error or cjson.null,
          start_bytes = r.start or cjson.null, peak_bytes = r.peak or cjson.null,
          after_bytes = r.after or cjson.null, snapshot = r.snapshot or cjson.null,
          command = "ember run scripts/memory_profile.lua " .. table.concat(arg, " "),
        }
        json_file:write(cjson.encode(line), "\n")
        json_file:flush()
      end
    end
  end
end
if json_file then json_file:close() end

-- ---------------------------------------------------------------------------
-- tables

local md_table = require("ember.report").text_table

local function cell(r, field)
  if r.status ~= "ok" then return r.status end
  return gib(r[field])
end

local md = {}
local function emit(s) print(s) md[#md + 1] = s end

-- peak memory: rows context, columns mode × precision (the assignment's table)
local headers, by = {"context"}, {}
for _, r in ipairs(results) do by[r.precision .. "/" .. r.mode .. "/" .. r.context] = r end
for _, prec in ipairs(PRECISIONS) do
  for _, mode in ipairs(MODES) do headers[#headers + 1] = ("%s %s"):format(mode, prec) end
end
local rows = {}
for _, T in ipairs(CONTEXTS) do
  local row = {tostring(T)}
  for _, prec in ipairs(PRECISIONS) do
    for _, mode in ipairs(MODES) do row[#row + 1] = cell(by[prec .. "/" .. mode .. "/" .. T], "peak") end
  end
  rows[#rows + 1] = row
end
emit("")
emit(("Peak memory (GiB, ember.cuda.max_memory_allocated over one step), %s, batch %d%s")
  :format(args.model, B, on_cuda and "" or " — n/a: the CPU keeps no allocator statistics"))
emit("")
emit(md_table(headers, rows))

-- every figure per configuration
local detail = {}
for _, r in ipairs(results) do
  detail[#detail + 1] = {r.precision, r.mode, tostring(r.context), cell(r, "start"), cell(r, "peak"),
    r.status == "ok" and (r.peak and gib(r.peak - r.start) or "n/a") or r.status}
end
emit("")
emit(md_table({"precision", "mode", "context", "at step start GiB", "peak GiB", "peak − start GiB"}, detail))

-- residual stream
emit("")
emit(("One residual-stream activation = batch · context · d_model · bytes per element (d_model %d, batch %d):"):format(D, B))
for _, T in ipairs(CONTEXTS) do
  local n = B * T * D
  emit(("- context %d: %d·%d·%d = %d elements → f32 %d B = %.2f MiB, bf16 %.2f MiB"):format(T, B, T, D, n, 4 * n,
    4 * n / MiB, 2 * n / MiB))
end
emit("(under bf16 autocast the residual stream stays f32; the matmul outputs are bf16)")

if args.markdown then S.write_markdown(args.markdown, facts, md, fail) end
os.exit(any_error and 1 or 0)
