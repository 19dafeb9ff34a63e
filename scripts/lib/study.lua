--- study.lua — what the one-process study scripts (bench_model.lua,
-- bench_attention.lua, memory_profile.lua, mixed_precision.lua) share, so
-- they check, print and write the same way: the count and --device checks, the header
-- lines, the comma lists they take, freeing memory between configurations,
-- telling an out-of-memory result from an error, and the JSON-lines and
-- Markdown files; and for the CPU scripts that hold an op to a read of its
-- input (bench_reduce_cpu.lua, bench_cast_cpu.lua) the cache flush and the
-- alternating read/op timing. Load it with dofile (not a package):
--   local S = dofile(script_dir .. "lib/study.lua")
-- Functions that can refuse take `fail` (the script's: message to stderr, exit 2).
local ember = require "ember"

local M = {}

--- Fill args.device (default: cuda when available) and check it is cpu,
-- cuda or cuda:N with a device there; returns whether it is a CUDA device.
function M.resolve_device(args, fail)
  args.device = args.device or (ember.cuda.is_available() and "cuda" or "cpu")
  if not (args.device == "cpu" or args.device == "cuda" or args.device:match("^cuda:%d+$")) then
    fail("--device must be cpu, cuda or cuda:N, got '" .. args.device .. "'")
  end
  local on_cuda = args.device ~= "cpu"
  if on_cuda and not ember.cuda.is_available() then fail("--device " .. args.device .. ": no CUDA device is available") end
  return on_cuda
end

--- "2 CPU threads (cores)": the thread count the CPU ops and OpenBLAS use and
-- where it came from (ember.threads_info: cores, EMBER_NUM_THREADS, set_num_threads).
function M.threads_text()
  local t = ember.threads_info()
  return ("%d CPU thread%s (%s)"):format(t.threads, t.threads == 1 and "" or "s", t.source)
end

--- The --threads option (CPU threads for the ops and OpenBLAS) and its use:
-- apply_threads(args, fail) calls ember.set_num_threads before anything runs.
function M.add_threads_option(parser)
  parser:option("--threads", "CPU threads for the ops and OpenBLAS (ember.set_num_threads; default: " ..
    "EMBER_NUM_THREADS, else the cores this process may use)."):convert(math.tointeger)
end
function M.apply_threads(args, fail)
  if args.threads == nil then return end
  if args.threads < 1 then fail("--threads must be a positive integer, got " .. args.threads) end
  local ok, err = pcall(ember.set_num_threads, args.threads)
  if not ok then fail("--threads: " .. tostring(err)) end
end

--- Print the device and commit lines every study opens with (facts: ember.runinfo.collect).
function M.print_header(facts)
  local cpu = tostring(facts.device):match("^cpu") and facts.blas
  print(("device: %s%s, %s%s"):format(facts.device, facts.driver and (", driver " .. facts.driver) or "",
    M.threads_text(), cpu and (", " .. facts.blas .. " kernels") or ""))
  local b = cpu and ember.blas_info()
  if b and b.better then
    print(("warning: OpenBLAS loaded its %s kernels on a CPU that runs %s's: set OPENBLAS_CORETYPE=%s " ..
      "before starting (the `ember` executable does this itself) for matmuls 3-4x faster"):format(b.core, b.better, b.better))
  end
  print(("commit: %s, %s, ember %s"):format(facts.commit, os.date("!%Y-%m-%d %H:%M UTC"), ember.version))
end

--- fail(message) unless every args[k] of keys is an integer >= 1 (seed: >= 0)
-- and args.warmup one >= 0.
function M.check_counts(args, keys, fail)
  for _, k in ipairs(keys) do
    if not args[k] or args[k] < (k == "seed" and 0 or 1) then
      fail("--" .. k:gsub("_", "-") .. " must be a positive integer")
    end
  end
  if not args.warmup or args.warmup < 0 then fail("--warmup must be an integer >= 0") end
end

--- "16,32" -> {16, 32}; fail unless every item is a positive integer (opt names the option).
function M.int_list(opt, s, fail)
  local out = {}
  for item in (s .. ","):gmatch("([^,]*),") do
    local n = math.tointeger(tonumber(item))
    if not n or n < 1 then fail(("--%s expects a comma list of positive integers, got '%s'"):format(opt, s)) end
    out[#out + 1] = n
  end
  return out
end

--- Give memory back after a configuration (also after an OOM): the Lua
-- handles first, then the allocator's cached segments.
function M.free_all(on_cuda)
  collectgarbage()
  collectgarbage()
  if on_cuda then ember.cuda.empty_cache() end
end

--- The status of a configuration that raised `msg`: "OOM" for out of memory
-- (a result, not a crash), otherwise "error".
function M.failure_status(msg)
  return tostring(msg):match("^out of memory") and "OOM" or "error"
end

--- path opened for appending JSON lines (nil when path is nil).
function M.open_json(path, fail)
  if not path then return nil end
  local f, err = io.open(path, "a")
  if not f then fail("cannot open " .. path .. ": " .. tostring(err)) end
  return f
end

--- Append one JSON line (record encoded by cjson) to path.
function M.append_json(path, record, fail)
  local f = M.open_json(path, fail)
  f:write(require("cjson").encode(record), "\n")
  f:close()
end

--- Write lines (joined by newlines) to the Markdown file path, after a
-- comment naming the device, commit and date they come from.
function M.write_markdown(path, facts, lines, fail)
  local f, err = io.open(path, "w")
  if not f then fail("cannot open " .. path .. ": " .. tostring(err)) end
  f:write("<!-- ", facts.device, ", commit ", facts.commit, ", ", facts.date, " -->\n")
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
end

-- A CPU cache flush for timing: a read of an i32 buffer of `bytes` (default: twice the largest cache
-- sysfs names, at most 256 MiB; 64 MiB when it names none), the way bench.lua flushes. Returns the
-- flush function and the buffer's size in bytes.
function M.cpu_flusher(bytes)
  if not bytes then
    local best = 0
    for i = 0, 9 do
      local f = io.open(("/sys/devices/system/cpu/cpu0/cache/index%d/size"):format(i))
      if not f then break end
      local n, u = (f:read("l") or ""):match("^(%d+)([KMG]?)")
      f:close()
      if n then best = math.max(best, tonumber(n) * ({[""] = 1, K = 1024, M = 1 << 20, G = 1 << 30})[u]) end
    end
    bytes = best > 0 and math.min(2 * best, 256 << 20) or 64 << 20
  end
  local buf = ember.zeros({bytes // 4}, {dtype = "i32"})
  return function() ember.stream_read(buf) end, bytes
end

-- min and median of a list of numbers (sorts it)
function M.min_median(t)
  table.sort(t)
  local n = #t
  return t[1], n % 2 == 1 and t[(n + 1) // 2] or (t[n // 2] + t[n // 2 + 1]) / 2
end

-- Times fn() beside a read of `x` (ember.stream_read) in alternating reps, each after flush():
-- the same bytes, the same caches, the same moment on a shared machine. fn returns a tensor, closed
-- at once; on_op(before) / on_op(after), if given, run just outside the op's clock (e.g. to count
-- page faults). Returns {read = {min, med}, op = {min, med}} in seconds.
function M.time_beside_read(x, fn, reps, warmup, flush, on_op)
  local tr, to = {}, {}
  ember.no_grad(function()
    for i = 1, warmup + reps do
      flush()
      local t0 = ember.clock()
      ember.stream_read(x)
      local t1 = ember.clock()
      flush()
      if on_op then on_op("before", i > warmup) end
      local t2 = ember.clock()
      local y = fn()
      local t3 = ember.clock()
      if on_op then on_op("after", i > warmup) end
      getmetatable(y).__close(y)
      if i > warmup then tr[#tr + 1], to[#to + 1] = t1 - t0, t3 - t2 end
    end
  end)
  local rmin, rmed = M.min_median(tr)
  local omin, omed = M.min_median(to)
  return {read = {rmin, rmed}, op = {omin, omed}}
end

return M
