--- Host cost of an eager training step, phase by phase, and of one op's
-- dispatch with and without autograd recording (issue 16). The model is the
-- reference TransformerLM at tiny widths (d_model 16, 8 tokens) but the
-- small model's 12 layers: the same ops per step as `bench_model.lua --model
-- small`, with kernels too small to matter, so the figures are host work —
-- Lua, dispatch, autograd recording and the backward engine. The host path
-- is the same on either device up to the launch, so the CPU figures predict
-- the GPU's host time; on CUDA the phases are timed without synchronising
-- (the clock stops when the host is done), the step's wall time with it.
--   ember run scripts/bench_host.lua [--device cuda] [--precision bf16] [--json out.jsonl]
-- Prints µs per phase (median over samples of the per-step mean) and µs per op.
-- On a machine shared with other work, `--clock cpu` with EMBER_NUM_THREADS=1
-- counts the CPU time this process used instead of the time that passed.
-- `--gc-step` runs one young collection after zero_grad: the previous step's
-- tensors go back before the forward allocates (docs/perf.md, fifteenth session).
local ember = require "ember"
local argparse = require "argparse"
local nn, optim = ember.nn, ember.optim

local script_dir = (arg and arg[0] or ""):match("^(.*/)") or "./"
local MF = dofile(script_dir .. "lib/model_flags.lua")

local parser = argparse("bench_host.lua",
  "Host time of an eager train step (zero_grad / forward / backward / optimizer) and of one op's dispatch.")
parser:option("--device", "cpu or cuda.", "cpu"):choices({"cpu", "cuda"})
parser:option("--precision", "fp32, or bf16 autocast around forward and loss.", "fp32"):choices({"fp32", "bf16"})
parser:option("--model", "Model size whose widths to use (nn.configs).", "tiny")
parser:option("--layers", "Transformer layers (12: the small model's op count).", "12"):convert(math.tointeger)
parser:option("--d-model", "d_model.", "16"):convert(math.tointeger)
parser:option("--d-ff", "d_ff.", "32"):convert(math.tointeger)
parser:option("--heads", "num_heads.", "2"):convert(math.tointeger)
parser:option("--vocab", "Vocabulary size.", "64"):convert(math.tointeger)
parser:option("--batch", "Batch size.", "1"):convert(math.tointeger)
parser:option("--context", "Context length T.", "8"):convert(math.tointeger)
parser:option("--steps", "Train steps per sample.", "10"):convert(math.tointeger)
parser:option("--samples", "Samples (the median is printed).", "7"):convert(math.tointeger)
parser:option("--warmup", "Untimed train steps first.", "3"):convert(math.tointeger)
parser:option("--reps", "Op calls per dispatch sample.", "20000"):convert(math.tointeger)
parser:option("--clock", "wall (the host clock), or cpu: this process's CPU time (os.clock), which a " ..
  "descheduled process does not accrue — for a shared machine; run it with EMBER_NUM_THREADS=1.", "wall")
  :choices({"wall", "cpu"})
parser:flag("--gc-step", "A/B: one young collection (collectgarbage \"step\") right after zero_grad, timed in it.")
parser:option("--json", "Append one JSON line of results to this file.")
local args = parser:parse(arg)
for _, k in ipairs({"layers", "d_model", "d_ff", "heads", "vocab", "batch", "context", "steps", "samples", "reps"}) do
  if not args[k] or args[k] < 1 then
    parser:error(("--%s: expected a positive integer"):format(k:gsub("_", "-")))
  end
end
if not args.warmup or args.warmup < 0 then parser:error("--warmup: expected an integer >= 0") end
if not nn.configs[args.model] then
  parser:error(("--model: expected one of %s, got %s"):format(table.concat(nn.config_names, ", "), args.model))
end

local on_cuda = args.device == "cuda"
if on_cuda and not ember.cuda.is_available() then
  io.stderr:write("bench_host.lua: --device cuda asked for, but no CUDA device is available\n")
  os.exit(1)
end
local clock = args.clock == "cpu" and os.clock or ember.core.clock
local function sync() if on_cuda then ember.cuda.synchronize() end end
local function median(xs) return require("ember.bench").stats(xs).median end

local cfg = MF.config(args)
print(("device: %s, commit %s, %s; model d_model %d, %d layers, vocab %d, batch %d x %d, %s; %s clock"):format(
  on_cuda and ("cuda (" .. ember.cuda.get_device_name() .. ")") or "cpu", require("ember.runinfo").git_commit(),
  os.date("!%Y-%m-%d %H:%M UTC"), cfg.d_model, cfg.num_layers, cfg.vocab_size, args.batch, args.context,
  args.precision, args.clock))
local results = {}

-- 1. the eager train step, phase by phase
ember.manual_seed(0)
local model = nn.TransformerLM(cfg)
local opt = optim.AdamW(model:parameters(), {lr = 1e-3})
local x, y = MF.batch(args.batch, args.context, cfg.vocab_size, args.device)
local loss_fn = MF.loss_fn(model, x, y, args.precision)
local PHASES = {"zero_grad", "forward", "backward", "optimizer"}

-- one step; t (when given) gets each phase's host seconds added
local function step(t)
  local t0 = clock()
  model:zero_grad()
  if args.gc_step then collectgarbage("step") end
  local t1 = clock()
  local loss = loss_fn()
  local t2 = clock()
  loss:backward()
  local t3 = clock()
  opt:step()
  local t4 = clock()
  if t then
    t.zero_grad, t.forward = t.zero_grad + (t1 - t0), t.forward + (t2 - t1)
    t.backward, t.optimizer = t.backward + (t3 - t2), t.optimizer + (t4 - t3)
  end
end

for _ = 1, args.warmup do step() end
sync()
local per_phase, walls = {}, {}
for _, ph in ipairs(PHASES) do per_phase[ph] = {} end
for s = 1, args.samples do
  local t = {zero_grad = 0, forward = 0, backward = 0, optimizer = 0}
  local wall = 0
  for _ = 1, args.steps do
    sync()
    local t0 = clock()
    step(t)
    sync()
    wall = wall + (clock() - t0)
  end
  for _, ph in ipairs(PHASES) do per_phase[ph][s] = t[ph] / args.steps * 1e6 end
  walls[s] = wall / args.steps * 1e6
end
local host_total = 0
for _, ph in ipairs(PHASES) do
  results[ph .. "_us"] = median(per_phase[ph])
  host_total = host_total + results[ph .. "_us"]
end
results.step_host_us, results.step_wall_us = host_total, median(walls)
print(("train step host time (median of %d samples x %d steps):"):format(args.samples, args.steps))
for _, ph in ipairs(PHASES) do print(("  %-10s %9.1f us"):format(ph, results[ph .. "_us"])) end
print(("  %-10s %9.1f us  (a step timed alone, device synchronised: %.1f us)"):format("total", host_total,
  results.step_wall_us))

-- 2. one op's dispatch on 1-element tensors: no autograd, then recording a node
local function per_op(fn)
  local samples = {}
  fn(args.reps // 10 + 1)
  for s = 1, args.samples do
    sync()
    local t0 = clock()
    fn(args.reps)
    samples[s] = (clock() - t0) / args.reps * 1e6
  end
  sync()
  return median(samples)
end
local a, b = ember.ones(1, {device = args.device}), ember.ones(1, {device = args.device})
local w = ember.ones(1, {device = args.device, requires_grad = true})
results.mul_us = per_op(function(n) for _ = 1, n do local _ = a * b end end)
results.mul_recorded_us = per_op(function(n) for _ = 1, n do local _ = a * w end end)
results.mul_inplace_us = per_op(function(n) for _ = 1, n do a:mul_(b) end end)
print(("dispatch, 1-element f32 (median of %d samples x %d ops):"):format(args.samples, args.reps))
print(("  a * b (no autograd)     %7.3f us/op"):format(results.mul_us))
print(("  a * w (w requires grad) %7.3f us/op  (recording: +%.3f)"):format(results.mul_recorded_us,
  results.mul_recorded_us - results.mul_us))
print(("  a:mul_(b) (in place)    %7.3f us/op"):format(results.mul_inplace_us))

if args.json then
  local cjson = require "cjson"
  results.commit, results.device, results.date = require("ember.runinfo").git_commit(), args.device,
    os.date("!%Y-%m-%dT%H:%M:%SZ")
  results.config = {d_model = cfg.d_model, layers = cfg.num_layers, vocab = cfg.vocab_size, batch = args.batch,
    context = args.context, precision = args.precision, steps = args.steps, samples = args.samples,
    clock = args.clock, gc_step = args.gc_step}
  local f = assert(io.open(args.json, "a"))
  f:write(cjson.encode(results), "\n")
  f:close()
end
