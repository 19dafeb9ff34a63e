--- Data-parallel training of the reference TransformerLM, by DDP strategy
-- and bucket size: step time, how much communication the step exposes, peak
-- memory and weak scaling from one GPU to N; Ember's four strategies beside
-- PyTorch's DistributedDataParallel (scripts/torch/bench_ddp.py) on the same
-- GPUs, with the same model, batch per GPU, bf16 autocast and AdamW.
--
--   ember run scripts/bench_ddp.lua --nproc 2                       (driver: 1 and N ranks, Ember then PyTorch)
--   ember run scripts/bench_ddp.lua --nproc 2 --model xl --strategies bucketed --bucket-mb 1,5,25,100,1000 --plan
--   ember launch --nproc 2 scripts/bench_ddp.lua --model small      (Ember's ranks only)
--
-- Method. Every configuration builds the model afresh (same seed), wraps it
-- in ember.nn.parallel.DDP, runs `--warmup` untimed steps (zero_grad,
-- on_train_batch_start, forward + loss under autocast, backward,
-- finish_gradient_synchronization, AdamW step), then `--steps` steps each
-- timed by the host clock between two device synchronisations; step_ms is
-- the median, the slowest rank's. Hooks cannot time collectives cheaply, so
-- communication is measured around them:
--   compute_ms  the same step with strategy "none" (a DDP strategy that skips
--               every collective): compute only
--   comm_ms     the strategy's own collectives (one per parameter for naive
--               and overlap, one per dtype group for flat, one per bucket for
--               bucketed, same sizes) issued back to back on an idle device,
--               timed by CUDA events (CPU: wall clock); median of --comm-reps
--   exposed_ms  step_ms − compute_ms: what communication (and copies) add
--   hidden      1 − exposed_ms / comm_ms: the fraction of comm_ms that
--               overlapped compute (noise can push it a little past 0 or 1)
-- Weak scaling = t1 / tN, t1 the same configuration on one rank (the driver's
-- --nproc 1 run), tN on N ranks, with the same batch per GPU (1.0 = perfect).
-- Communication accounting: a ring all-reduce moves 2(n−1)/n · B per rank;
-- DDP reduces the gradient bytes G once per step, so the formula is
-- 2(n−1)/n · G; the measured figure is ember.dist.stats()'s all_reduce
-- payload per timed step (× the same factor for the wire).
-- --plan: ember.ddp_planner measures when each gradient is ready in one
-- backward and fits the all-reduce link, then predicts the exposed
-- communication of bucketed DDP per bucket size, printed beside the measured one.
local ember = require "ember"
local argparse = require "argparse"
local nn, optim = ember.nn, ember.optim

local script_dir = (arg and arg[0] or ""):match("^(.*/)") or "./"
local DB = dofile(script_dir .. "lib/dist_bench.lua")
local MF = dofile(script_dir .. "lib/model_flags.lua")
local S = dofile(script_dir .. "lib/study.lua")

local STRATEGY_SET = {naive = true, flat = true, overlap = true, bucketed = true}

local parser = argparse("bench_ddp.lua",
  "DDP step time, exposed communication, memory and scaling by strategy and bucket size (Ember and PyTorch).")
