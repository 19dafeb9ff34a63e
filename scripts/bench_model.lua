--- End-to-end benchmark of the reference TransformerLM (CS336 A2 §1.1.3):
-- random batch, `--warmup` untimed steps, `--steps` timed steps with the
-- device synchronised around each, then mean ± std, median, tokens/s, MFU
-- and peak memory. bench/pytorch_baseline.py is the same benchmark in
-- PyTorch, with the same flags, output lines and JSON fields.
--
--   ember run scripts/bench_model.lua --model small --mode train --precision bf16
--   ember run scripts/bench_model.lua --model xl --mode train --precision bf16 --graph --json runs.jsonl
--
-- Modes: fwd (forward + loss under no_grad), fwd_bwd (zero_grad, forward,
-- loss, backward), train (fwd_bwd + AdamW step). --precision bf16 wraps the
-- forward and loss in ember.autocast("bf16"); backward runs outside it, as in
-- PyTorch. --graph captures one whole step with ember.cuda.graph after the
-- warm-up steps and times its replays. --overlap-optimizer runs AdamW's
-- updates during backward (opt:step_in_backward: docs/training.md) and drops
-- each gradient once its update ran (free_grads; --keep-grads keeps them, the
-- A/B): the step's peak is then the forward's end, not 4 bytes a parameter of
-- gradients on top of everything at the end of backward (2.7B: docs/perf.md).
-- Out of memory is a result ("OOM"), printed and written to the JSON line, not
-- a crash.
--
-- MFU = tokens/s · FLOPs per token / peak FLOP/s, with (PaLM, appendix B)
--   train, fwd_bwd: FLOPs/token = 6·N + 12·L·d_model·T
--   fwd:            FLOPs/token = 2·N +  4·L·d_model·T
-- where N counts the parameters that take part in matmuls: all but the token
-- embeddings (the lm_head is a real matmul here, its weight is not tied), and
-- the attention term counts q·kᵀ and attn·v over the whole T×T square (no
-- causal discount), like PaLM. Peak: H100/H200 SXM dense bf16 989.4 TFLOP/s,
-- TF32 494.7, plain fp32 66.9 (--peak-tflops overrides); the script prints
-- the peak it divides by.
--
-- Measurement (docs/profiling.md):
--   --profile   after the timed steps, profile one more step and one forward
--               with ember.profiler: top kernels per phase, forward vs train,
--               attention kernels by op (softmax vs matmul), the check line
--               "sum of kernel durations vs wall", and the roofline tables
--               (bytes, FLOPs, GB/s, TF/s, % of peak per op and per kernel;
--               --peak-gbs overrides the bandwidth peak); --profile-trace FILE
--               adds a Chrome trace (Perfetto) of the profiled step; with
--               --matmul-tune (or EMBER_MATMUL_TUNE=1) also "matmul
--               algorithms": per gemm key, cuBLASLt's tuned choice vs its
--               heuristic's first, and their times.
--   --matmul-tune  time cuBLASLt's candidate algorithms for each gemm shape
--               during the first warm-up step and keep the fastest
--               (ember.backends.matmul_tune; docs/perf.md).
--   NVTX        ranges "warmup", "step N", and the phases forward / backward /
--               optimizer are always emitted; --nvtx adds one range per op:
--     nsys profile -t cuda,nvtx -o bench ember run scripts/bench_model.lua --model xl --nvtx
local ember = require "ember"
local argparse = require "argparse"
local nn, optim = ember.nn, ember.optim

local script_dir = (arg and arg[0] or ""):match("^(.*/)") or "./"
local MF = dofile(script_dir .. "lib/model_flags.lua")
local S = dofile(script_dir .. "lib/study.lua")

local parser = argparse("bench_model.lua",
  "Time forward / backward / training steps of the reference TransformerLM.")
MF.add_options(parser, {batch = "Batch size B.", context = "Context length T (tokens per sequence)."})
parser:option("--mode", "What one step does.", "train"):choices({"fwd", "fwd_bwd", "train"})
parser:option("--warmup", "Untimed steps first.", "5"):convert(math.tointeger)
parser:option("--steps", "Timed steps.", "10"):convert(math.tointeger)
parser:option("--precision", "fp32, or bf16 autocast.", "fp32"):choices({"fp32", "bf16"})
parser:flag("--tf32", "Allow TF32 for f32 matmuls (ember.backends.tf32).")
parser:flag("--matmul-tune", "Time cuBLASLt's candidate algorithms per matmul shape in the first warm-up step and " ..
  "keep the fastest (ember.backends.matmul_tune; default: EMBER_MATMUL_TUNE, else off).")
