--- Where a training step's peak memory goes: one eager step of
-- bench_model.lua's train step and (on CUDA) its capture as a CUDA graph,
-- each recorded with ember.memory.record_history, then for each the peak
-- (from the trace, checked against ember.cuda.max_memory_allocated), the
-- event that reached it, and the blocks alive at it grouped by phase /
-- category / op of their allocation (scripts/lib/mem_peak.lua); last, the
-- groups where the capture's peak differs from the eager one.
--
--   ember run scripts/memory_step.lua --model 2.7b --precision bf16
--   ember run scripts/memory_step.lua --model 2.7b --precision bf16 --overlap-optimizer --by phase,category,module
--   ember run scripts/memory_step.lua --device cpu --model tiny --vocab 256 --context 32   # eager only
--
-- Steps: --warmup eager steps (state and workspaces made), then
--   eager:   model:zero_grad(), a full collection, reset of the peak, record
--            one step, snapshot;
--   capture: model:zero_grad(), a full collection, ember.cuda.empty_cache()
--            (the warm-up's cached blocks back to the driver: room for the
--            graph's pool; allocated bytes do not change), reset of the peak,
--            record ember.cuda.graph(step, {warmup = 0}), snapshot.
-- --snapshot DIR also writes DIR/eager.json and DIR/capture.json for
-- scripts/memviz.lua. Recording costs ~0.5 us an event on the host (a 2.7B
-- step records a few thousand); the numbers are allocator bytes, not time.
local ember = require "ember"
local argparse = require "argparse"
local optim = ember.optim

local script_dir = (arg and arg[0] or ""):match("^(.*/)") or "./"
local MF = dofile(script_dir .. "lib/model_flags.lua")
local P = dofile(script_dir .. "lib/mem_peak.lua")

local parser = argparse("memory_step.lua",
  "Peak memory of one training step, eager and captured, and what is alive at each peak.")
MF.add_options(parser)
parser:option("--precision", "fp32, or bf16 autocast.", "bf16"):choices({"fp32", "bf16"})
parser:option("--warmup", "Eager steps before the recorded ones.", "2"):convert(math.tointeger)
parser:option("--attn", "Attention: auto, flash or naive.", "auto"):choices({"auto", "flash", "naive"})
parser:flag("--overlap-optimizer", "AdamW during backward (opt:step_in_backward), as bench_model.lua's.")
parser:flag("--keep-grads", "With --overlap-optimizer: keep the gradients (default: free_grads).")
parser:flag("--overlap-inline", "With --overlap-optimizer: the updates on the main stream (side_stream = false).")
parser:flag("--no-shadow-weights", "AdamW without shadow weights.")
parser:flag("--no-graph", "Only the eager step (the capture is CUDA-only anyway).")
parser:option("--by", "Grouping keys, a comma list of " .. table.concat(P.KEYS, ", ") .. ".", "phase,category,op")
parser:option("--top", "Groups shown per peak.", "15"):convert(math.tointeger)
parser:option("--snapshot", "Also write eager.json and capture.json (scripts/memviz.lua) into this directory.")
parser:option("--device", "cpu or cuda (default: cuda when available).")
parser:option("--seed", "Seed for weights and batch.", "0"):convert(math.tointeger)
local args = parser:parse(arg)

local function fail(msg) io.stderr:write("memory_step.lua: ", msg, "\n") os.exit(2) end
if args.keep_grads and not args.overlap_optimizer then fail("--keep-grads needs --overlap-optimizer") end
if args.overlap_inline and not args.overlap_optimizer then fail("--overlap-inline needs --overlap-optimizer") end
if not (args.warmup and args.warmup >= 1) then fail("--warmup must be >= 1 (state must exist before recording)") end
if not (args.top and args.top >= 1) then fail("--top must be >= 1") end
local ok_by, by_err = pcall(P.analyse, {trace = {}}, {by = args.by})
if not ok_by then fail(tostring(by_err):gsub("^.-mem_peak", "--by: mem_peak")) end
args.device = args.device or (ember.cuda.is_available() and "cuda" or "cpu")
local on_cuda = args.device:match("^cuda") ~= nil
local device = on_cuda and ("cuda:" .. ember.cuda.current_device()) or "cpu"
if args.snapshot then
  local ok = os.execute("mkdir -p '" .. args.snapshot:gsub("'", "'\\''") .. "'")
  if not ok then fail("cannot create --snapshot directory " .. args.snapshot) end
end

local cfg = MF.config(args)
print(("config: %s d_model=%d d_ff=%d layers=%d heads=%d vocab=%d context=%d batch=%d precision=%s%s%s device=%s")
  :format(args.model, cfg.d_model, cfg.d_ff, cfg.num_layers, cfg.num_heads, cfg.vocab_size, args.context, args.batch,
    args.precision, args.overlap_optimizer and ((args.keep_grads and " overlap(keep grads" or " overlap(free grads") ..
      (args.overlap_inline and ", inline)" or ")")) or "",
    args.no_shadow_weights and " no-shadow" or "", device))

ember.manual_seed(args.seed)
local model = ember.nn.TransformerLM(cfg)
local opt = optim.AdamW(model:parameters(), {lr = 1e-4, shadow_weights = not args.no_shadow_weights})
local x, y = MF.batch(args.batch, args.context, cfg.vocab_size, args.device)
local loss_fn = MF.loss_fn(model, x, y, args.precision)
local function forward() return ember.context.phase("forward", loss_fn) end
local arm = args.overlap_optimizer and function(o)
  o:step_in_backward{free_grads = not args.keep_grads, side_stream = not args.overlap_inline}
end or nil
local step = MF.train_step(model, opt, forward, arm)

local function sync() if on_cuda then ember.cuda.synchronize() end end
local function allocated() return on_cuda and ember.cuda.memory_allocated() or nil end

for _ = 1, args.warmup do step() end
sync()

-- Record fn() and analyse it: {analysis, max_memory_allocated}.
local function recorded(name, fn)
  model:zero_grad()
  collectgarbage()
  collectgarbage()
  sync()
  if on_cuda then
    if name == "capture" then ember.cuda.empty_cache() end
    ember.cuda.reset_peak_memory_stats()
  end
  local base = allocated()
  ember.memory.record_history(true, {cpu = not on_cuda})
  local t0 = ember.core.clock()
  local keep = fn()
  sync()
  local secs = ember.core.clock() - t0
  if args.snapshot then ember.memory.snapshot(args.snapshot .. "/" .. name .. ".json") end
  local snap = ember.memory.snapshot()
  ember.memory.record_history(false)
  ember.memory.clear_history()
  local peak_stat = on_cuda and ember.cuda.max_memory_allocated() or nil
  local a = P.analyse(snap, {device = device, baseline = base, by = args.by})
  snap = nil
  print()
  print(P.report(a, {title = name, top = args.top}))
  if peak_stat then
    print(("  check: ember.cuda.max_memory_allocated %.3f GiB (%s the trace's peak); recorded in %.2f s")
      :format(peak_stat / 2 ^ 30, peak_stat == a.peak and "equal to" or "NOT equal to", secs))
  end
  return a, keep
end

local eager = recorded("eager", function() return step() end)
if on_cuda and not args.no_graph then
  local capture, g = recorded("capture", function() return ember.cuda.graph(step, {warmup = 0}) end)
  g:close()
  print()
  print(P.diff_report(eager, capture, "eager", "capture", args.top))
end
