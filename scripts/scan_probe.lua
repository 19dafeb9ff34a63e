--- Where the time of the one-row CUDA cumsum goes (issue 12): each case's time as
-- bench_ops takes it (events, read L2 flush, median of --reps), then 5 calls
-- under the CUPTI profiler, each after a read flush as in the timed reps: the
-- µs a call of scan_row_sums (pass 1: reads the row), scan_row_apply (pass 2:
-- reads it again, last tile first, and writes the scan) and the memset of the
-- counters, and the op's time less those (launch gaps). The DRAM floor of each
-- pass at --gbs beside it: pass 1 s n bytes, pass 2 2 s n less what it finds in
-- L2 (at most ~the L2), so pass 2 near its no-L2 floor says the row's tail was
-- not found there. The switches are read once a process: run it once per setting.
--
--   ember run scripts/scan_probe.lua [--reps 20] [--gbs 4300]
--   EMBER_SCAN_ROW_LAST_FIRST=0 ember run scripts/scan_probe.lua   (pass 2 first tile first)
local ember = require "ember"
local argparse = require "argparse"

local parser = argparse("scan_probe.lua", "Per-kernel split of the one-row cumsum.")
parser:option("--reps", "Timed reps (median).", "20"):convert(math.tointeger)
parser:option("--gbs", "DRAM bandwidth for the floors (GB/s).", "4300"):convert(tonumber)
parser:option("--cases", "Comma list of dtype:log2(n).", "f32:24,f32:26,bf16:24,bf16:26")
local args = parser:parse()
assert(ember.cuda.is_available(), "scan_probe.lua needs a CUDA device")

local function env(k) return os.getenv(k) or "(unset)" end
print(("EMBER_SCAN_ROW=%s EMBER_SCAN_ROW_LAST_FIRST=%s")
  :format(env("EMBER_SCAN_ROW"), env("EMBER_SCAN_ROW_LAST_FIRST")))

local flush = ember.zeros({ember.bench.default_flush_bytes("cuda") // 4}, {device = "cuda"})
local rows = {}
for case in args.cases:gmatch("[^,]+") do
  local dt, lg = case:match("^(%w+):(%d+)$")
  assert(dt, "expected --cases entries like f32:26, got " .. case)
  local n = 1 << tonumber(lg)
  local x = ember.randn(n, {device = "cuda"}):to(dt)
  local s = x:element_size()
  local function call() local y = x:cumsum(0); getmetatable(y).__close(y) end
  local opts = {warmup = 2, reps = args.reps, device = "cuda", flush_l2 = true, flush = "read", timer = "events"}
  local r = ember.bench(function() ember.no_grad(call) end, opts)
  local p = ember.profile(function()
    for _ = 1, 5 do flush:sum(); ember.no_grad(call) end
  end, {backend = "cupti", print = false})
  print(("\n== cumsum %s 2^%s: %.4f ms (min %.4f), %.0f GB/s counted (2 s n)"):format(dt, lg, r.median * 1e3,
    r.min * 1e3, 2 * s * n / r.median / 1e9))
  local t = {sums = 0, apply = 0, memset = 0}
  if p:has_kernels() then
    for _, k in ipairs(p:kernels()) do
      local per = k.total_ms / 5 * 1e3
      local what = k.key:find("scan_row_sums", 1, true) and "sums" or k.key:find("scan_row_apply", 1, true) and "apply"
        or k.key:find("memset", 1, true) and "memset" or nil
      if what then t[what] = t[what] + per end
      print(("   %8.1f us a call  %s%s"):format(per, what and "" or "(flush) ", k.key:sub(1, 100)))
    end
    local f1, f2 = s * n / args.gbs / 1e3, 2 * s * n / args.gbs / 1e3
    print(("   pass 1 %.1f us (floor %.1f), pass 2 %.1f us (floor %.1f with nothing from L2), memset %.1f; "
      .. "the rest of %.1f us: %.1f"):format(t.sums, f1, t.apply, f2, t.memset, r.median * 1e6,
      r.median * 1e6 - t.sums - t.apply - t.memset))
  else
    print("   (no CUPTI: " .. tostring(p.reason) .. ")")
  end
  rows[#rows + 1] = ("%-5s 2^%s %8.4f ms  sums %6.1f us  apply %6.1f us"):format(dt, lg, r.median * 1e3, t.sums,
    t.apply)
  p:close()
end
print("\n" .. table.concat(rows, "\n"))