parser:option("--attn", "Attention: auto (flash kernels on CUDA with bf16, naive elsewhere), " ..
  "flash or naive.", "auto"):choices({"auto", "flash", "naive"})
parser:flag("--graph", "Capture one step as a CUDA graph and time its replays (cuda only).")
parser:flag("--overlap-optimizer", "train: AdamW's updates run during backward, each bucket as soon as its " ..
  "gradients are final, on a side stream (opt:step_in_backward); the same bits as the plain step.")
parser:flag("--overlap-inline", "With --overlap-optimizer: the updates on the main stream, between backward's " ..
  "kernels (step_in_backward{side_stream = false}; A/B of the side stream).")
parser:flag("--keep-grads", "With --overlap-optimizer: keep every gradient until the next zero_grad (A/B; " ..
  "default: each is dropped once its update ran, step_in_backward{free_grads = true}).")
parser:option("--overlap-bucket-mb", "With --overlap-optimizer: MiB of parameters per update launch " ..
  "(0: one per parameter).", "32"):convert(tonumber)
parser:flag("--no-shadow-weights", "AdamW without shadow weights: autocast casts every weight each step (A/B).")
parser:option("--device", "cpu or cuda (default: cuda when available).")
parser:option("--lr", "AdamW learning rate.", "1e-4"):convert(tonumber)
parser:option("--seed", "Seed for weights and batch.", "0"):convert(math.tointeger)
parser:option("--peak-tflops", "Peak TFLOP/s for MFU (default: from the device and precision).")
  :convert(tonumber)
parser:flag("--breakdown", "After the timed steps, one more step timed and measured by phase " ..
  "(forward, backward, optimizer): ms and memory.")
parser:flag("--profile", "After the timed steps, profile one step and one forward (ember.profiler): " ..
  "top kernels per phase, forward vs train, attention kernels by op.")
parser:option("--profile-trace", "With --profile: write the profiled step's Chrome trace (Perfetto) here.")
parser:option("--peak-gbs", "With --profile: memory bandwidth peak (GB/s) of the roofline columns " ..
  "(default: the GPU's datasheet, or the CPU measured by a copy).")
  :convert(tonumber)
parser:flag("--nvtx", "NVTX range per op (ember.nvtx.enable) for Nsight Systems; step and phase ranges are always on.")
parser:flag("--quiet", "No per-step lines.")
S.add_threads_option(parser)
parser:option("--json", "Append one JSON line of results to this file.")
local args = parser:parse(arg)
args.graph, args.tf32, args.quiet = args.graph or false, args.tf32 or false, args.quiet or false
args.overlap_optimizer = args.overlap_optimizer or false
args.keep_grads = args.keep_grads or false
args.overlap_inline = args.overlap_inline or false
if args.matmul_tune then ember.backends.matmul_tune(true) end
args.matmul_tune = ember.backends.matmul_tune()       -- the flag, or EMBER_MATMUL_TUNE
args.profile = args.profile or args.profile_trace ~= nil

local function fail(msg) io.stderr:write("bench_model.lua: ", msg, "\n") os.exit(2) end
S.check_counts(args, {"context", "batch", "vocab", "steps", "seed"}, fail)
S.apply_threads(args, fail)
args.device = args.device or (ember.cuda.is_available() and "cuda" or "cpu")
local on_cuda = args.device:match("^cuda") ~= nil
if args.graph and not on_cuda then fail("--graph needs --device cuda") end
if args.overlap_optimizer and args.mode ~= "train" then fail("--overlap-optimizer needs --mode train") end
if args.keep_grads and not args.overlap_optimizer then fail("--keep-grads needs --overlap-optimizer") end
if args.overlap_inline and not args.overlap_optimizer then fail("--overlap-inline needs --overlap-optimizer") end
if not (args.overlap_bucket_mb and args.overlap_bucket_mb >= 0) then fail("--overlap-bucket-mb must be >= 0") end
if args.attn == "flash" and not (on_cuda and args.precision == "bf16") then
  fail("--attn flash: the flash kernels need --device cuda and --precision bf16")
end

-- ---------------------------------------------------------------------------
-- environment facts for the report

