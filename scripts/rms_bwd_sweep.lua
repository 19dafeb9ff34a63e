--- rmsnorm backward on CUDA over a sweep of rows: its time, GB/s and share of
-- the peak at each size, and a fit time = intercept + bytes / bandwidth per
-- (dtype, D), so that a size too small to reach the bandwidth bar shows how
-- much of its time is the fixed cost (launch, ramp, the weight gradient's
-- tail) and how much is bytes.
--
--   ember run scripts/rms_bwd_sweep.lua                       # f32 and bf16, D 768, 1600, 4096
--   ember run scripts/rms_bwd_sweep.lua --dtype bf16 --d 1600 --rows 2048,8192
--   EMBER_RMSNORM_BWD_CHUNKS=4 ember run scripts/rms_bwd_sweep.lua --dtype bf16   # 16-bit rows at 4 chunks a thread (default 2; 2r: 2, recomputed)
--   ember run scripts/rms_bwd_sweep.lua --no-wgrad             # x's gradient only: no weight gradient, no tail
--   EMBER_RMSNORM_BWD_DW=cluster ember run scripts/rms_bwd_sweep.lua   # the weight gradient's tail through clusters (default ticket)
--
-- --no-wgrad leaves the weight out of autograd, so the kernel writes no
-- partial rows and runs no weight-gradient tail (finish_dw): the intercept
-- with and without it is what the tail costs.
--
-- Four measures of the backward, all by CUDA events (bench_ops.lua's --timer
-- events), the median of --reps:
--   ops     fwd+bwd − fwd with the L2 flushed (zero-filled) before each rep,
--           exactly as bench_ops.lua reports it;
--   alone   the backward alone: the forward in the untimed setup, then the
--           same zero-fill flush, then y:backward(gy) timed;
--   clean   the same, with the flush done by reading 256 MiB (a sum) instead
--           of writing it: no dirty lines left in L2 for the timed backward
--           to write back (a zero-fill leaves up to the L2's 50 MB dirty);
--   graph   "clean" with the backward captured once as a CUDA graph and
--           replayed: the device's time alone, no host gaps.
-- "ops" − "alone" is what fwd+bwd − fwd charges the backward for the
-- forward's output (y, dirty in L2 when the backward starts, written back
-- during it) and the autograd walk; "alone" − "clean" the flush's dirty
-- lines; "clean" − "graph" the host.
local ember = require "ember"
local argparse = require "argparse"
local F = ember.nn.functional

local parser = argparse("rms_bwd_sweep.lua", "Time the rmsnorm backward over a sweep of rows on CUDA.")
parser:option("--dtype", "Activation dtypes (comma list).", "f32,bf16")
parser:option("--d", "Row widths (comma list).", "768,1600,4096")
parser:option("--rows", "Row counts (comma list).", "512,1024,2048,4096,8192,16384")
parser:option("--reps", "Timed reps (median).", "20"):convert(math.tointeger)
parser:option("--warmup", "Untimed calls first.", "3"):convert(math.tointeger)
parser:option("--peak-gbs", "Peak bandwidth to divide by (GB/s).", "3350"):convert(tonumber)
parser:flag("--no-wgrad", "x's gradient only (the weight needs none): no partial rows, no weight-gradient tail.")
local args = parser:parse()
assert(ember.cuda.is_available(), "rms_bwd_sweep.lua: needs a CUDA device")

