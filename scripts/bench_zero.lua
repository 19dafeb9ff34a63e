--- ZeRO-1 (optimizer-state sharding) memory and step time: AdamW vs
-- ember.optim.ShardedOptimizer(AdamW) under bucketed DDP, beside PyTorch's
-- AdamW vs ZeroRedundancyOptimizer(AdamW) (scripts/torch/bench_zero.py).
--
--   ember run scripts/bench_zero.lua --nproc 2                   (driver: Ember's ranks, then PyTorch's)
--   ember run scripts/bench_zero.lua --nproc 2 --model xl --out results/
--   ember launch --nproc 2 scripts/bench_zero.lua                (Ember's ranks only)
--
-- Per variant, a fresh model (same seed) wrapped in bucketed DDP, then:
--   after_init    allocated bytes once the model and DDP's buckets exist
--   before_step   after the first forward + backward + gradient sync
--                 (gradients exist, optimizer state not yet)
--   after_step    after the first optimizer step (AdamW's moments exist: 2×
--                 the parameters, divided by the ranks when sharded)
--   peak          the allocator's peak over the first step and `--steps` more
--   step_ms       median of the timed steps (host clock between syncs), slowest rank
-- Memory figures are ember.cuda.memory_allocated / max_memory_allocated (the
-- largest over ranks). The CPU allocator keeps no counters, so on the CPU
-- (and beside the allocator on CUDA) the script also reports accounted
-- bytes: parameters, gradients and this rank's optimizer state, summed over
-- the tensors themselves; `state_unsharded` is what one unsharded AdamW holds.
local ember = require "ember"
local argparse = require "argparse"
local nn, optim = ember.nn, ember.optim

local script_dir = (arg and arg[0] or ""):match("^(.*/)") or "./"
local DB = dofile(script_dir .. "lib/dist_bench.lua")
local MF = dofile(script_dir .. "lib/model_flags.lua")
local S = dofile(script_dir .. "lib/study.lua")

local parser = argparse("bench_zero.lua",
  "Memory and step time of AdamW vs ZeRO-1 ShardedOptimizer(AdamW) under DDP (Ember and PyTorch).")
parser:epilog([[
Figures per variant (adamw, sharded), the largest over ranks:
  after_init, before_step, after_step  allocated bytes at those points of the first step
  peak        max allocated over the first and the timed steps
  state       optimizer-state bytes on this rank (accounted from the tensors)
  step_ms     median of --steps timed steps
PyTorch: torch.optim.AdamW vs torch.distributed.optim.ZeroRedundancyOptimizer(AdamW),
  both under DistributedDataParallel(bucket_cap_mb=--bucket-mb, gradient_as_bucket_view=True).
Examples:
  ember run scripts/bench_zero.lua --nproc 2 --model xl --out results/
  ember run scripts/bench_zero.lua --device cpu --model tiny --context 32 --nproc 2 --precision fp32]])
MF.add_options(parser)
parser:option("--precision", "bf16 autocast or fp32.", "bf16"):choices({"bf16", "fp32"})
parser:option("--variants", "Optimizers: adamw, sharded (a comma list).", "adamw,sharded")
parser:option("--bucket-mb", "DDP bucket size in MiB.", "25"):convert(tonumber)
parser:option("--warmup", "Untimed steps after the first (measured) one.", "2"):convert(math.tointeger)
parser:option("--steps", "Timed steps.", "5"):convert(math.tointeger)
parser:option("--lr", "AdamW learning rate.", "1e-4"):convert(tonumber)
parser:option("--seed", "Seed of the weights (the batch: seed + 1 + rank).", "0"):convert(math.tointeger)
DB.add_common_options(parser, "default: the number of GPUs, 2 on cpu")
local args = parser:parse(arg)

local function fail(msg) io.stderr:write("bench_zero.lua: ", msg, "\n") os.exit(2) end
local variants, err = DB.names(args.variants, "--variants", {adamw = true, sharded = true})
if not variants then fail(err) end
S.check_counts(args, {"batch", "context", "vocab", "steps"}, fail)
if not args.bucket_mb or args.bucket_mb <= 0 then fail("--bucket-mb must be a positive number") end
local ok_common, err_common = DB.resolve_common(args, "zero")
if not ok_common then fail(err_common) end
local on_cuda = args.device == "cuda"

local cfg = MF.config(args)
local B, T = args.batch, args.context
local config, n_params = MF.study_config("zero", args, cfg, {bucket_mb = args.bucket_mb})
local config_text = ("%s d_model=%d layers=%d vocab=%d context=%d batch/GPU=%d precision=%s params=%.1fM " ..
  "DDP bucketed %g MB, warmup=%d steps=%d"):format(args.model, cfg.d_model, cfg.num_layers, cfg.vocab_size,
  T, B, args.precision, n_params / 1e6, args.bucket_mb, args.warmup, args.steps)

-- ---------------------------------------------------------------------------
-- worker: one rank

local function tensor_bytes(t) return t:numel() * t:element_size() end

--- Bytes of the optimizer state tensors of `opt` (an ember.optim optimizer).
local function state_bytes(opt)
  local total = 0
  for _, st in pairs(opt.state or {}) do
    if type(st) == "table" then
      for _, v in pairs(st) do if ember.is_tensor(v) then total = total + tensor_bytes(v) end end
    end
  end
  return total
end

local function worker()
  local dist = ember.dist
  dist.init()
  local rank, n = dist.rank(), dist.world_size()
  local device = args.device
  if rank == 0 then DB.print_header(device, ("ember ZeRO-1 ranks=%d %s"):format(n, config_text)) end
  local function sync() if on_cuda then ember.cuda.synchronize() end end
  local function allocated() return on_cuda and ember.cuda.memory_allocated() or nil end
  local function maxr(v) return v and DB.reduce_number(v, "max", device) or nil end

  ember.manual_seed(args.seed + 1 + rank)
  local x, y = MF.batch(B, T, cfg.vocab_size, device)

  for _, variant in ipairs(variants) do
    local model = MF.fresh_model(cfg, args.seed, on_cuda)
    local w = nn.parallel.DDP(model, {strategy = "bucketed", bucket_mb = args.bucket_mb})
    sync()
    local after_init = allocated()
    local opt = variant == "sharded" and optim.ShardedOptimizer(model:parameters(), optim.AdamW, {lr = args.lr})
      or optim.AdamW(model:parameters(), {lr = args.lr})
    local loss
    local function fwd_bwd()
      opt:zero_grad()
      w:on_train_batch_start()
      loss = MF.loss_fn(w, x, y, args.precision)()
      loss:backward()
      w:finish_gradient_synchronization()
    end
    fwd_bwd()
    sync()
    local before_step = allocated()
    opt:step()
    sync()
    local after_step = allocated()
    local function step() fwd_bwd() opt:step() end
    for _ = 1, args.warmup do step() end
    sync()
    dist.barrier()
    local samples = MF.timed_steps(step, args.steps, sync)
    local peak = on_cuda and ember.cuda.max_memory_allocated() or nil
    local pbytes, gbytes = 0, 0
    for _, p in ipairs(model:parameters()) do
      pbytes = pbytes + tensor_bytes(p)
      if p.grad ~= nil then gbytes = gbytes + tensor_bytes(p.grad) end
    end
    local sbytes = state_bytes(variant == "sharded" and opt.optim or opt)
    local unsharded = variant == "sharded" and opt:memory_stats().unsharded or sbytes
    local rec = {
      impl = "ember", variant = variant, world_size = n, status = "ok",
      after_init_bytes = maxr(after_init), before_step_bytes = maxr(before_step),
      after_step_bytes = maxr(after_step), peak_memory_bytes = maxr(peak),
      params_bytes = pbytes, grads_bytes = gbytes, state_bytes = maxr(sbytes), state_unsharded_bytes = unsharded,
      step_ms = DB.reduce_number(DB.median(samples), "max", device), samples_ms = samples,
      final_loss = loss:item(),
    }
    if rank == 0 then
      local function gib(v) return v and ("%.1f MiB"):format(v / DB.MiB) or "-" end
      print(("%-8s after init %s  before step %s  after step %s  peak %s  |  params %s grads %s state/rank %s " ..
        "(unsharded %s)  step %.3f ms"):format(variant, gib(rec.after_init_bytes), gib(rec.before_step_bytes),
        gib(rec.after_step_bytes), gib(rec.peak_memory_bytes), gib(pbytes), gib(gbytes), gib(rec.state_bytes),
        gib(unsharded), rec.step_ms))
      io.stdout:flush()
      DB.append(args.json, DB.record({config = config}, rec, device))
    end
    w:remove_hooks()
    w, model, opt, loss = nil, nil, nil, nil
  end
  dist.destroy()
end

-- ---------------------------------------------------------------------------
-- driver

local function driver()
  local facts, header = DB.print_header(args.device, ("ZeRO-1 nproc=%d device=%s variants=%s %s")
    :format(args.nproc, args.device, args.variants, config_text))
  local common = MF.argv(args, {"precision", "warmup", "steps", "lr", "seed", "bucket_mb", "variants", "device"})
  print()
  print(("== Ember: %d ranks (ember launch)"):format(args.nproc))
  local all, failures = {}, {}
  local recs, e = DB.launch_ember(arg[0], args.nproc, common, args.timeout)
  if not recs then failures[#failures + 1] = "Ember: " .. e end
  for _, r in ipairs(recs or {}) do all[#all + 1] = r end
  print()
  local run_torch, torch_note = DB.want_torch(args)
  if run_torch == nil then fail(torch_note) end
  if run_torch then
    print(("== PyTorch: %d ranks (torchrun)"):format(args.nproc))
    recs, e = DB.torchrun(args.python, args.nproc, script_dir .. "torch/bench_zero.py", common, facts.commit)
    if not recs then failures[#failures + 1] = "PyTorch: " .. e end
    for _, r in ipairs(recs or {}) do all[#all + 1] = r end
  end
  print(torch_note)
  for _, f in ipairs(failures) do io.stderr:write("bench_zero.lua: ", f, "\n") end
  print()
  local rows, by = {}, {}
  for _, v in ipairs(variants) do
    by[v] = {variant = v}
    rows[#rows + 1] = by[v]
  end
  for _, r in ipairs(all) do
    local x = by[r.variant]
    if x then
      local p = r.impl == "ember" and "e_" or "t_"
      for _, k in ipairs({"after_init_bytes", "before_step_bytes", "after_step_bytes", "peak_memory_bytes",
          "state_bytes", "step_ms"}) do
        x[p .. k] = r[k]
      end
    end
  end
  local function mib(k) return function(r) return r[k] and r[k] / DB.MiB or nil end end
  local columns = {"variant"}
  for _, side in ipairs({{"e_", "Ember"}, {"t_", "PyTorch"}}) do
    local p, name = side[1], side[2]
    for _, c in ipairs({{"after_init_bytes", "after init MiB"}, {"before_step_bytes", "before step MiB"},
        {"after_step_bytes", "after step MiB"}, {"peak_memory_bytes", "peak MiB"}, {"state_bytes", "state/rank MiB"}}) do
      columns[#columns + 1] = {key = p .. c[1]:gsub("_bytes$", "_mib"), title = name .. " " .. c[2], fmt = "%.1f",
        value = mib(p .. c[1])}
    end
    columns[#columns + 1] = {key = p .. "step_ms", title = name .. " step ms", fmt = "%.2f"}
  end
  local report = require "ember.report"
  local tbl = report.markdown_table(columns, rows)
  print(("ZeRO-1, %s, batch %d x context %d per GPU, %s, %d ranks (memory: the largest rank's, MiB = 2^20 B):")
    :format(args.model, B, T, args.precision, args.nproc))
  io.write(tbl)
  local notes = {"", torch_note, "memory: allocator bytes (CUDA) at the points of the first step; " ..
    "state/rank: optimizer-state tensors on the largest rank (accounted; also on the CPU)."}
  DB.write_outputs(args, all, header, tbl, notes)
  if #failures > 0 then os.exit(1) end
end

if DB.is_worker() then worker() else driver() end