local runinfo = require "ember.runinfo"
local run_facts = runinfo.collect(args.device)
local function device_name() return run_facts.device end
local function git_commit() return run_facts.commit end
local function driver_version() return run_facts.driver end

--- Peak dense TFLOP/s the MFU divides by (H100/H200 SXM datasheet figures).
local function peak_tflops(dev)
  if args.peak_tflops then return args.peak_tflops, "--peak-tflops" end
  if not on_cuda then return nil, "no peak known for a CPU" end
  if dev:match("H100") or dev:match("H200") then
    if args.precision == "bf16" then return 989.4, "H100/H200 SXM dense bf16" end
    if args.tf32 then return 494.7, "H100/H200 SXM dense TF32" end
    return 66.9, "H100/H200 SXM fp32 (no tensor cores)"
  end
  return nil, "unknown device: pass --peak-tflops"
end

-- ---------------------------------------------------------------------------
-- the model, the batch and one step

local cfg = MF.config(args)
-- what "auto" resolves to (the printed config and the JSON line say which ran)
local attn_used = args.attn
if attn_used == "auto" then
  local dh = cfg.d_model // cfg.num_heads
  local probe = on_cuda and args.precision == "bf16" and cfg.d_model % cfg.num_heads == 0 and
    ember.empty({1, cfg.num_heads, 1, dh}, {dtype = "bf16", device = args.device})
  attn_used = probe and ember.core.flash_applies(probe, probe, probe) and "flash" or "naive"
end

local n_params = nn.count_parameters(cfg)
local n_matmul = n_params - cfg.vocab_size * cfg.d_model     -- all but token_embeddings
local L, D, T, B = cfg.num_layers, cfg.d_model, args.context, args.batch
local flops_per_token = args.mode == "fwd" and (2 * n_matmul + 4 * L * D * T)
  or (6 * n_matmul + 12 * L * D * T)
local tokens_per_step = B * T

local dev_name, commit = device_name(), git_commit()
local peak, peak_why = peak_tflops(dev_name)
local config = {
  model = args.model, d_model = D, d_ff = cfg.d_ff, layers = L, heads = cfg.num_heads,
  vocab = cfg.vocab_size, context = T, batch = B, mode = args.mode, precision = args.precision,
  tf32 = args.tf32, matmul_tune = args.matmul_tune, attn = attn_used, graph = args.graph, warmup = args.warmup,
  overlap_optimizer = args.overlap_optimizer, overlap_bucket_mb = args.overlap_optimizer and args.overlap_bucket_mb or nil,
  overlap_free_grads = args.overlap_optimizer and not args.keep_grads or nil,
  overlap_inline = args.overlap_optimizer and args.overlap_inline or nil,
  steps = args.steps, seed = args.seed, lr = args.lr, device = args.device,
  params = n_params, params_matmul = n_matmul, threads = ember.get_num_threads(),
}

S.print_header(run_facts)
print(("config: %s d_model=%d d_ff=%d layers=%d heads=%d vocab=%d context=%d batch=%d " ..
  "mode=%s precision=%s%s%s attn=%s graph=%s%s warmup=%d steps=%d params=%.1fM")
  :format(args.model, D, cfg.d_ff, L, cfg.num_heads, cfg.vocab_size, T, B, args.mode,
    args.precision, args.tf32 and "+tf32" or "", args.matmul_tune and " matmul-tune" or "", attn_used,
    tostring(args.graph),
    args.overlap_optimizer and (" overlap-optimizer(%g MiB%s%s)"):format(args.overlap_bucket_mb,
      args.keep_grads and ", keep grads" or ", free grads", args.overlap_inline and ", inline" or "") or "", args.warmup,
    args.steps, n_params / 1e6))

local function cuda_sync() if on_cuda then ember.cuda.synchronize() end end
local nvtx, context = ember.nvtx, ember.context
if args.nvtx then nvtx.enable(true) end
-- CUPTI subscribed before a graph capture maps replayed kernels to their ops
if args.profile and on_cuda then ember.profiler.init() end

--- --overlap-optimizer: the next backward runs the updates (and drops the
-- gradients unless --keep-grads; on the main stream with --overlap-inline).
local function arm(opt)
  opt:step_in_backward{free_grads = not args.keep_grads, side_stream = not args.overlap_inline}
end

