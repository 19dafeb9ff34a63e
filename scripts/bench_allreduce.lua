--- All-reduce time and bandwidth, Ember's ember.dist beside PyTorch's
-- torch.distributed on the same GPUs, in nccl-tests' terms:
--   algbw = bytes / time          busbw = algbw · 2(n−1)/n
-- (bytes = the tensor's size, time = one all-reduce, n = ranks; busbw is the
-- figure to hold against the link bandwidth: a ring moves 2(n−1)/n · bytes
-- in and out of each rank). GB/s are 1e9 bytes per second; sizes are MiB.
--
--   ember run scripts/bench_allreduce.lua --nproc 2                    (driver: Ember, then PyTorch, one table)
--   ember run scripts/bench_allreduce.lua --nproc 2 --out results/     (+ results/allreduce.{jsonl,md})
--   ember launch --nproc 2 scripts/bench_allreduce.lua --sizes 1,64    (Ember's ranks only)
--   ember run scripts/bench_allreduce.lua --device cpu --sizes 0.01,0.1 --nproc 2   (MPI, CPU tensors)
--
-- Method (both sides the same): per size, a tensor of zeros (so repeated sums
-- stay finite) on each rank's device; `--warmup` all-reduces, a barrier, then
-- `--iters` back-to-back synchronous all-reduces. CUDA: an event recorded on
-- the current stream before and after them (a synchronous collective makes
-- the current stream wait for NCCL's comm stream, in Ember and in PyTorch),
-- then the end event is synchronised; CPU: the host wall clock around the
-- loop. time = elapsed / iters on each rank, and the reported time is the
-- slowest rank's (max over ranks); time_avg_us is the mean over ranks.
--
-- Driver mode (not under a launch): runs `ember launch --nproc N` on this
-- script, then `python3 -m torch.distributed.run --nproc_per_node N
-- scripts/torch/bench_allreduce.py` (NCCL for cuda, gloo for cpu) when python3
-- imports torch, one after the other, and prints one Markdown table with both.
local ember = require "ember"
local argparse = require "argparse"

local script_dir = (arg and arg[0] or ""):match("^(.*/)") or "./"
local DB = dofile(script_dir .. "lib/dist_bench.lua")

local parser = argparse("bench_allreduce.lua",
  "All-reduce time, algbw and busbw over sizes: Ember (ember.dist) and PyTorch (torch.distributed).")
parser:epilog([[
Definitions (nccl-tests'): time = one all-reduce, the slowest rank's;
  algbw = bytes / time; busbw = algbw * 2(n-1)/n for n ranks (GB/s = 1e9 B/s).
Timing: CUDA events on the current stream around --iters back-to-back
  synchronous all-reduces, then the end event synchronised; CPU: wall clock.
Driver mode (run plainly, not under ember launch): Ember's ranks through
  `ember launch --nproc N`, then PyTorch's through torchrun, then one table.
Examples:
  ember run scripts/bench_allreduce.lua --nproc 2 --out results/
  ember run scripts/bench_allreduce.lua --device cpu --sizes 0.01,0.1 --nproc 2]])
parser:option("--sizes", "Tensor sizes in MiB, a comma list.", "1,10,100,1000")
parser:option("--dtype", "Element type.", "f32"):choices({"f32", "bf16", "f16", "f64"})
parser:option("--op", "Reduction.", "sum"):choices({"sum", "avg", "max", "min"})
parser:option("--warmup", "Untimed all-reduces per size.", "5"):convert(math.tointeger)
parser:option("--iters", "Timed back-to-back all-reduces per size.", "20"):convert(math.tointeger)
DB.add_common_options(parser, "default: the number of GPUs, 2 on cpu")
local args = parser:parse(arg)

local function fail(msg) io.stderr:write("bench_allreduce.lua: ", msg, "\n") os.exit(2) end
local sizes, err = DB.numbers(args.sizes, "--sizes")
if not sizes then fail(err) end
if not args.warmup or args.warmup < 0 then fail("--warmup must be an integer >= 0") end
if not args.iters or args.iters < 1 then fail("--iters must be a positive integer") end
local ok_common, err_common = DB.resolve_common(args, "allreduce")
if not ok_common then fail(err_common) end
local on_cuda = args.device == "cuda"
local ELEM = {f32 = 4, bf16 = 2, f16 = 2, f64 = 8}

--- Elements of a `mib`-MiB tensor of args.dtype (at least one).
local function numel_of(mib) return math.max(1, math.floor(mib * DB.MiB / ELEM[args.dtype])) end

local config = {study = "allreduce", dtype = args.dtype, op = args.op, warmup = args.warmup,
  iters = args.iters, sizes_mib = sizes, device_kind = args.device}

-- ---------------------------------------------------------------------------
-- worker: one rank of the measurement

local function worker()
  local dist = ember.dist
  dist.init()
  local rank, n = dist.rank(), dist.world_size()
  local device = args.device
  if rank == 0 then
    DB.print_header(device, ("ember all_reduce dtype=%s op=%s ranks=%d backend=%s " ..
      "sizes=%s MiB warmup=%d iters=%d"):format(args.dtype, args.op, n, on_cuda and "nccl" or "mpi",
      args.sizes, args.warmup, args.iters))
  end
  dist.reset_stats()
  local calls = 0
  for _, mib in ipairs(sizes) do
    local numel = numel_of(mib)
    local bytes = numel * ELEM[args.dtype]
    local t = ember.zeros({numel}, {dtype = args.dtype, device = device})
    local opts = {op = args.op}
    for _ = 1, args.warmup do dist.all_reduce(t, opts) end
    dist.barrier()
    local ms = DB.time_calls(function() dist.all_reduce(t, opts) end, args.iters, on_cuda)
    calls = calls + args.warmup + args.iters
    local ms_max = DB.reduce_number(ms, "max", device)
    local ms_avg = DB.reduce_number(ms, "avg", device)
    t = nil
    collectgarbage()
    if rank == 0 then
      local algbw = bytes / (ms_max * 1e-3) / 1e9
      local busbw = algbw * 2 * (n - 1) / n
      print(("all_reduce %10.3f MiB  %12d B  %10.1f us (avg over ranks %10.1f)  algbw %8.2f GB/s  " ..
        "busbw %8.2f GB/s"):format(mib, bytes, ms_max * 1e3, ms_avg * 1e3, algbw, busbw))
      local c = {}
      for k, v in pairs(config) do c[k] = v end
      DB.append(args.json, DB.record({config = c}, {
        impl = "ember", size_mib = mib, bytes = bytes, numel = numel, dtype = args.dtype, op = args.op,
        world_size = n, backend = on_cuda and "nccl" or "mpi", time_us = ms_max * 1e3,
        time_avg_us = ms_avg * 1e3, algbw_gbs = algbw, busbw_gbs = busbw, status = "ok",
      }, device))
    end
  end
  local st = dist.stats().all_reduce
  if rank == 0 then
    -- the measured all-reduces plus the 2 per size that reduce the timings
    print(("ember.dist.stats: all_reduce %d calls (expected %d), %d payload bytes"):format(st.calls,
      calls + 2 * #sizes, st.bytes))
  end
  dist.destroy()
end

-- ---------------------------------------------------------------------------
-- driver: Ember's ranks, then PyTorch's, one table

local function driver()
  local facts, header = DB.print_header(args.device, ("all_reduce dtype=%s op=%s nproc=%d device=%s " ..
    "sizes=%s MiB warmup=%d iters=%d"):format(args.dtype, args.op, args.nproc, args.device, args.sizes,
    args.warmup, args.iters))
  local wargs = {"--sizes", args.sizes, "--dtype", args.dtype, "--op", args.op, "--warmup",
    tostring(args.warmup), "--iters", tostring(args.iters), "--device", args.device}
  print()
  print(("== Ember: %d ranks (ember launch)"):format(args.nproc))
  local ember_recs, ember_err = DB.launch_ember(arg[0], args.nproc, wargs, args.timeout)
  if not ember_recs then io.stderr:write("bench_allreduce.lua: Ember: ", ember_err, "\n") end
  print()
  local run_torch, torch_note = DB.want_torch(args)
  if run_torch == nil then fail(torch_note) end
  local torch_recs, torch_err
  if run_torch then
    print(("== PyTorch: %d ranks (torchrun; %s)"):format(args.nproc, on_cuda and "nccl" or "gloo"))
    torch_recs, torch_err = DB.torchrun(args.python, args.nproc, script_dir .. "torch/bench_allreduce.py",
      wargs, facts.commit)
    if not torch_recs then
      torch_note = "PyTorch: failed (" .. torch_err .. ")"
      io.stderr:write("bench_allreduce.lua: ", torch_note, "\n")
    end
  end
  print(torch_note)
  print()

  local by_size = {}
  local rows = {}
  local function row(mib)
    local key = tostring(mib)
    if not by_size[key] then
      by_size[key] = {size_mib = mib}
      rows[#rows + 1] = by_size[key]
    end
    return by_size[key]
  end
  for _, mib in ipairs(sizes) do row(mib) end
  for _, r in ipairs(ember_recs or {}) do
    local x = row(r.size_mib)
    x.bytes, x.e_us, x.e_alg, x.e_bus = r.bytes, r.time_us, r.algbw_gbs, r.busbw_gbs
  end
  for _, r in ipairs(torch_recs or {}) do
    local x = row(r.size_mib)
    x.bytes = x.bytes or r.bytes
    x.t_us, x.t_alg, x.t_bus = r.time_us, r.algbw_gbs, r.busbw_gbs
  end
  local n = args.nproc
  local columns = {
    {key = "size_mib", title = "size MiB", fmt = "%g"},
    {key = "bytes", title = "bytes", fmt = "%d"},
    {key = "e_us", title = "Ember us", fmt = "%.1f"},
    {key = "e_alg", title = "Ember algbw GB/s", fmt = "%.2f"},
    {key = "e_bus", title = "Ember busbw GB/s", fmt = "%.2f"},
    {key = "t_us", title = "PyTorch us", fmt = "%.1f"},
    {key = "t_alg", title = "PyTorch algbw GB/s", fmt = "%.2f"},
    {key = "t_bus", title = "PyTorch busbw GB/s", fmt = "%.2f"},
    {key = "ratio", title = "Ember/PyTorch busbw", fmt = "%.3f",
     -- one rank moves nothing (busbw 0): compare algbw there
     value = function(r)
       if not (r.e_bus and r.t_bus) then return nil end
       if r.t_bus > 0 then return r.e_bus / r.t_bus end
       return r.e_alg and r.t_alg and r.t_alg > 0 and r.e_alg / r.t_alg or nil
     end},
  }
  local report = require "ember.report"
  local tbl = report.markdown_table(columns, rows)
  print(("all_reduce, %d ranks, %s, op %s (busbw = algbw * 2(n-1)/n = algbw * %.3f):"):format(n, args.dtype,
    args.op, 2 * (n - 1) / n))
  io.write(tbl)
  local records = {}
  for _, r in ipairs(ember_recs or {}) do records[#records + 1] = r end
  for _, r in ipairs(torch_recs or {}) do records[#records + 1] = r end
  local notes = {"", torch_note, "",
    "time: one all-reduce, the slowest rank's, from CUDA events around back-to-back calls (CPU: wall clock); " ..
    "algbw = bytes/time, busbw = algbw·2(n−1)/n (nccl-tests); GB = 1e9 B."}
  DB.write_outputs(args, records, header, tbl, notes)
  if not ember_recs then os.exit(1) end
end

if DB.is_worker() then worker() else driver() end
