--- Host cost of Ember's dispatch: one tiny op called from Lua, and a tiny-LM
-- forward. Targets: under 2 µs per tiny op on a 2-core CPU machine; on CUDA
-- (--device cuda) under 5 µs of host time per op, launch included (issue 16).
-- On CUDA a sample issues --cuda-reps ops after a device synchronisation and
-- stops the clock without waiting for them: few enough that the launch queue
-- never fills, so the figure is the host's cost, not the GPU's.
--   ember run scripts/bench_dispatch.lua [--reps 200000] [--json results.jsonl]
--   ember run scripts/bench_dispatch.lua --device cuda
local ember = require "ember"
local argparse = require "argparse"

local parser = argparse("bench_dispatch.lua", "Host cost of one tiny op and of a tiny-LM forward (CPU).")
parser:option("--reps", "Tiny-op calls per timed sample.", "100000"):convert(tonumber)
parser:option("--samples", "Timed samples for each figure.", "7"):convert(tonumber)
parser:option("--lm-steps", "Tiny-LM forwards per sample.", "20"):convert(tonumber)
parser:option("--device", "cpu or cuda.", "cpu"):choices({"cpu", "cuda"})
parser:option("--cuda-reps", "CUDA: ops per sample (below the launch queue's depth).", "256"):convert(tonumber)
parser:option("--json", "Append one JSON line of results to this file.")
parser:flag("--torch", "The same tiny ops in PyTorch, same protocol (python3 scripts/torch/bench_dispatch.py).")
local args = parser:parse(arg)

local git_commit = require("ember.runinfo").git_commit

local function cpu_name()
  local f = io.open("/proc/cpuinfo")
  if not f then return "unknown" end
  for line in f:lines() do
    local m = line:match("^model name%s*:%s*(.+)")
    if m then f:close() return m end
  end
  f:close()
  return "unknown"
end

local on_cuda = args.device == "cuda"
if on_cuda and not ember.cuda.is_available() then
  io.stderr:write("bench_dispatch.lua: --device cuda asked for, but no CUDA device is available\n")
  os.exit(1)
end
local dev = args.device
local function sync() if on_cuda then ember.cuda.synchronize() end end

local function per_call(fn, n, samples)
  if on_cuda then   -- many short samples, each after a sync, the clock stopped before the GPU is done
    n, samples = args.cuda_reps, samples * math.max(1, args.reps // args.cuda_reps)
  end
  local r = ember.bench(function() fn(n) end, {warmup = 1, reps = samples, sync = false, device = dev,
                                               setup = sync, clocks = false})
  return r.median / n, r
end

local devname = on_cuda and ("cuda (%s)"):format(ember.cuda.get_device_name()) or "cpu"
print(("device: %s, host %s, commit %s, %s"):format(devname, cpu_name(), git_commit(),
  os.date("!%Y-%m-%d %H:%M UTC")))
local results = {}

-- 1. a + b on 1-element tensors (allocates the result; the GC frees it)
local a, b = ember.ones(1, {device = dev}), ember.ones(1, {device = dev})
local t_add = per_call(function(n) for _ = 1, n do local _ = a + b end end, args.reps, args.samples)
results.add_1elem_us = t_add * 1e6
print(("a + b, 1-element f32:          %7.3f us/op"):format(results.add_1elem_us))

-- 2. the in-place twin, no allocation
local t_iadd = per_call(function(n) for _ = 1, n do a:add_(b) end end, args.reps, args.samples)
results.add_inplace_1elem_us = t_iadd * 1e6
print(("a:add_(b), 1-element f32:      %7.3f us/op"):format(results.add_inplace_1elem_us))

-- 3. with autograd recording (b requires grad)
local w = ember.ones(1, {requires_grad = true, device = dev})
local t_grad = per_call(function(n) for _ = 1, n do local _ = a * w end end, args.reps, args.samples)
results.mul_recorded_1elem_us = t_grad * 1e6
print(("a * w, w requires grad:        %7.3f us/op"):format(results.mul_recorded_1elem_us))

-- 3b. the parts of 1: an allocation alone (no launch; the GC frees it) and a launch alone (no allocation)
local t_empty = per_call(function(n) for _ = 1, n do local _ = ember.empty(1, {device = dev}) end end, args.reps,
  args.samples)
results.empty_1elem_us = t_empty * 1e6
print(("ember.empty(1) (alloc alone):  %7.3f us/op"):format(results.empty_1elem_us))
local t_fill = per_call(function(n) for _ = 1, n do a:fill_(1) end end, args.reps, args.samples)
results.fill_1elem_us = t_fill * 1e6
print(("a:fill_(1) (a launch alone):   %7.3f us/op"):format(results.fill_1elem_us))

-- PyTorch's figures for 1-3b, from the same protocol
local torch
if args.torch then
  local root = (debug.getinfo(1, "S").source:match("^@(.*/)scripts/") or "./")
  local cmd = ("python3 %sscripts/torch/bench_dispatch.py --device %s --reps %d --samples %d --cuda-reps %d 2>&1")
    :format(root, dev, args.reps, args.samples, args.cuda_reps)
  print("pytorch: " .. cmd)
  local pipe = io.popen(cmd)
  for line in pipe:lines() do
    local ok, rec = pcall(require("cjson").decode, line)
    if ok and type(rec) == "table" and rec.add_1elem_us then torch = rec else print("  torch| " .. line) end
  end
  pipe:close()
  if torch then
    print(("PyTorch %s: a + b %.3f us/op, a:add_(b) %.3f, a * w %.3f, empty(1) %.3f, a:fill_(1) %.3f"):format(
      torch.torch, torch.add_1elem_us, torch.add_inplace_1elem_us, torch.mul_recorded_1elem_us,
      torch.empty_1elem_us or 0 / 0, torch.fill_1elem_us or 0 / 0))
    results.torch = torch
  end
end

-- 4. a tiny-LM forward (batch 2, context 32)
ember.manual_seed(0)
local cfg = ember.nn.configs.tiny{vocab_size = 256, context_length = 32}
cfg.device = dev
local model = ember.nn.TransformerLM(cfg)
local ids = ember.randint(0, cfg.vocab_size, {2, 32}):to(dev)
local r = ember.no_grad(function()
  return ember.bench(function() model(ids) end, {warmup = 2, reps = args.samples * args.lm_steps, sync = false,
                                                 device = dev, setup = sync, clocks = false})
end)
results.tiny_lm_forward_ms = r.median * 1e3
print(("tiny LM forward (B=2, T=32):   %7.3f ms (d_model %d, %d layers)"):format(results.tiny_lm_forward_ms,
  cfg.d_model, cfg.num_layers))

local target = on_cuda and 5.0 or 2.0
print(("target: tiny op under %.1f us -> %s"):format(target, results.add_1elem_us < target and "met" or "NOT met"))

if args.json then
  local cjson = require "cjson"
  results.commit, results.device, results.date = git_commit(), devname .. ", host " .. cpu_name(),
    os.date("!%Y-%m-%dT%H:%M:%SZ")
  results.config = {reps = args.reps, samples = args.samples, lm = cfg}
  local f = assert(io.open(args.json, "a"))
  f:write(cjson.encode(results), "\n")
  f:close()
end