--- One eager step split into phases, each synchronised: {name, ms, allocated
-- bytes after it, peak bytes during it}. Graph mode is not split (one launch).
local function phase_breakdown(model, opt, forward)
  local gib = 2 ^ 30
  local out = {}
  local function phase(name, fn)
    cuda_sync()
    if on_cuda then ember.cuda.reset_peak_memory_stats() end
    local t0 = ember.core.clock()
    local r = fn()
    cuda_sync()
    local e = {name = name, ms = (ember.core.clock() - t0) * 1e3}
    if on_cuda then
      e.allocated, e.peak = ember.cuda.memory_allocated(), ember.cuda.max_memory_allocated()
    end
    out[#out + 1] = e
    return r
  end
  if args.mode == "fwd" then
    phase("forward", function() return ember.no_grad(forward) end)
  else
    phase("zero_grad", function() model:zero_grad() end)
    -- what a full Lua collection frees here is garbage that only waited for the GC
    phase("full_gc", function() collectgarbage() collectgarbage() end)
    local loss = phase("forward", forward)
    if opt and args.overlap_optimizer then arm(opt) end   -- the updates land in "backward"
    phase("backward", function() loss:backward() end)
    loss = nil
    if opt then phase("optimizer", function() opt:step() end) end
  end
  for _, e in ipairs(out) do
    print(("breakdown: %-9s %9.3f ms%s"):format(e.name, e.ms, e.peak and
      ("   allocated after %6.2f GiB, peak during %6.2f GiB"):format(e.allocated / gib, e.peak / gib) or ""))
  end
  return out
end

--- --profile: "matmul algorithms", the keys ember.backends.matmul_tune timed
-- (ember.core.matmul_tune_table) with the chosen and the heuristic's
-- configuration (cuBLASLt's CUBLASLT_ALGO_CONFIG ids: algo, tile, stages,
-- split-k, cluster shape), time per call and calls in the profiled step
-- (`before` and `rows`: the table before and after that step; with --graph,
-- before and after the capture: a replay makes no host calls, each makes the
-- captured step's). Returns the rows for the JSON line.
local function matmul_tune_report(before, rows)
  if not args.matmul_tune and #rows == 0 then
    print("matmul algorithms: tuning off (--matmul-tune or EMBER_MATMUL_TUNE=1 times cuBLASLt's candidates per shape)")
    return nil
  end
  if #rows == 0 then
    print("matmul algorithms: tuning on, no key tuned (only CUDA gemms are tuned)")
    return rows
  end
  local changed, beyond, stepped, tuned_us, heur_us = 0, 0, 0, 0, 0
  for i, r in ipairs(rows) do
    r.step_calls = r.calls - (before[i] and before[i].calls or 0)
    stepped = stepped + r.step_calls
    if r.chosen ~= 0 then changed = changed + 1 end
    if r.chosen > 16 then beyond = beyond + 1 end
  end
  for _, r in ipairs(rows) do
    local n = stepped > 0 and r.step_calls or 1
    if r.time_us and r.heuristic_time_us then
      tuned_us, heur_us = tuned_us + n * r.time_us, heur_us + n * r.heuristic_time_us
    end
  end
  print(("matmul algorithms (ember.backends.matmul_tune): %d keys tuned, %d changed from the heuristic's first " ..
    "(%d to a configuration beyond cuBLASLt's list); %s: %.3f ms tuned vs %.3f ms heuristic (%.1f%% less; each timed alone)")
    :format(#rows, changed, beyond, stepped == 0 and "one call of each key (no calls counted)"
      or args.graph and "the captured step's calls (each replay makes them)" or "the profiled step's calls",
      tuned_us / 1e3, heur_us / 1e3, heur_us > 0 and 100 * (1 - tuned_us / heur_us) or 0))
  -- cands: cuBLASLt's list + the extra split-K/cluster/tile configurations (/ those refused by the check or at launch);
  -- chosen: 0 the heuristic's first, 1-16 its rank in the list, 17 + j extra j (* forced by the test hook)
  print(("  %-8s %-24s %-5s %-4s %-4s %9s %6s  %-20s %-20s %9s %9s %6s %6s"):format("dtype", "n x m x k (batch)",
    "trans", "bias", "beta", "cands", "chosen", "algo/tile/stg/sk/cl", "heuristic's", "tuned us", "heur. us", "gain",
    "calls"))
  local function cfg_str(a, t, st, sk, cl) return ("%d/%d/%d/%d/%d"):format(a, t, st, sk, cl) end
  for _, r in ipairs(rows) do
    local shape = ("%d x %d x %d"):format(r.n, r.m, r.k) .. (r.batch > 1 and (" (%d)"):format(r.batch) or "")
    local gain = r.time_us and r.heuristic_time_us and r.heuristic_time_us > 0 and
      ("%5.1f%%"):format(100 * (1 - r.time_us / r.heuristic_time_us)) or "-"
    local cands = r.in_capture and "capt." or r.candidates == 0 and "0" or
      ("%d+%d/%d"):format(r.candidates - r.extra, r.extra, r.skipped)
    print(("  %-8s %-24s %-5s %-4s %-4g %9s %6s  %-20s %-20s %9s %9s %6s %6s"):format(r.dtype .. (r.c_f32 and ">f32" or ""),
      shape, (r.a_trans and "T" or "N") .. (r.b_trans and "T" or "N"), r.bias and "yes" or "-", r.beta,
      cands, tostring(r.chosen) .. (r.forced and "*" or ""), cfg_str(r.algo, r.tile, r.stages, r.splitk, r.cluster),
      cfg_str(r.heuristic_algo, r.heuristic_tile, r.heuristic_stages, r.heuristic_splitk, r.heuristic_cluster),
      r.time_us and ("%.2f"):format(r.time_us) or "-", r.heuristic_time_us and ("%.2f"):format(r.heuristic_time_us) or "-",
      gain, stepped > 0 and tostring(r.step_calls) or "-"))
  end
  return rows
end

--- --profile: one more step and one forward under ember.profiler, and the
-- tables that answer "which kernels, in which phase, inside attention".
-- Returns the figures for the JSON line.
local function profile_report(timed, forward, samples, tune_capture)
  local prof = ember.profiler
  local mean = require("ember.bench").stats(samples).mean
  -- CPU tensors: host timing (a CUDA build would time their ops by kernels, of which there are none)
  local backend = not on_cuda and "host" or nil
  local tune_before = ember.core.matmul_tune_table()
  local train = ember.profile(function()
    nvtx.range("profiled step", timed)
    prof.step()
  end, {print = false, backend = backend})
  local tune_rows = ember.core.matmul_tune_table()   -- calls counted up to the end of the step
  local fwd = ember.profile(function() nvtx.range("profiled forward", ember.no_grad, forward) end,
    {print = false, backend = backend})
  local ts, fs = train:stats(), fwd:stats()
  local kernels = train:has_kernels()
  print()
  print(("profile: one %s step%s and one forward, after the timed steps"):format(args.mode,
    args.graph and " (a graph replay)" or ""))
  print(train:summary())
  for _, ph in ipairs({"forward", "backward", "optimizer"}) do
    if ts.phases[ph].count > 0 or ts.phases[ph].kernels > 0 then
      print()
      print(kernels and train:kernel_table{phase = ph, top = 10} or train:op_table{phase = ph, top = 10})
    end
  end
  print()
  print("forward vs train (profiled):")
  local function line(name, n, kms, wall)
    print(("  %-28s %8s kernels  %10s ms of kernels  %10s ms wall"):format(name, n and tostring(n) or "-",
      kms and ("%.3f"):format(kms) or "-", wall and ("%.3f"):format(wall) or "-"))
  end
  line("forward only (no_grad)", kernels and fs.kernels, kernels and fs.kernel_ms, fs.wall_ms)
  for _, ph in ipairs({"forward", "backward", "optimizer"}) do
    local p = ts.phases[ph]
    if p.count > 0 or p.kernels > 0 then
      line(("%s phase of the step"):format(ph), kernels and p.kernels, kernels and p.kernel_ms,
        p.count > 0 and p.wall_ms or nil)
    end
  end
  line("whole " .. args.mode .. " step", kernels and ts.kernels, kernels and ts.kernel_ms, ts.wall_ms)
  print()
  print(kernels and train:kernel_table{by = "op", module = "*.attn*", top = 12}
    or train:op_table{module = "*.attn*", top = 12})
  -- roofline: how far each op (and kernel) is from its floor; peaks from the device unless given
  local peaks = train:peaks()
  if args.peak_gbs then
    peaks = require("ember.peaks").make(args.peak_gbs, args.peak_tflops or (peaks and peaks.tflops) or 0,
      "--peak-gbs" .. (args.peak_tflops and "/--peak-tflops" or ""))
  end
  print()
  print(train:roofline_table{by = "op", top = 25, peaks = peaks})
  if kernels then
    print()
    print(train:roofline_table{by = "kernel", top = 20, peaks = peaks})
  end
  local cov, cov_ms, roof_ms = train:cost_coverage()
  local roof_rows = {}
  -- a graph replay leaves no host op records: its op rows come from the replayed kernels
  local op_rows = train:replayed() and train:kernels{by = "op", peaks = peaks} or train:ops{peaks = peaks}
  for i, r in ipairs(op_rows) do
    if r.cost_ms and r.cost_ms > 0 then
      roof_rows[#roof_rows + 1] = {op = r.key, ms = r.roof_ms, bytes = r.bytes, flops = r.flops, gbs = r.gbs,
                                   tflops = r.tflops, pct_peak = r.pct_peak, bound = r.bound}
    end
    if i >= 40 then break end
  end
  local figures = {
    backend = train.backend, label = train.label,
    roofline = {coverage_pct = cov, costed_ms = cov_ms, time_ms = roof_ms, peaks = peaks, ops = roof_rows},
    train = {wall_ms = ts.wall_ms, kernel_ms = ts.kernel_ms, gpu_busy_ms = ts.gpu_busy_ms, kernels = ts.kernels,
             phases = ts.phases},
    forward = {wall_ms = fs.wall_ms, kernel_ms = fs.kernel_ms, gpu_busy_ms = fs.gpu_busy_ms, kernels = fs.kernels},
  }
  -- the check: kernel time is honest when it is close to the wall time of a device-bound step
  local timed_fwd = args.mode == "fwd" and not args.graph and mean or nil
  if kernels then
    print(("profile check: forward: sum of kernel durations %.3f ms, GPU busy %.3f ms, profiled wall %.3f ms%s")
      :format(fs.kernel_ms, fs.gpu_busy_ms, fs.wall_ms, timed_fwd and
        (", timed forward mean %.3f ms (kernels %+.1f%%)"):format(timed_fwd, 100 * (fs.kernel_ms / timed_fwd - 1)) or ""))
    print(("profile check: %s step: sum of kernel durations %.3f ms, GPU busy %.3f ms, profiled wall %.3f ms, " ..
      "timed mean %.3f ms (kernels %+.1f%%)"):format(args.mode, ts.kernel_ms, ts.gpu_busy_ms, ts.wall_ms, mean,
      100 * (ts.kernel_ms / mean - 1)))
  else
    print(("profile check: no kernel times (%s); forward profiled wall %.3f ms, step %.3f ms, timed mean %.3f ms")
      :format(train.label, fs.wall_ms, ts.wall_ms, mean))
  end
  print()
  if tune_capture then tune_before, tune_rows = tune_capture.before, tune_capture.after end
  figures.matmul_algorithms = matmul_tune_report(tune_before, tune_rows)
  if args.profile_trace then
    local bytes = train:export_chrome_trace(args.profile_trace)
    print(("profile trace: %s (%.1f MB, %d ops, %d kernels; open in ui.perfetto.dev)")
      :format(args.profile_trace, bytes / 1e6, ts.ops, ts.kernels))
    figures.trace = args.profile_trace
  end
  train:close()
  fwd:close()
  return figures
end

local function run()
  if args.tf32 then ember.backends.tf32(true) end
  if on_cuda then ember.cuda.reset_peak_memory_stats() end
  ember.manual_seed(args.seed)
  local model = nn.TransformerLM(cfg)
  local opt = args.mode == "train" and optim.AdamW(model:parameters(),
    {lr = args.lr, shadow_weights = not args.no_shadow_weights, overlap_bucket_mb = args.overlap_bucket_mb}) or nil
  local x, y = MF.batch(B, T, cfg.vocab_size, args.device)
  local autocast_fn = MF.loss_fn(model, x, y, args.precision)
  -- the phase names the NVTX range and the profiler's attribution
  local function forward() return context.phase("forward", autocast_fn) end

  local step
  if args.mode == "fwd" then
    step = function() return ember.no_grad(forward) end
  else
    step = MF.train_step(model, opt, forward, args.overlap_optimizer and arm or nil)
  end

  local loss
  nvtx.range("warmup", function()
    for w = 1, args.warmup do
      loss = step()
      if on_cuda and not args.quiet then
        cuda_sync()
        print(("warm-up %d/%d  peak so far %.2f GiB"):format(w, args.warmup, ember.cuda.max_memory_allocated() / 2 ^ 30))
      end
    end
    cuda_sync()
  end)
  local timed, tune_capture = step, nil
  if args.graph then
    if args.warmup == 0 then loss = step() cuda_sync() end   -- state and workspaces exist before capture
    model:zero_grad()
    -- --profile: the gemm calls of the captured step, which every replay makes ("matmul algorithms")
    local tune_before = args.profile and ember.core.matmul_tune_table() or nil
    local g = ember.cuda.graph(function() loss = step() end, {warmup = 0})
    if tune_before then tune_capture = {before = tune_before, after = ember.core.matmul_tune_table()} end
    g:replay()                                        -- one untimed replay
    cuda_sync()
    timed = function() g:replay() end
  end

  local samples = {}
  for i = 1, args.steps do
    cuda_sync()
    local t0 = ember.core.clock()
    local l = nvtx.range("step " .. i, function()
      local r = timed()
      cuda_sync()
      return r
    end)
    samples[i] = (ember.core.clock() - t0) * 1e3
    if l then loss = l end
    if not args.quiet then
      local tps = tokens_per_step / samples[i] * 1e3
      print(("step %3d/%d  %9.3f ms  %12.0f tok/s%s%s"):format(i, args.steps, samples[i], tps,
        peak and ("  MFU %5.1f%%"):format(100 * tps * flops_per_token / (peak * 1e12)) or "",
        on_cuda and ("  peak so far %.2f GiB"):format(ember.cuda.max_memory_allocated() / 2 ^ 30) or ""))
    end
  end
  local final_loss = loss and loss:item() or nil
  local peak_mem = on_cuda and ember.cuda.max_memory_allocated() or nil
  local breakdown = args.breakdown and phase_breakdown(model, opt, forward) or nil
  local profiled = args.profile and profile_report(timed, forward, samples, tune_capture) or nil
  return samples, final_loss, peak_mem, breakdown, profiled
end

local result = {
  tool = "ember", commit = commit, device = dev_name, driver = driver_version(),
  date = os.date("!%Y-%m-%dT%H:%M:%SZ"), config = config,
  flops_per_token = flops_per_token, peak_tflops = peak,
  command = "ember run scripts/bench_model.lua " .. table.concat(arg, " "),
}

local ok, samples, final_loss, peak_mem, breakdown, profiled = pcall(run)
collectgarbage()
collectgarbage()
if not ok then
  local msg = tostring(samples)
  if msg:match("out of memory") then
    result.status, result.error = "OOM", msg
    print("result: OOM (" .. msg:gsub("\n.*", "") .. ")")
  else
    result.status, result.error = "error", msg
    io.stderr:write("bench_model.lua: ", msg, "\n")
  end
else
  local stats = require("ember.bench").stats(samples)
  local tps = tokens_per_step / stats.mean * 1e3
  result.status = "ok"
  result.samples_ms = samples
  result.mean_ms, result.std_ms, result.median_ms = stats.mean, stats.std, stats.median
  result.min_ms, result.max_ms = stats.min, stats.max
  result.tokens_per_s = tps
  result.mfu = peak and tps * flops_per_token / (peak * 1e12) or nil
  result.peak_memory_bytes = peak_mem
  result.final_loss = final_loss
  result.breakdown = breakdown
  result.profile = profiled
  print(("time: %.3f ± %.3f ms per step (mean ± std of %d), median %.3f ms, min %.3f ms")
    :format(stats.mean, stats.std, #samples, stats.median, stats.min))
  print(("throughput: %.0f tokens/s (%d tokens per step, from the mean)"):format(tps, tokens_per_step))
  if peak then
    print(("MFU: %.1f%% = tokens/s × %.4g FLOPs/token / %.1f TFLOP/s (%s); FLOPs/token = %s")
      :format(100 * result.mfu, flops_per_token, peak, peak_why,
        args.mode == "fwd" and "2·N + 4·L·d·T" or "6·N + 12·L·d·T"))
  else
    print(("MFU: n/a (%s); FLOPs/token = %.4g"):format(peak_why, flops_per_token))
  end
  if peak_mem then
    print(("peak memory: %.2f GiB (ember.cuda.max_memory_allocated)"):format(peak_mem / 2 ^ 30))
  end
  if final_loss then print(("loss: %.4f"):format(final_loss)) end
end

if args.json then S.append_json(args.json, result, fail) end
os.exit(result.status == "error" and 1 or 0)