local function list(s, conv)
  local t = {}
  for v in s:gmatch("[^,]+") do t[#t + 1] = conv and conv(v) or v end
  return t
end

local function close(t) getmetatable(t).__close(t) end

local read_buf      -- the "clean" flush: 256 MiB read by a sum, nothing written but one value
local function read_flush()
  read_buf = read_buf or ember.ones({64 * 1024 * 1024}, {dtype = "f32", device = "cuda"})
  local s <close> = read_buf:sum()
end

local function median_ms(fn, o)
  return ember.bench(fn, {warmup = args.warmup, reps = args.reps, device = "cuda", flush_l2 = o.flush,
                          timer = "events", setup = o.setup, clocks = false}).median * 1e3
end

local function measure(dtype, n, d)
  local x = ember.randn({n, d}):to({dtype = dtype, device = "cuda"})
  local w = ember.randn({d}):to({dtype = "f32", device = "cuda"})
  local gy = ember.randn({n, d}):to({dtype = dtype, device = "cuda"})
  x.requires_grad, w.requires_grad = true, not args.no_wgrad
  local function drop() x.grad, w.grad = nil, nil; collectgarbage() end
  local function fwd() local y <close> = F.rmsnorm(x, w, 1e-5) end
  local r = {bytes = 3 * n * d * x:element_size() + 2 * d * 4 + n * 4}
  -- ops: as bench_ops.lua
  r.fwd = median_ms(function() ember.no_grad(fwd) end, {flush = true})
  r.fwd_bwd = median_ms(function() local y <close> = F.rmsnorm(x, w, 1e-5); y:backward(gy) end,
                        {flush = true, setup = drop})
  -- alone / clean: the forward untimed, kept until the next setup
  local y
  local function forward() drop(); if y then close(y) end; y = F.rmsnorm(x, w, 1e-5) end
  r.alone = median_ms(function() y:backward(gy) end, {flush = true, setup = forward})
  r.clean = median_ms(function() y:backward(gy) end, {flush = false, setup = function() forward(); read_flush() end})
  -- graph: the backward of one forward captured (the graph kept: retain_graph)
  forward()                           -- grads dropped: the captured backward writes fresh ones (no accumulation)
  local ok, g = pcall(ember.cuda.graph, function() y:backward(gy, {retain_graph = true}) end, {warmup = 0})
  if ok then
    r.graph = median_ms(function() g:replay() end, {flush = false, setup = read_flush})
    g:close()
  else
    io.stderr:write(("graph capture failed at (%d, %d) %s: %s\n"):format(n, d, dtype, tostring(g)))
  end
  close(y)
  drop()
  return r
end

-- least squares t = a + b·bytes over the rows of one (dtype, D)
local function fit(pts)
  local n, sx, sy, sxx, sxy = #pts, 0, 0, 0, 0
  for _, p in ipairs(pts) do sx, sy, sxx, sxy = sx + p[1], sy + p[2], sxx + p[1] ^ 2, sxy + p[1] * p[2] end
  local b = (n * sxy - sx * sy) / (n * sxx - sx ^ 2)
  return (sy - b * sx) / n, b
end

local function pct(floor, t) return t and ("%.0f%%"):format(floor / t * 100) or "-" end
local function us(t) return t and ("%.2f"):format(t * 1e3) or "-" end

print(("rmsnorm backward sweep: CUDA events, median of %d; %% of %.0f GB/s; f32 weight%s"):format(args.reps,
  args.peak_gbs, args.no_wgrad and ", no weight gradient" or ""))
print("| dtype | D | rows | MB | ops µs | ops % | alone µs | alone % | clean µs | clean % | graph µs | graph % |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
local fits = {}
for _, dtype in ipairs(list(args.dtype)) do
  for _, d in ipairs(list(args.d, math.tointeger)) do
    local pts = {ops = {}, clean = {}, graph = {}}
    for _, n in ipairs(list(args.rows, math.tointeger)) do
      local r = measure(dtype, n, d)
      local ops = r.fwd_bwd - r.fwd
      local floor = r.bytes / (args.peak_gbs * 1e9) * 1e3
      print(("| %s | %d | %d | %.1f | %s | %s | %s | %s | %s | %s | %s | %s |"):format(dtype, d, n, r.bytes / 1e6,
        us(ops), pct(floor, ops), us(r.alone), pct(floor, r.alone), us(r.clean), pct(floor, r.clean), us(r.graph),
        pct(floor, r.graph)))
      table.insert(pts.ops, {r.bytes, ops})
      table.insert(pts.clean, {r.bytes, r.clean})
      if r.graph then table.insert(pts.graph, {r.bytes, r.graph}) end
    end
    fits[#fits + 1] = {dtype, d, pts}
  end
end
print("\nfit per (dtype, D) over the rows: backward ms = intercept + bytes / bandwidth")
print("| dtype | D | ops intercept µs | ops GB/s | clean intercept µs | clean GB/s | graph intercept µs | graph GB/s |")
print("|---|---|---|---|---|---|---|---|")
local function fit_cols(p)
  if #p < 2 then return "-", "-" end
  local a, b = fit(p)
  return ("%.2f"):format(a * 1e3), ("%.0f"):format(1 / b / 1e6)
end
for _, f in ipairs(fits) do
  local a1, b1 = fit_cols(f[3].ops)
  local a2, b2 = fit_cols(f[3].clean)
  local a3, b3 = fit_cols(f[3].graph)
  print(("| %s | %d | %s | %s | %s | %s | %s | %s |"):format(f[1], f[2], a1, b1, a2, b2, a3, b3))
end
