--- SMs set aside for AdamW beside gemms (engine/sm_split.c; docs/perf.md,
-- sixteenth session): for each K, on one CUDA device,
--   gemm   R gemms of (n x k) @ (k x m) bf16 with K SMs set aside (cuBLASLt's
--          SM_COUNT_TARGET): if cuBLASLt honours the target, the time grows
--          about as SMs / (SMs - K) (in steps: persistent kernels run whole
--          waves of tiles), and "gemm SMs" (SMs · t(0) / t(K)) falls with K;
--   adamw  one fused AdamW step over P f32 parameters on K SMs (28 bytes a
--          parameter): GB/s, and GB/s per SM, the number the overlap needs;
--   both   the two at once, AdamW on a side stream: what the overlap gains
--          against running them one after the other (serial = gemm(0) +
--          adamw(0), both on the whole GPU).
-- K = 0 is today's behaviour: full-GPU gemms, full-grid AdamW beside them.
--
--   ember run scripts/bench_sm_split.lua --sms 0,8,16,24,32,48
local ember = require "ember"
local argparse = require "argparse"
local core = ember.core

local parser = argparse("bench_sm_split.lua", "Gemms on fewer SMs, AdamW on the rest: alone and together.")
parser:option("--sms", "SMs set aside (K), a comma list.", "0,8,16,24,32,48")
parser:option("--shape", "Gemm n,k,m (xl's MLP up-projection at B4 T512: 2048,1600,6400).", "2048,1600,6400")
parser:option("--gemms", "Gemms per timed run (R).", "50"):convert(math.tointeger)
parser:option("--params-m", "AdamW parameters, millions (P).", "100"):convert(tonumber)
parser:option("--reps", "Timed runs per point (median reported).", "10"):convert(math.tointeger)
local args = parser:parse(arg)

local function fail(msg) io.stderr:write("bench_sm_split.lua: ", msg, "\n") os.exit(2) end
if not ember.cuda.is_available() then fail("needs a CUDA device") end
local ks = {}
for s in args.sms:gmatch("[^,]+") do
  local k = math.tointeger(tonumber(s))
  if not k or k < 0 then fail("--sms: expected integers >= 0, got " .. s) end
  ks[#ks + 1] = k
end
local n, kk, m = args.shape:match("^(%d+),(%d+),(%d+)$")
if not n then fail("--shape: expected n,k,m, got " .. args.shape) end
n, kk, m = tonumber(n), tonumber(kk), tonumber(m)
if not (args.gemms and args.gemms > 0 and args.reps and args.reps > 0 and args.params_m and args.params_m > 0) then
  fail("--gemms, --reps and --params-m must be > 0")
end

ember.manual_seed(0)
local a = ember.randn({n, kk}):to("cuda"):to("bf16")
local b = ember.randn({kk, m}):to("cuda"):to("bf16")
local P = math.floor(args.params_m * 1e6)
local p, g = ember.randn({P}):to("cuda"), ember.randn({P}):to("cuda")
local mo, v = ember.zeros({P}):to("cuda"), ember.zeros({P}):to("cuda")
local adam_bytes = 28 * P

local function gemms()
  for _ = 1, args.gemms do local _ = a:matmul(b) end
end
local function adamw() core.adamw_({p}, {g}, {mo}, {v}, 1e-4, 0.9, 0.95, 1e-8, 0.1, 1) end

local side = ember.cuda.Stream()
local fork, join = ember.cuda.Event(), ember.cuda.Event()
local function both()
  fork:record()
  side:wait_event(fork)
  ember.cuda.stream(side, adamw)
  gemms()
  join:record(side)
  ember.cuda.current_stream():wait_event(join)
end

-- fn timed with `reserve` SMs set aside from gemms and AdamW on `optim` SMs (restored after, also on error)
local function time_ms(fn, reserve, optim)
  core.cuda_set_sm_split(0, reserve, optim)
  local ok, r = pcall(ember.bench.bench, fn, {warmup = 2, reps = args.reps, timer = "events", clocks = false})
  core.cuda_set_sm_split(0, 0, 0)
  if not ok then error(r, 0) end
  return r.median * 1e3
end

local sms = ember.cuda.sm_count()
print(("device %s, %d SMs; gemm %dx%dx%d bf16 x%d (%.1f GFLOP), AdamW %.0fM params (%.2f GB)"):format(
  ember.cuda.get_device_name(), sms, n, kk, m, args.gemms, 2 * n * kk * m * args.gemms / 1e9, P / 1e6,
  adam_bytes / 1e9))
print("   K   gemm ms  gemm SMs  TFLOP/s | adamw ms   GB/s  GB/s/SM | both ms  serial ms  saved ms")
local g0, a0
for _, k in ipairs(ks) do
  local tg = time_ms(gemms, k, 0)
  local ta = time_ms(adamw, 0, k)
  local tb = time_ms(both, k, k)
  g0, a0 = g0 or (k == 0 and tg or time_ms(gemms, 0, 0)), a0 or (k == 0 and ta or time_ms(adamw, 0, 0))
  local gbs = adam_bytes / (ta * 1e-3) / 1e9
  print(("%4d  %8.3f  %8.1f  %7.1f | %8.3f  %5.0f  %7.1f | %7.3f  %9.3f  %8.3f"):format(k, tg, sms * g0 / tg,
    2 * n * kk * m * args.gemms / (tg * 1e-3) / 1e12, ta, gbs, k > 0 and gbs / k or gbs / sms, tb, g0 + a0,
    g0 + a0 - tb))
end