parser:epilog([[
Figures (per configuration; times are the slowest rank's medians):
  step_ms     one training step (host clock between device synchronisations)
  compute_ms  the step with a DDP strategy that skips every collective
  comm_ms     the strategy's collectives alone, back to back, CUDA events
  exposed_ms  step_ms - compute_ms;  hidden = 1 - exposed_ms / comm_ms
  scaling     t1 / tN: the same configuration on 1 rank and on N (weak scaling)
  bytes/step  formula 2(n-1)/n x gradient bytes (ring all-reduce, per rank)
              vs ember.dist.stats() payload per step x 2(n-1)/n
PyTorch: DistributedDataParallel(bucket_cap_mb=, gradient_as_bucket_view=True)
  per --bucket-mb (rows "bucketed"); compute-only under ddp.no_sync().
Examples:
  ember run scripts/bench_ddp.lua --nproc 2 --out results/
  ember run scripts/bench_ddp.lua --nproc 2 --strategies bucketed --bucket-mb 1,5,25,100,1000 --plan
  ember run scripts/bench_ddp.lua --device cpu --model tiny --context 32 --nproc 2 --precision fp32]])
MF.add_options(parser)
parser:option("--precision", "bf16 autocast or fp32.", "bf16"):choices({"bf16", "fp32"})
parser:option("--attn", "Ember attention: auto, flash or naive (PyTorch uses sdpa).", "auto")
  :choices({"auto", "flash", "naive"})
parser:option("--strategies", "Ember DDP strategies, a comma list (naive, flat, overlap, bucketed).",
  "naive,flat,overlap,bucketed")
parser:option("--bucket-mb", "Bucket sizes in MiB for bucketed (and PyTorch's bucket_cap_mb), a comma list.", "25")
parser:option("--warmup", "Untimed steps per configuration.", "3"):convert(math.tointeger)
parser:option("--steps", "Timed steps per configuration.", "10"):convert(math.tointeger)
parser:option("--comm-reps", "Timed repetitions of a strategy's collectives alone.", "5"):convert(math.tointeger)
parser:option("--lr", "AdamW learning rate.", "1e-4"):convert(tonumber)
parser:option("--seed", "Seed of the weights (the batch: seed + 1 + rank).", "0"):convert(math.tointeger)
parser:flag("--plan", "Predict exposed communication per bucket size (ember.ddp_planner) beside the measured one.")
parser:flag("--no-single", "Driver: skip the one-rank runs (no scaling column).")
DB.add_common_options(parser, "default: the number of GPUs, 2 on cpu")
local args = parser:parse(arg)

local function fail(msg) io.stderr:write("bench_ddp.lua: ", msg, "\n") os.exit(2) end
local strategies, err = DB.names(args.strategies, "--strategies", STRATEGY_SET)
if not strategies then fail(err) end
local bucket_mbs
bucket_mbs, err = DB.numbers(args.bucket_mb, "--bucket-mb")
if not bucket_mbs then fail(err) end
S.check_counts(args, {"batch", "context", "vocab", "steps", "comm_reps"}, fail)
local ok_common, err_common = DB.resolve_common(args, "ddp")
if not ok_common then fail(err_common) end
local on_cuda = args.device == "cuda"

local cfg = MF.config(args)
local B, T = args.batch, args.context
local config, n_params = MF.study_config("ddp", args, cfg, {attn = args.attn, comm_reps = args.comm_reps})
local config_text = ("%s d_model=%d d_ff=%d layers=%d heads=%d vocab=%d context=%d batch/GPU=%d " ..
  "precision=%s params=%.1fM warmup=%d steps=%d"):format(args.model, cfg.d_model, cfg.d_ff, cfg.num_layers,
  cfg.num_heads, cfg.vocab_size, T, B, args.precision, n_params / 1e6, args.warmup, args.steps)

-- ---------------------------------------------------------------------------
-- worker: one rank

local function worker()
  local dist = ember.dist
  local ddp = require "ember.ddp"
  dist.init()
  local rank, n = dist.rank(), dist.world_size()
  local device = args.device
  if rank == 0 then DB.print_header(device, ("ember DDP ranks=%d %s"):format(n, config_text)) end
  local function sync() if on_cuda then ember.cuda.synchronize() end end
  local function say(...) if rank == 0 then print(string.format(...)) io.stdout:flush() end end

  -- the compute-only strategy: every hook and collective skipped
  local None = ddp.Strategy:extend("none")

  ember.manual_seed(args.seed + 1 + rank)
  local x, y = MF.batch(B, T, cfg.vocab_size, device)
  local function forward(m) return MF.loss_fn(m, x, y, args.precision)() end

  local grad_bytes
  --- The sizes of the strategy's collectives: {{numel =, dtype =}...}.
  local function comm_pattern(name, w)
    local out = {}
    if name == "flat" then
      for _, g in ipairs(w.groups) do out[#out + 1] = {numel = g.numel, dtype = g.dtype} end
    elseif name == "bucketed" then
      for _, b in ipairs(w.buckets) do out[#out + 1] = {numel = b.numel, dtype = b.dtype} end
    elseif name ~= "none" then
      for i = #w.params, 1, -1 do out[#out + 1] = {numel = w.params[i]:numel(), dtype = w.params[i].dtype} end
    end
    return out
  end

  --- The pattern's all-reduces alone, back to back: ms (median of reps, the slowest rank's).
  local function time_comm(pattern)
    if #pattern == 0 then return 0 end
    local total = {}
    for _, e in ipairs(pattern) do total[e.dtype] = (total[e.dtype] or 0) + e.numel end
    local scratch, off = {}, {}
    for dt, nel in pairs(total) do scratch[dt] = ember.zeros({nel}, {dtype = dt, device = device}) end
    local views = {}
    for i, e in ipairs(pattern) do
      off[e.dtype] = off[e.dtype] or 0
      views[i] = scratch[e.dtype]:narrow(0, off[e.dtype], e.numel)
      off[e.dtype] = off[e.dtype] + e.numel
    end
    local function all() for _, v in ipairs(views) do dist.all_reduce(v, {op = "avg"}) end end
    all()
    sync()
    local samples = {}
    for r = 1, args.comm_reps do
      dist.barrier()
      samples[r] = DB.time_calls(all, 1, on_cuda)
    end
    return DB.reduce_number(DB.median(samples), "max", device)
  end

  local compute_ms
  local timeline, link
  local records = {}

  -- discard = true: a whole configuration run and thrown away, so the first
  -- measured one does not pay for the process's first steps (allocator growth,
  -- library set-up)
  local function measure(name, bucket_mb, discard)
    local model = MF.fresh_model(cfg, args.seed, on_cuda)
    local cls = name == "none" and None or name
    local w = nn.parallel.DDP(model, {strategy = cls, bucket_mb = bucket_mb})
    local opt = optim.AdamW(model:parameters(), {lr = args.lr})
    if grad_bytes == nil then
      grad_bytes = 0
      for _, p in ipairs(w.params) do grad_bytes = grad_bytes + p:numel() * p:element_size() end
    end
    local loss
    local function step()
      opt:zero_grad()
      w:on_train_batch_start()
      loss = forward(w)
      loss:backward()
      w:finish_gradient_synchronization()
      opt:step()
    end
    for _ = 1, args.warmup do step() end
    sync()
    dist.barrier()
    dist.reset_stats()
    local samples = MF.timed_steps(step, args.steps, sync)
    local st = dist.stats().all_reduce
    local peak = on_cuda and DB.reduce_number(ember.cuda.max_memory_allocated(), "max", device) or nil
    local final_loss = loss:item()
    local step_ms = DB.reduce_number(DB.median(samples), "max", device)
    if discard then
      w:remove_hooks()
      return
    end
    local pattern = comm_pattern(name, w)
    local comm_ms = time_comm(pattern)
    if name == "none" then compute_ms = step_ms end
    local exposed = name ~= "none" and compute_ms and step_ms - compute_ms or nil
    local factor = 2 * (n - 1) / n
    local rec = {
      impl = "ember", strategy = name, bucket_mb = name == "bucketed" and bucket_mb or nil,
      world_size = n, status = "ok", step_ms = step_ms, samples_ms = samples,
      step_mean_ms = require("ember.bench").stats(samples).mean,
      compute_ms = compute_ms, comm_ms = comm_ms, exposed_ms = exposed,
      hidden_frac = exposed and comm_ms > 0 and 1 - exposed / comm_ms or nil,
      collectives_per_step = #pattern, buckets = name == "bucketed" and #w.buckets or nil,
      peak_memory_bytes = peak, tokens_per_s = n * B * T / step_ms * 1e3, final_loss = final_loss,
      grad_bytes = grad_bytes, formula_wire_bytes_per_step = factor * grad_bytes,
      measured_payload_bytes_per_step = st.bytes / args.steps,
      measured_allreduce_calls_per_step = st.calls / args.steps,
      measured_wire_bytes_per_step = factor * st.bytes / args.steps,
    }
    if name == "bucketed" and timeline then
      rec.predicted_exposed_ms = require("ember.ddp_planner").simulate(timeline, link, bucket_mb)
    end
    if rank == 0 then
      local c = {}
      for k, v in pairs(config) do c[k] = v end
      DB.append(args.json, DB.record({config = c}, rec, device))
    end
    say("%-9s %6s  step %9.3f ms (median, slowest rank)  compute %9.3f  comm %9.3f  exposed %s  hidden %s" ..
      "  %d coll/step  peak %s", name, bucket_mb and name == "bucketed" and (bucket_mb .. "MB") or "",
      step_ms, compute_ms or 0 / 0, comm_ms, exposed and ("%9.3f"):format(exposed) or "        -",
      rec.hidden_frac and ("%5.1f%%"):format(100 * rec.hidden_frac) or "    -", #pattern,
      peak and ("%.2f GiB"):format(peak / DB.GiB) or "-")
    if name ~= "none" then
      say("          bytes/step: formula 2(n-1)/n x G = %.4g B (G = %.4g B of gradients); measured payload %.4g B " ..
        "in %.4g calls -> %.4g B on the wire%s", rec.formula_wire_bytes_per_step, grad_bytes,
        rec.measured_payload_bytes_per_step, rec.measured_allreduce_calls_per_step, rec.measured_wire_bytes_per_step,
        rec.predicted_exposed_ms and ("; planner predicts exposed %.3f ms"):format(rec.predicted_exposed_ms) or "")
    end
    records[#records + 1] = rec
    w:remove_hooks()
    w, model, opt, loss = nil, nil, nil, nil
    collectgarbage()
    collectgarbage()
  end

  measure("none", nil, true)
  measure("none")
  if args.plan then
    local planner = require "ember.ddp_planner"
    ember.manual_seed(args.seed)
    local model = nn.TransformerLM(cfg)
    local cands = {}
    local seen = {}
    for _, mb in ipairs(planner.DEFAULT_CANDIDATES_MB) do cands[#cands + 1] = mb; seen[mb] = true end
    for _, mb in ipairs(bucket_mbs) do if not seen[mb] then cands[#cands + 1] = mb end end
    table.sort(cands)
    local plan = planner.plan_buckets(model, function() return forward(model) end, {
      candidates_mb = cands, print = true,
      link_sizes_mb = on_cuda and {1, 4, 16, 64, 256} or {0.01, 0.1, 1}})
    timeline, link = plan.timeline, plan.link
    if rank == 0 then
      DB.append(args.json, DB.record({config = config}, {impl = "ember", strategy = "plan", world_size = n,
        status = "ok", suggested_mb = plan.suggested_mb, backward_ms = timeline.backward_ms,
        link_latency_ms = link.latency_ms, link_bytes_per_ms = link.bytes_per_ms,
        candidates = plan.candidates}, device))
    end
    model = nil
    collectgarbage()
  end
  for _, s in ipairs(strategies) do
    if s == "bucketed" then
      for _, mb in ipairs(bucket_mbs) do measure(s, mb) end
    else
      measure(s, bucket_mbs[1])
    end
  end
  dist.destroy()
end

-- ---------------------------------------------------------------------------
-- driver: 1 and N ranks of Ember, then of PyTorch; one table

local function driver()
  local facts, header = DB.print_header(args.device, ("DDP nproc=%d device=%s strategies=%s bucket_mb=%s %s")
    :format(args.nproc, args.device, args.strategies, args.bucket_mb, config_text))
  local common = MF.argv(args, {"precision", "warmup", "steps", "comm_reps", "lr", "seed", "bucket_mb", "device"})
  local wargs = {table.unpack(common)}
  for _, a in ipairs({"--strategies", args.strategies, "--attn", args.attn}) do wargs[#wargs + 1] = a end
  if args.plan then wargs[#wargs + 1] = "--plan" end
  local worlds = (args.no_single or args.nproc == 1) and {args.nproc} or {1, args.nproc}

  local all, failures = {}, {}
  for _, np in ipairs(worlds) do
    print()
    print(("== Ember: %d rank%s (ember launch)"):format(np, np > 1 and "s" or ""))
    local recs, e = DB.launch_ember(arg[0], np, wargs, args.timeout)
    if not recs then failures[#failures + 1] = ("Ember on %d ranks: %s"):format(np, e) end
    for _, r in ipairs(recs or {}) do all[#all + 1] = r end
  end
  print()
  local run_torch, torch_note = DB.want_torch(args)
  if run_torch == nil then fail(torch_note) end
  if run_torch then
    for _, np in ipairs(worlds) do
      print(("== PyTorch: %d rank%s (torchrun)"):format(np, np > 1 and "s" or ""))
      local recs, e = DB.torchrun(args.python, np, script_dir .. "torch/bench_ddp.py", common, facts.commit)
      if not recs then failures[#failures + 1] = ("PyTorch on %d ranks: %s"):format(np, e) end
      for _, r in ipairs(recs or {}) do all[#all + 1] = r end
    end
  end
  print(torch_note)
  for _, f in ipairs(failures) do io.stderr:write("bench_ddp.lua: ", f, "\n") end
  print()

  -- rows: (strategy, bucket) in run order; cells from each (impl, world)
  local rows, by_key = {}, {}
  local function row(r)
    local key = r.strategy .. "|" .. tostring(r.bucket_mb or "")
    if not by_key[key] then
      by_key[key] = {strategy = r.strategy == "none" and "none (compute only)" or r.strategy, bucket_mb = r.bucket_mb}
      rows[#rows + 1] = by_key[key]
    end
    return by_key[key]
  end
  local N = args.nproc
  local suggested
  for _, r in ipairs(all) do
    if r.strategy == "plan" then
      suggested = r.suggested_mb
    elseif r.step_ms then
      local x = row(r)
      local p = r.impl == "ember" and "e" or "t"
      if r.world_size == 1 then x[p .. "1"] = r.step_ms end
      if r.world_size == N then
        x[p .. "N"], x[p .. "_exposed"], x[p .. "_hidden"] = r.step_ms, r.exposed_ms, r.hidden_frac
        x[p .. "_comm"], x[p .. "_compute"], x[p .. "_peak"] = r.comm_ms, r.compute_ms, r.peak_memory_bytes
        if p == "e" then x.predicted = r.predicted_exposed_ms end
      end
    end
  end
  for _, x in ipairs(rows) do
    x.e_scaling = x.e1 and x.eN and x.e1 / x.eN or nil
    x.t_scaling = x.t1 and x.tN and x.t1 / x.tN or nil
  end
  local function gib(k) return function(r) return r[k] and r[k] / DB.GiB or nil end end
  local function pct(k) return function(r) return r[k] and 100 * r[k] or nil end end
  local columns = {
    "strategy", {key = "bucket_mb", title = "bucket MB", fmt = "%g"},
    {key = "e1", title = "Ember 1 GPU ms", fmt = "%.2f"},
    {key = "eN", title = ("Ember %d GPU ms"):format(N), fmt = "%.2f"},
    {key = "e_scaling", title = "Ember t1/tN", fmt = "%.3f"},
    {key = "e_compute", title = "Ember compute ms", fmt = "%.2f"},
    {key = "e_comm", title = "Ember comm ms", fmt = "%.2f"},
    {key = "e_exposed", title = "Ember exposed ms", fmt = "%.2f"},
    {key = "e_hidden_pct", title = "Ember hidden %", fmt = "%.0f", value = pct("e_hidden")},
    {key = "e_peak_gib", title = "Ember peak GiB", fmt = "%.2f", value = gib("e_peak")},
    {key = "t1", title = "PyTorch 1 GPU ms", fmt = "%.2f"},
    {key = "tN", title = ("PyTorch %d GPU ms"):format(N), fmt = "%.2f"},
    {key = "t_scaling", title = "PyTorch t1/tN", fmt = "%.3f"},
    {key = "t_exposed", title = "PyTorch exposed ms", fmt = "%.2f"},
    {key = "t_hidden_pct", title = "PyTorch hidden %", fmt = "%.0f", value = pct("t_hidden")},
    {key = "t_peak_gib", title = "PyTorch peak GiB", fmt = "%.2f", value = gib("t_peak")},
    {key = "ratio", title = "Ember/PyTorch step", fmt = "%.3f",
     value = function(r) return r.eN and r.tN and r.eN / r.tN or nil end},
  }
  if args.plan then
    table.insert(columns, 9, {key = "predicted", title = "predicted exposed ms", fmt = "%.2f"})
  end
  local report = require "ember.report"
  local tbl = report.markdown_table(columns, rows)
  print(("DDP, %s, batch %d x context %d per GPU, %s, %d ranks (times: medians, slowest rank):")
    :format(args.model, B, T, args.precision, N))
  io.write(tbl)
  local notes = {"", torch_note,
    "compute = the step with every collective skipped (Ember: a no-op strategy; PyTorch: no_sync); " ..
    "comm = the strategy's collectives alone; exposed = step − compute; hidden = 1 − exposed/comm; " ..
    "t1/tN = weak scaling (same batch per GPU)."}
  if suggested then
    local line = ("planner: suggested bucket %g MB (ember.ddp_planner, from one measured backward and the fitted link)")
      :format(suggested)
    print(line)
    notes[#notes + 1] = line
  end
  -- communication accounting, Ember's N-rank rows
  print()
  print(("communication per step and rank, %d ranks: formula 2(n-1)/n x gradient bytes vs ember.dist.stats():"):format(N))
  for _, r in ipairs(all) do
    if r.impl == "ember" and r.world_size == N and r.strategy ~= "none" and r.formula_wire_bytes_per_step then
      local line = ("  %-9s %6s  formula %.4g B  measured %.4g B (payload %.4g B in %.4g all-reduces)%s"):format(
        r.strategy, r.bucket_mb and (r.bucket_mb .. "MB") or "", r.formula_wire_bytes_per_step,
        r.measured_wire_bytes_per_step, r.measured_payload_bytes_per_step, r.measured_allreduce_calls_per_step,
        math.abs(r.measured_wire_bytes_per_step - r.formula_wire_bytes_per_step) <= 1e-6 * r.formula_wire_bytes_per_step
          and "  = formula" or "  DIFFERS")
      print(line)
      notes[#notes + 1] = line
    end
  end
  DB.write_outputs(args, all, header, tbl, notes)
  if #failures > 0 then os.exit(1) end
end

if DB.is_worker() then worker() else driver() end
