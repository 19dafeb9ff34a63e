--- ember.bench: time a function like torch.utils.benchmark / triton.testing.do_bench,
-- minus the ceremony.
--
--   local r = ember.bench(fn, {warmup = 5, reps = 10})
--   print(ember.bench.format(r, "matmul 4096"))
--   --> matmul 4096: 12.345 ± 0.100 ms (median 12.300, min 12.200, max 12.600, n=10)
--
-- bench(fn, opts) runs fn `warmup` times untimed, then `reps` timed runs. Per
-- timed rep: opts.setup() (untimed), the L2 flush (untimed, when asked), a
-- device synchronisation, the host clock, fn(), a synchronisation, the clock.
-- So asynchronous device work is counted and setup/flush work is not.
-- Returns seconds: {mean=, std=, median=, min=, max=, samples={...}, reps=,
-- warmup=, device=}, plus flush_bytes when flushing and clock_mhz_before,
-- clock_mhz_after, clock_mhz_max on CUDA.
--
-- opts:
--   warmup  (5)     untimed calls first (integer >= 0)
--   reps    (10)    timed calls (integer >= 1)
--   sync    (true)  synchronise the device around each rep; false times host
--                   dispatch only (launch cost), as scripts/bench_dispatch.lua does
--   device  ("cuda" when available, else "cpu") the device to synchronise,
--                   flush and read clocks on: "cpu", "cuda", "cuda:N"
--   setup   (nil)   function called before every call of fn, untimed (e.g. drop
--                   the .grad of inputs before timing a backward)
--   flush_l2 (false) before each timed rep, overwrite a buffer bigger than the
--                   cache so fn starts cold (Triton's do_bench does the same).
--                   CUDA: an i32 buffer of flush_bytes, zeroed on the device
--                   (one fill kernel, never timed). CPU: a read of a host
--                   buffer (ember.stream_read: no dirty lines left for fn to
--                   write back), sized from the largest cache sysfs reports.
--   flush   ("write") CUDA: how the flush evicts the L2. "write" zeroes the
--                   buffer (as do_bench: the lines it leaves are dirty, and
--                   the L2 writes them back while fn runs: ~15 µs on an
--                   H100, a fixed cost that caps a 128 MB op near 70 % of
--                   bandwidth); "read" sums it (one reduction kernel: the
--                   lines left are clean, fn pays for its own bytes only).
--                   The CPU's flush is always a read.
--   flush_bytes     the flush buffer's size; default on CUDA 256 MiB (more than
--                   twice the L2 of every current NVIDIA GPU: H100/H200 50 MB,
--                   A100 40 MB, B200 126 MB), or 2x the L2 when the core can
--                   report it; on the CPU 2x the largest cache (at most 256
--                   MiB), 64 MiB when sysfs says nothing. Allocated once per call.
--   clocks  (true on CUDA) read the SM clock (MHz) before and after the timed
--                   reps, to show throttling or a GPU that had not clocked up.
--   timer   ("host") "host": the host clock around fn between two device
--                   synchronisations, so the launch latency and the wake-up
--                   after the last kernel are counted (~10-15 µs on an H100
--                   host: a third of a 32 MiB reduction). "events" (CUDA
--                   only, as Triton's do_bench): CUDA events recorded on the
--                   current stream around fn, and no synchronisation between
--                   the flush and fn, so the flush kernel is still running
--                   while the host enqueues fn: the time is the device's,
--                   from the end of the flush to the end of fn's last kernel.
local core = require "ember.core"
local M = {}

local MiB = 1024 * 1024

--- Summary statistics of a list of numbers (std is the sample std, n-1).
function M.stats(samples)
  local n, sum = #samples, 0
  for _, s in ipairs(samples) do sum = sum + s end
  local mean = sum / n
  local ss = 0
  for _, s in ipairs(samples) do ss = ss + (s - mean) ^ 2 end
  local sorted = table.move(samples, 1, n, 1, {})
  table.sort(sorted)
  local median = n % 2 == 1 and sorted[(n + 1) // 2] or (sorted[n // 2] + sorted[n // 2 + 1]) / 2
  return {mean = mean, std = n > 1 and math.sqrt(ss / (n - 1)) or 0, median = median,
          min = sorted[1], max = sorted[n], samples = samples}
end

-- ---------------------------------------------------------------------------
-- devices

--- "cuda:N" -> N; "cuda" -> nil (the current device).
local function cuda_index(device)
  return tonumber(device:match("^cuda:(%d+)$"))
end

--- Largest CPU cache in bytes (sysfs), or nil.
local function cpu_cache_bytes()
  local best
  for i = 0, 9 do
    local f = io.open(("/sys/devices/system/cpu/cpu0/cache/index%d/size"):format(i))
    if not f then break end
    local s = f:read("l") or ""
    f:close()
    local n, unit = s:match("^(%d+)([KMG]?)")
    if n then
      local b = tonumber(n) * ({[""] = 1, K = 1024, M = MiB, G = 1024 * MiB})[unit]
      if not best or b > best then best = b end
    end
  end
  return best
end

--- Default size of the flush buffer on `device`.
function M.default_flush_bytes(device)
  if device:match("^cuda") then
    -- The core does not report the L2 size yet; use it when a build does.
    local props = core.cuda_device_properties
    if props then
      local ok, p = pcall(props, cuda_index(device))
      if ok and type(p) == "table" and math.type(p.l2_cache_size) == "integer" and p.l2_cache_size > 0 then
        return 2 * p.l2_cache_size
      end
    end
    return 256 * MiB
  end
  local c = cpu_cache_bytes()
  return c and math.min(2 * c, 256 * MiB) or 64 * MiB
end

--- The nvidia-smi selector for a CUDA device: CUDA numbers the devices that
-- CUDA_VISIBLE_DEVICES lists (indices or UUIDs, both of which `nvidia-smi -i`
-- accepts), nvidia-smi numbers all of them. (With CUDA_DEVICE_ORDER left at
-- FASTEST_FIRST on a host of mixed GPUs the two orders can differ; on hosts of
-- one GPU model both follow the PCI bus.)
function M.smi_selector(device)
  local idx = cuda_index(device)
  if idx == nil then
    local ok, cur = pcall(core.cuda_current_device)
    idx = ok and cur or 0
  end
  local visible = os.getenv("CUDA_VISIBLE_DEVICES")
  if visible and visible ~= "" then
    local list = {}
    for item in visible:gmatch("[^,%s]+") do list[#list + 1] = item end
    if list[idx + 1] then return list[idx + 1] end
  end
  return tostring(idx)
end

--- SM clock and maximum SM clock of a CUDA device in MHz (two numbers), or nil.
-- Read through nvidia-smi rather than NVML: Ember does not link libnvidia-ml
-- (one more driver library for the build and the binding to find), the read
-- happens twice per bench call and outside the timed region, so its ~50 ms
-- cost does not matter, and nvidia-smi is on every host that has the driver.
function M.sm_clocks(device)
  local sel = M.smi_selector(device)
  if not sel:match("^[%w%-:.]+$") then return nil end      -- never pass odd text to a shell
  local f = io.popen(("nvidia-smi --query-gpu=clocks.sm,clocks.max.sm --format=csv,noheader,nounits -i %s 2>/dev/null")
    :format(sel))
  if not f then return nil end
  local out = f:read("a") or ""
  f:close()
  local cur, max = out:match("^%s*(%d+)%s*,%s*(%d+)")
  return tonumber(cur), tonumber(max)
end

-- ---------------------------------------------------------------------------
-- bench

local is_callable = require("ember.util").is_callable

local function check_opts(opts)
  if opts == nil then return {} end
  if type(opts) ~= "table" then error("ember.bench: expected an options table, got " .. type(opts), 3) end
  local w, r = opts.warmup, opts.reps
  if w ~= nil and (math.type(w) ~= "integer" or w < 0) then error("ember.bench: warmup must be an integer >= 0", 3) end
  if r ~= nil and (math.type(r) ~= "integer" or r < 1) then error("ember.bench: reps must be an integer >= 1", 3) end
  if opts.timer ~= nil and opts.timer ~= "host" and opts.timer ~= "events" then
    error(("ember.bench: timer must be \"host\" or \"events\", got %s"):format(tostring(opts.timer)), 3)
  end
  for _, k in ipairs({"sync", "flush_l2", "clocks"}) do
    if opts[k] ~= nil and type(opts[k]) ~= "boolean" then
      error(("ember.bench: %s must be a boolean, got %s"):format(k, type(opts[k])), 3)
    end
  end
  if opts.setup ~= nil and not is_callable(opts.setup) then
    error("ember.bench: setup must be a function, got " .. type(opts.setup), 3)
  end
  if opts.flush ~= nil and opts.flush ~= "write" and opts.flush ~= "read" then
    error(("ember.bench: flush must be \"write\" or \"read\", got %s"):format(tostring(opts.flush)), 3)
  end
  local fb = opts.flush_bytes
  if fb ~= nil and (math.type(fb) ~= "integer" or fb < 4) then
    error("ember.bench: flush_bytes must be an integer >= 4", 3)
  end
  local d = opts.device
  if d ~= nil and (type(d) ~= "string" or not (d == "cpu" or d == "cuda" or d:match("^cuda:%d+$"))) then
    error(("ember.bench: device must be \"cpu\", \"cuda\" or \"cuda:N\", got %s"):format(tostring(d)), 3)
  end
  return opts
end

function M.bench(fn, opts)
  if not is_callable(fn) then error("ember.bench: expected a function, got " .. type(fn), 2) end
  opts = check_opts(opts)
  local warmup, reps = opts.warmup or 5, opts.reps or 10
  local device = opts.device or (core.cuda_is_available() and "cuda" or "cpu")
  local on_cuda = device ~= "cpu"
  if on_cuda and not core.cuda_is_available() then
    error(("ember.bench: device %s asked for, but no CUDA device is available"):format(device), 2)
  end
  local do_sync = opts.sync ~= false
  local dev_index = on_cuda and cuda_index(device) or nil
  local function sync() if on_cuda then core.cuda_synchronize(dev_index) end end
  local setup = opts.setup

  local flush, flush_bytes
  if opts.flush_l2 then
    flush_bytes = opts.flush_bytes or M.default_flush_bytes(device)
    if on_cuda and opts.flush == "read" then
      local buf = core.zeros({flush_bytes // 4}, {dtype = "f32", device = device})
      flush = function() buf:sum() end   -- a read: no dirty lines left in the L2 for fn to write back
    elseif on_cuda then
      local buf = core.empty({flush_bytes // 4}, {dtype = "i32", device = device})
      flush = function() buf:zero_() end
    else
      -- the CPU's flush reads its buffer (written once, here): writing it
      -- would leave the cache full of dirty lines that the timed op, reading
      -- its input, must write back, and a reduction would be charged a write
      -- of its input's size; reading leaves clean lines it can drop for free
      local buf = core.zeros({flush_bytes // 4}, {dtype = "i32", device = device})
      flush = function() core.stream_read(buf) end
    end
  end

  local clocks = on_cuda and opts.clocks ~= false
  for _ = 1, warmup do
    if setup then setup() end
    fn()
  end
  if do_sync then sync() end

  local before, max_mhz
  if clocks then before, max_mhz = M.sm_clocks(device) end
  local samples, clock = {}, core.clock
  if opts.timer == "events" then
    if not on_cuda then error("ember.bench: timer \"events\" needs a CUDA device", 2) end
    local e0, e1 = core.cuda_Event({enable_timing = true}), core.cuda_Event({enable_timing = true})
    for i = 1, reps do
      if setup then setup() end
      if flush then flush() end   -- not waited for: it covers the launch latency of fn
      e0:record()
      fn()
      e1:record()
      e1:synchronize()
      samples[i] = e0:elapsed_time(e1) / 1e3
    end
  else
    for i = 1, reps do
      if setup then setup() end
      if flush then flush() end
      if do_sync then sync() end
      local t0 = clock()
      fn()
      if do_sync then sync() end
      samples[i] = clock() - t0
    end
  end
  local after
  if clocks then after = M.sm_clocks(device) end

  local r = M.stats(samples)
  r.reps, r.warmup, r.device, r.timer = reps, warmup, device, opts.timer or "host"
  r.flush_bytes = flush_bytes
  r.flush = flush and (on_cuda and (opts.flush or "write") or "read") or nil
  r.clock_mhz_before, r.clock_mhz_after, r.clock_mhz_max = before, after, max_mhz
  return r
end

--- One human line for a bench result:
-- "label: 12.345 ± 0.100 ms (median 12.300, min 12.200, max 12.600, n=10)".
-- Times under 0.1 ms print in µs. With clocks read, ", SM 1980→1755 MHz" is
-- appended before the closing parenthesis.
function M.format(r, label)
  if type(r) ~= "table" or type(r.mean) ~= "number" then
    error("ember.bench.format: expected a result of ember.bench, got " .. type(r), 2)
  end
  local scale, unit = 1e3, "ms"
  if r.mean < 1e-4 then scale, unit = 1e6, "µs" end
  local n = r.samples and #r.samples or r.reps
  local s = ("%.3f ± %.3f %s (median %.3f, min %.3f, max %.3f, n=%s"):format(r.mean * scale,
    r.std * scale, unit, r.median * scale, r.min * scale, r.max * scale, tostring(n))
  if r.clock_mhz_before or r.clock_mhz_after then
    s = s .. (", SM %s→%s MHz"):format(tostring(r.clock_mhz_before or "?"), tostring(r.clock_mhz_after or "?"))
  end
  s = s .. ")"
  if label ~= nil then s = tostring(label) .. ": " .. s end
  return s
end

setmetatable(M, {__call = function(_, fn, opts) return M.bench(fn, opts) end})
return M
