--- The op registry's perf mode (ggml's test-backend-ops -p): every perf entry
-- of tests/lua/op_cases.lua timed on one device, per op, shape and dtype:
-- forward time, forward + backward time where the entry asks for it, GB/s or
-- TF/s and the fraction of the device's peak; PyTorch's figure beside ours
-- with --torch (scripts/torch/bench_ops.py, the same shapes and expressions).
--
--   ember run scripts/bench_ops.lua                       # CPU, every op
--   ember run scripts/bench_ops.lua --device cuda --op add,softmax --torch
--   ember run scripts/bench_ops.lua --device cuda --out bench/results/ops
--
-- Each timed call: ember.bench with an L2 flush before every rep (cold
-- caches, as Triton's do_bench), the device synchronised around it, the
-- median of --reps. --timer events times the device instead (CUDA events
-- around the call, the flush not waited for, as do_bench): the launch
-- latency and the host's wake-up after the sync (~10-15 µs) drop out, which
-- is most of the gap to the bandwidth floor for a 32-64 MiB op. Forward runs under no_grad; forward + backward records the
-- graph and calls out:backward(ones), the inputs' .grad dropped (untimed)
-- before each rep. Bytes default to every tensor input read once plus the
-- output written once (the least any implementation must move); entries with
-- FLOPs (matmul, attention) report TF/s instead. Entries that count their
-- backward's bytes (bwd_bytes) get a backward GB/s too, over the time of
-- forward + backward less the forward's (graph recording included). Peaks: scripts/lib/device_peaks.lua
-- (datasheet figures); on the CPU the memory bandwidth measured first, unless
-- --peak-gbs is given, two ways over --stream-mb of f32: a STREAM-like copy
-- (read + write counted) and a read of every byte with nothing written
-- (ember.stream_read). A read-only op (its output at most 1/16 of its bytes:
-- reductions) is divided by the read bandwidth, marked "(read)", every other
-- op by the copy's: a CPU reads faster than it copies, and dividing a
-- reduction by the copy's rate would flatter it. On a shared host whose
-- bandwidth drifts, --peak-each times the copy (or the read) interleaved
-- with the row, one rep of each in turn (median of --reps each), and divides
-- by that ("85% of 160": the row's own reference in GB/s).
-- --threads sets the CPU thread count (the header, every JSON line and the
-- Markdown file say which ran).
--   ember run scripts/bench_ops.lua --threads 1 --op add,sum,softmax
-- Output: a Markdown table on stdout (and in DIR/ops.md with --out), one JSON
-- line per measurement (DIR/ops.jsonl, or --json FILE).
local ember = require "ember"
local argparse = require "argparse"
local cjson = require "cjson"
local runinfo = require "ember.runinfo"

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local root = here .. "../"
local peaks = dofile(here .. "lib/device_peaks.lua")
local S = dofile(here .. "lib/study.lua")

local parser = argparse("bench_ops.lua", "Time every op of the op registry (perf mode) on one device.")
parser:option("--device", "cpu or cuda.", "cpu")
parser:option("--op", "Only these ops (comma list of registry op names, e.g. add,softmax).")
parser:option("--match", "Only entries whose name contains this text (plain, e.g. \"(8192,8192)\").")
parser:option("--dtype", "Only these dtypes (comma list; default: each entry's, f32 only on the CPU).")
parser:option("--reps", "Timed reps per measurement (the median is reported).", "20"):convert(math.tointeger)
parser:option("--warmup", "Untimed calls first.", "3"):convert(math.tointeger)
parser:flag("--no-backward", "Time forwards only.")
parser:flag("--no-flush", "Do not flush the L2 (or CPU caches) before each rep.")
parser:option("--flush", "CUDA: evict the L2 by reading a buffer (read: the lines left are clean) or by zeroing it "
  .. "(write, as Triton's do_bench: the op then also pays ~15 us of write-backs on an H100). PyTorch's side "
  .. "flushes the same way.", "read"):choices({"read", "write"})
parser:option("--timer", "host: host clock between device syncs (counts launch latency); "
  .. "events: CUDA events around the call, the flush not waited for (Triton's do_bench).", "host")
  :choices({"host", "events"})
parser:flag("--torch", "Time the same expressions in PyTorch (python3 scripts/torch/bench_ops.py).")
parser:option("--peak-gbs", "Peak memory bandwidth to divide by (GB/s)."):convert(tonumber)
parser:option("--peak-tflops", "Peak compute to divide by (TFLOP/s)."):convert(tonumber)
parser:option("--stream-mb", "CPU: MiB of f32 the bandwidth copy moves each way and the read reads (0: do not measure).",
  "256")
  :convert(math.tointeger)
parser:flag("--peak-each", "CPU: time the copy (or, for a read-only op, the read) interleaved with each row, one rep "
  .. "of each in turn (median of --reps each), and hold the row to that: a noisy host's drift cancels out.")
S.add_threads_option(parser)
parser:option("--out", "Write DIR/ops.jsonl and DIR/ops.md.")
parser:option("--json", "Append the JSON lines to this file.")
parser:flag("--list", "List the perf entries and exit.")
local args = parser:parse(arg)

local function split(s)
  if not s then return nil end
  local t = {}
  for w in s:gmatch("[^,%s]+") do t[#t + 1] = w end
  return t
end
local function set(list)
  if not list then return nil end
  local s = {}
  for _, v in ipairs(list) do s[v] = true end
  return s
end

local device = args.device
if device ~= "cpu" and not device:match("^cuda") then
  parser:error(("--device: expected cpu or cuda[:N], got %s"):format(device))
end
local on_cuda = device:match("^cuda") ~= nil
if on_cuda and not ember.cuda.is_available() then
  io.stderr:write("bench_ops.lua: --device " .. device .. " but no CUDA device is available\n")
  os.exit(1)
end
if args.reps < 1 then parser:error("--reps: expected an integer >= 1, got " .. args.reps) end
if not args.stream_mb or args.stream_mb < 0 then parser:error("--stream-mb: expected an integer >= 0") end
S.apply_threads(args, function(msg) parser:error(msg) end)

local cases = dofile(root .. "tests/lua/op_cases.lua")
local want_ops, want_dtypes = set(split(args.op)), set(split(args.dtype))
if want_ops then
  local known = {}
  for _, p in ipairs(cases.perf) do known[p.op] = true end
  for op in pairs(want_ops) do
    if not known[op] then
      local names = {}
      for k in pairs(known) do names[#names + 1] = k end
      table.sort(names)
      parser:error(("--op: no perf entry for %s (entries: %s)"):format(op, table.concat(names, ", ")))
    end
  end
end

-- the (entry, dtype) pairs to time
local todo = {}
for _, p in ipairs(cases.perf) do
  local dev_ok = not p.device or (p.device == "cuda") == on_cuda
  if dev_ok and (not want_ops or want_ops[p.op]) and (not args.match or p.name:find(args.match, 1, true)) then
    local dtypes = p.dtypes or {"f32", "bf16"}
    for _, dt in ipairs(dtypes) do
      local keep = want_dtypes and want_dtypes[dt] or (not want_dtypes and (on_cuda or dt == "f32" or p.dtypes))
      if keep then todo[#todo + 1] = {p = p, dtype = dt} end
    end
  end
end

if args.list then
  for _, t in ipairs(todo) do print(("%-24s %-6s %s"):format(t.p.op, t.dtype, t.p.name)) end
  os.exit(0)
end

local facts = runinfo.collect(device)
local peak = peaks.lookup(facts.device)

--- The CPU's bandwidth in GB/s at the current thread count over --stream-mb
-- MiB of f32: a STREAM-like copy (dst = src, bytes read + written) or, with
-- is_read, a read of every byte with nothing written (ember.stream_read);
-- timed by ember.bench with options o, statistic stat ("min" or "median").
local ref_src, ref_dst
local function reference_gbs(is_read, o, stat)
  local n = args.stream_mb * 1024 * 1024 // 4
  ref_src = ref_src or ember.ones({n})
  if is_read then return n * 4 / ember.bench(function() ember.stream_read(ref_src) end, o)[stat] / 1e9 end
  ref_dst = ref_dst or ember.empty({n})
  return 2 * n * 4 / ember.bench(function() ref_dst:copy_(ref_src) end, o)[stat] / 1e9
end
if args.peak_each and (on_cuda or args.peak_gbs or args.stream_mb == 0) then
  parser:error("--peak-each: needs --device cpu, no --peak-gbs and --stream-mb > 0")
end
local measure_stream = not on_cuda and not args.peak_gbs and args.stream_mb > 0
-- best of 10 each, the read with the caches flushed first (the buffer could fit a large L3)
local stream_gbs = measure_stream and reference_gbs(false, {warmup = 2, reps = 10, device = "cpu"}, "min")
local read_gbs = measure_stream and reference_gbs(true, {warmup = 2, reps = 10, device = "cpu", flush_l2 = true}, "min")
if not args.peak_each then ref_src, ref_dst = nil, nil end   -- 2 x --stream-mb not held through the run
local peak_gbs = args.peak_gbs or (on_cuda and peak and peak.gbs) or stream_gbs or nil
--- The bandwidth an op of `bytes` moved, `out_bytes` of them written, is held
-- to: the read stream's for a read-only op, else peak_gbs; and which.
local function read_only(bytes, out_bytes) return read_gbs and out_bytes * 16 <= bytes end
local function op_peak_gbs(bytes, out_bytes)
  if read_only(bytes, out_bytes) then return read_gbs, "read" end
  return peak_gbs, stream_gbs and "copy" or nil
end
local function peak_tflops(dtype) return args.peak_tflops or (on_cuda and peak and peak.tflops[dtype]) end
S.print_header(facts)
if stream_gbs then
  print(("memory bandwidth: %.1f GB/s (copy of %d MiB f32, read + write, %d threads): the CPU's peak below")
    :format(stream_gbs, args.stream_mb, facts.threads))
  print(("read bandwidth: %.1f GB/s (read of %d MiB, nothing written, %d threads): the peak of read-only ops, "
    .. "marked (read)"):format(read_gbs, args.stream_mb, facts.threads))
end
local peak_src = stream_gbs and " (measured copy)" or peak and (" (" .. peak.name .. " datasheet)") or ""
if args.timer == "events" and not on_cuda then parser:error("--timer events: needs --device cuda") end
print(("config: %d measurements, reps %d (median), warmup %d, L2 flush %s, timer %s, backward %s, peaks %s"):format(
  #todo, args.reps, args.warmup, args.no_flush and "off" or on_cuda and ("on (" .. args.flush .. ")") or "on (read)", args.timer, args.no_backward and "off" or "on",
  peak_gbs and ("%.1f GB/s%s"):format(peak_gbs, peak_src) or "none"))
io.stdout:flush()

-- ---------------------------------------------------------------------------
-- measuring

local function tensors_of(inputs)
  local ts = {}
  for _, x in ipairs(inputs) do
    if ember.is_tensor(x) then ts[#ts + 1] = x end
  end
  return ts
end

local function nbytes(t) return t:numel() * t:element_size() end

local function default_bytes(inputs, out)
  local b = nbytes(out)
  for _, x in ipairs(tensors_of(inputs)) do b = b + nbytes(x) end
  return b
end

local function bench(fn, setup)
  return ember.bench(fn, {warmup = args.warmup, reps = args.reps, device = device, setup = setup,
                          flush_l2 = not args.no_flush, flush = args.flush, timer = args.timer})
end

-- One (entry, dtype): {fwd_ms, fwd_bwd_ms, bytes, flops, ...} or {error = msg}.
local function measure(p, dtype)
  local grads = p.backward and not args.no_backward
  local inputs = cases.make_inputs(p, {dtype = dtype, device = device, requires_grad = grads})
  local out = ember.no_grad(function() return p.fn(table.unpack(inputs)) end)
  local r = {bytes = (p.bytes or default_bytes)(inputs, out), flops = p.flops and p.flops(inputs, out),
             out_bytes = ember.is_tensor(out) and nbytes(out) or 0,
             bwd_bytes = grads and p.bwd_bytes and p.bwd_bytes(inputs, out), out_shape = out.shape}
  -- each result is closed as soon as it is made: the caching allocator then
  -- reuses its block, where waiting for the Lua GC would time cudaMalloc
  local is_input = {}
  for _, x in ipairs(inputs) do is_input[x] = true end
  local close = getmetatable(out).__close
  local function release(y) if not is_input[y] then close(y) end end   -- never an input handed back
  local function fwd() release(p.fn(table.unpack(inputs))) end
  if args.peak_each and r.bytes > 0 and not r.flops then
    -- interleaved: one rep of the row, one of its reference, --reps times, so
    -- a host's bandwidth drifting during the row moves both medians alike
    r.peak_kind = read_only(r.bytes, r.out_bytes) and "read" or "copy"
    -- one flush buffer for the row (ember.bench would make, and write, one a call)
    local buf = not args.no_flush and ember.zeros({ember.bench.default_flush_bytes("cpu") // 4}, {dtype = "i32"})
    local function flush() if buf then ember.stream_read(buf) end end
    local once = {warmup = 0, reps = 1, device = device}
    for _ = 1, math.max(args.warmup, 1) do ember.no_grad(fwd); reference_gbs(r.peak_kind == "read", once, "median") end
    local t, ref = {}, {}
    for k = 1, args.reps do
      flush()
      t[k] = ember.bench(function() ember.no_grad(fwd) end, once).median
      flush()
      ref[k] = reference_gbs(r.peak_kind == "read", once, "median")
    end
    buf = nil
    r.fwd, r.peak_gbs = ember.bench.stats(t).median, ember.bench.stats(ref).median
  else
    r.fwd = bench(function() ember.no_grad(fwd) end).median
  end
  if grads then
    local ones = ember.ones(out.shape, {dtype = out.dtype, device = out.device})
    local leaves = {}
    for _, x in ipairs(tensors_of(inputs)) do
      if x.requires_grad then leaves[#leaves + 1] = x end
    end
    r.fwd_bwd = bench(function()
      local y = p.fn(table.unpack(inputs))
      y:backward(ones)
      release(y)
    end, function()
      for _, x in ipairs(leaves) do x.grad = nil end
      collectgarbage()   -- untimed: last rep's gradients go back to the allocator
    end).median
  end
  return r
end

-- ---------------------------------------------------------------------------
-- PyTorch's side (--torch): the entries' torch expressions on inputs of the
-- same shapes, dtypes and value ranges

local torch = {}
if args.torch then
  local spec = {}
  for i, t in ipairs(todo) do
    if t.p.torch then
      local inputs = cases.make_inputs(t.p, {dtype = t.dtype, device = "cpu", requires_grad = false})
      local desc = {}
      for _, x in ipairs(inputs) do
        if ember.is_tensor(x) then
          local fl = x.dtype == "f32" or x.dtype == "bf16" or x.dtype == "f16" or x.dtype == "f64"
          local d = {shape = x.shape, dtype = x.dtype}
          if x:numel() > 0 and x.dtype ~= "bool" then
            if fl then
              -- non-negative float inputs (probabilities, sqrt/log arguments) are drawn
              -- uniform over the same range on PyTorch's side; the rest randn
              local lo = x:min():item()
              if lo >= 0 then d.low, d.high = lo, x:max():item() end
            else
              d.high = x:max():item() + 1
            end
          end
          desc[#desc + 1] = d
        else
          desc[#desc + 1] = {value = x}
        end
      end
      spec[#spec + 1] = {key = i, expr = t.p.torch, inputs = desc, backward = t.p.backward and not args.no_backward}
    end
  end
  if #spec > 0 then
    local tmp = os.tmpname()
    local f = assert(io.open(tmp, "w"))
    f:write(cjson.encode({device = device, reps = args.reps, warmup = args.warmup, flush = not args.no_flush,
                          flush_mode = args.flush, timer = args.timer, cases = spec}))
    f:close()
    local cmd = ("python3 %sscripts/torch/bench_ops.py --spec %s 2>&1"):format(root, tmp)
    print("pytorch: " .. cmd)
    local pipe = io.popen(cmd)
    for line in pipe:lines() do
      local ok, rec = pcall(cjson.decode, line)
      if ok and type(rec) == "table" and rec.key then torch[rec.key] = rec
      elseif line:match("%S") then print("  torch| " .. line) end
    end
    pipe:close()
    os.remove(tmp)
  end
end

-- ---------------------------------------------------------------------------
-- the table

local function fmt_ms(s) return s and ("%.4f"):format(s * 1e3) or "-" end
local function shape_str(s) return "(" .. table.concat(s, ",") .. ")" end

local rows, lines = {}, {}
local json_files = {}
local function fail(msg) parser:error(msg) end
if args.json then json_files[#json_files + 1] = S.open_json(args.json, fail) end
if args.out then
  os.execute(("mkdir -p '%s'"):format(args.out))
  json_files[#json_files + 1] = S.open_json(args.out .. "/ops.jsonl", fail)
end
local header = "| op | case | dtype | fwd ms | rate | of peak | fwd+bwd ms | bwd rate | torch fwd ms | torch fwd+bwd ms |"
print()
print(header)
print("|---|---|---|---|---|---|---|---|---|---|")
for i, t in ipairs(todo) do
  local p, dtype = t.p, t.dtype
  local ok, r = pcall(measure, p, dtype)
  local rec = {op = p.op, case = p.name, dtype = dtype, commit = facts.commit, device = facts.device,
               date = facts.date, reps = args.reps, threads = facts.threads, peak_gbs = peak_gbs, timer = args.timer,
               copy_gbs = stream_gbs or nil, read_gbs = read_gbs or nil}
  local rate, frac, bwd_rate = "-", "-", "-"
  if ok then
    rec.fwd_ms, rec.fwd_bwd_ms, rec.bytes, rec.flops = r.fwd * 1e3, r.fwd_bwd and r.fwd_bwd * 1e3, r.bytes, r.flops
    if r.flops then
      rec.tflops = r.flops / r.fwd / 1e12
      rate = (rec.tflops < 10 and "%.2f TF/s" or "%.1f TF/s"):format(rec.tflops)
      local pk = peak_tflops(dtype)
      if pk then rec.peak_fraction = rec.tflops / pk end
    elseif r.bytes > 0 then
      rec.gbs = r.bytes / r.fwd / 1e9
      rate = (rec.gbs < 10 and "%.2f GB/s" or "%.0f GB/s"):format(rec.gbs)
      local pk, kind = op_peak_gbs(r.bytes, r.out_bytes)
      if r.peak_gbs then pk, kind, rec.peak_each = r.peak_gbs, r.peak_kind, true end
      if pk then rec.peak_fraction, rec.peak_gbs, rec.peak_kind = rec.gbs / pk, pk, kind end
    end
    if rec.peak_fraction then
      frac = ("%.0f%%"):format(rec.peak_fraction * 100) .. (rec.peak_kind == "read" and " (read)" or "")
      if rec.peak_each then frac = frac .. (" of %.0f"):format(rec.peak_gbs) end
    end
    if r.bwd_bytes and r.fwd_bwd and r.fwd_bwd > r.fwd then
      rec.bwd_bytes, rec.bwd_gbs = r.bwd_bytes, r.bwd_bytes / (r.fwd_bwd - r.fwd) / 1e9
      bwd_rate = (rec.bwd_gbs < 10 and "%.2f GB/s" or "%.0f GB/s"):format(rec.bwd_gbs)
      if peak_gbs then
        rec.bwd_peak_fraction = rec.bwd_gbs / peak_gbs
        bwd_rate = bwd_rate .. (" (%.0f%%)"):format(rec.bwd_peak_fraction * 100)
      end
    end
  else
    rec.error = tostring(r)
  end
  local tr = torch[i]
  if tr then
    rec.torch_fwd_ms, rec.torch_fwd_bwd_ms, rec.torch_error = tr.fwd_ms, tr.fwd_bwd_ms, tr.error
  end
  local function tms(v) return v and ("%.4f"):format(v) or (tr and tr.error and "error" or "-") end
  local line = ("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |"):format(p.op, p.name, dtype,
    ok and fmt_ms(r.fwd) or "error", rate, frac, ok and fmt_ms(r.fwd_bwd) or "-", bwd_rate, tms(rec.torch_fwd_ms),
    tms(rec.torch_fwd_bwd_ms))
  print(line)
  if not ok then print("  error: " .. rec.error) end
  io.stdout:flush()
  lines[#lines + 1] = line
  rows[#rows + 1] = rec
  for _, f in ipairs(json_files) do f:write(cjson.encode(rec), "\n"); f:flush() end   -- as it goes: a cut run keeps its rows
  S.free_all(on_cuda)
end

for _, f in ipairs(json_files) do f:close() end
if args.out then
  local f = assert(io.open(args.out .. "/ops.md", "w"))
  f:write(("Device %s, %d threads, commit %s, %s; median of %d reps, L2 flush %s, timer %s%s.\n\n"):format(facts.device,
    facts.threads, facts.commit, facts.date, args.reps, args.no_flush and "off" or "on", args.timer,
    stream_gbs and (", peak = measured copy bandwidth %.1f GB/s, read-only ops (read): measured read bandwidth %.1f GB/s")
      :format(stream_gbs, read_gbs) or ""))
  f:write(header, "\n|---|---|---|---|---|---|---|---|---|---|\n", table.concat(lines, "\n"), "\n")
  f:close()
  print("wrote " .. args.out .. "/ops.jsonl and ops.md")
end
local failed = 0
for _, rec in ipairs(rows) do if rec.error then failed = failed + 1 end end
if failed > 0 then
  io.stderr:write(("bench_ops.lua: %d of %d measurements failed\n"):format(failed, #rows))
  os.exit(1)
end
