-- bench_spec.lua — ember.bench (bindings/ember/bench.lua) on the CPU: the
-- result's fields and units, what is and is not timed (setup, the cache
-- flush), option checking, and ember.bench.format's line. The CUDA parts
-- (device synchronisation, the L2 flush on the device, SM clocks through
-- nvidia-smi) need a GPU host; only the nvidia-smi device selector is
-- checked here.
local ember = require "ember"
local bench = ember.bench

local BUILD = os.getenv("EMBER_BUILD") or "./build"

--- Busy-wait `s` seconds on the host clock.
local function spin(s)
  local t0 = ember.core.clock()
  while ember.core.clock() - t0 < s do end
end

describe("ember.bench", function()
  it("is callable and carries stats and format beside it", function()
    assert.are.equal("table", type(bench))
    assert.are.equal("function", type(bench.stats))
    assert.are.equal("function", type(bench.format))
    assert.are.equal(require("ember.bench"), bench)
  end)

  it("returns mean, std, median, min, max and the samples in seconds", function()
    local r = bench(function() spin(2e-3) end, {warmup = 1, reps = 4})
    assert.are.equal(4, #r.samples)
    assert.are.equal(4, r.reps)
    assert.are.equal(1, r.warmup)
    assert.are.equal("cpu", r.device)
    -- each call spins 2 ms: every sample at least that, and not 100x more
    for _, s in ipairs(r.samples) do assert.is_true(s >= 2e-3 and s < 0.2) end
    assert.is_true(r.min <= r.median and r.median <= r.max)
    assert.is_true(r.min <= r.mean and r.mean <= r.max)
    assert.is_true(r.std >= 0)
  end)

  it("calls fn warmup + reps times, setup before every call", function()
    local calls, setups, order = 0, 0, {}
    bench(function() calls = calls + 1 order[#order + 1] = "f" end,
      {warmup = 2, reps = 3, setup = function() setups = setups + 1 order[#order + 1] = "s" end})
    assert.are.equal(5, calls)
    assert.are.equal(5, setups)
    assert.are.equal("sfsfsfsfsf", table.concat(order))
  end)

  it("does not time setup", function()
    local r = bench(function() end, {warmup = 0, reps = 5, setup = function() spin(5e-3) end})
    -- were setup timed, every sample would be >= 5 ms; the fastest is what an
    -- empty call costs (one descheduled rep on a busy CI machine cannot fail this)
    assert.is_true(r.min < 2e-3, "a 5 ms setup leaked into the timing: " .. r.min)
  end)

  it("flushes the cache before each timed rep, untimed, with the asked size", function()
    local r = bench(function() end, {warmup = 0, reps = 5, flush_l2 = true, flush_bytes = 64 * 1024 * 1024})
    assert.are.equal(64 * 1024 * 1024, r.flush_bytes)
    assert.are.equal("read", r.flush)   -- the CPU's flush is a read, whatever flush= says
    assert.is_true(r.min < 2e-3, "the 64 MiB flush leaked into the timing: " .. r.min)
  end)

  it("sizes the CPU flush from the caches: between 1 and 256 MiB", function()
    local b = bench.default_flush_bytes("cpu")
    assert.is_true(math.type(b) == "integer" and b >= 2 ^ 20 and b <= 256 * 2 ^ 20)
    assert.are.equal(256 * 2 ^ 20, bench.default_flush_bytes("cuda"))
  end)

  it("reports no flush and no clocks unless asked / on the CPU", function()
    local r = bench(function() end, {reps = 2, clocks = true})
    assert.is_nil(r.flush_bytes)
    assert.is_nil(r.flush)
    assert.is_nil(r.clock_mhz_before)
    assert.is_nil(r.clock_mhz_after)
  end)

  it("times host dispatch only with sync = false", function()
    local r = bench(function() end, {warmup = 0, reps = 2, sync = false})
    assert.are.equal(2, #r.samples)
  end)

  it("accepts a callable table as fn", function()
    local n = 0
    local f = setmetatable({}, {__call = function() n = n + 1 end})
    bench(f, {warmup = 0, reps = 2})
    assert.are.equal(2, n)
  end)

  it("rejects bad arguments with a message naming the option", function()
    local function e(fn, opts) return select(2, pcall(bench, fn, opts)) end
    local nop = function() end
    assert.matches("ember.bench: expected a function, got number", e(3))
    assert.matches("ember.bench: expected an options table, got string", e(nop, "x"))
    assert.matches("warmup must be an integer >= 0", e(nop, {warmup = -1}))
    assert.matches("reps must be an integer >= 1", e(nop, {reps = 0}))
    assert.matches("reps must be an integer >= 1", e(nop, {reps = 1.5}))
    assert.matches("sync must be a boolean", e(nop, {sync = 1}))
    assert.matches("flush_l2 must be a boolean", e(nop, {flush_l2 = "yes"}))
    assert.matches("setup must be a function", e(nop, {setup = 1}))
    assert.matches("flush_bytes must be an integer >= 4", e(nop, {flush_bytes = 0}))
    assert.matches('flush must be "write" or "read", got both', e(nop, {flush = "both"}), 1, true)
    assert.matches('device must be "cpu", "cuda" or "cuda:N", got gpu', e(nop, {device = "gpu"}))
    assert.matches('timer must be "host" or "events", got clock', e(nop, {timer = "clock"}))
    assert.matches('timer "events" needs a CUDA device', e(nop, {device = "cpu", timer = "events"}))
  end)

  it("says which timer it used (host unless asked)", function()
    assert.are.equal("host", bench(function() end, {warmup = 0, reps = 1, device = "cpu"}).timer)
    assert.are.equal("host", bench(function() end, {warmup = 0, reps = 1, device = "cpu", timer = "host"}).timer)
  end)

  it("refuses a CUDA device when none is available", function()
    if ember.cuda.is_available() then pending("a CUDA device is available here: nothing to refuse") return end
    local ok, err = pcall(bench, function() end, {device = "cuda:0"})
    assert.is_false(ok)
    assert.matches("ember.bench: device cuda:0 asked for, but no CUDA device is available", err, 1, true)
  end)
end)

describe("ember.bench.format", function()
  local r = {mean = 0.012345, std = 0.0001, median = 0.0123, min = 0.0122, max = 0.0126,
    samples = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}

  it("prints mean ± std in ms with median, min, max and n", function()
    assert.are.equal("attn fwd: 12.345 ± 0.100 ms (median 12.300, min 12.200, max 12.600, n=10)",
      bench.format(r, "attn fwd"))
  end)

  it("omits the label when there is none", function()
    assert.are.equal("12.345 ± 0.100 ms (median 12.300, min 12.200, max 12.600, n=10)", bench.format(r))
  end)

  it("switches to µs under 0.1 ms", function()
    local s = bench.format({mean = 2.5e-6, std = 1e-7, median = 2.4e-6, min = 2e-6, max = 3e-6, reps = 4})
    assert.are.equal("2.500 ± 0.100 µs (median 2.400, min 2.000, max 3.000, n=4)", s)
  end)

  it("appends the SM clocks when the result has them", function()
    local c = {}
    for k, v in pairs(r) do c[k] = v end
    c.clock_mhz_before, c.clock_mhz_after = 1980, 1755
    assert.matches("n=10, SM 1980→1755 MHz)", bench.format(c), 1, true)
  end)

  it("formats a real result", function()
    local s = bench.format(bench(function() end, {warmup = 0, reps = 3}), "nop")
    local unit = s:match("^nop: %d+%.%d%d%d ± %d+%.%d%d%d (%S+) %(median [%d.]+, min [%d.]+, max [%d.]+, n=3%)$")
    assert.is_true(unit == "µs" or unit == "ms", s)
  end)

  it("rejects what is not a result", function()
    assert.error_matches(function() bench.format(nil) end, "ember.bench.format: expected a result of ember.bench")
  end)
end)

describe("ember.bench.smi_selector", function()
  -- nvidia-smi numbers every GPU, CUDA only the visible ones: cuda:1 under
  -- CUDA_VISIBLE_DEVICES=GPU-aaaa,7 is what nvidia-smi calls 7.
  local function selector(env, device)
    local f = io.popen(("env %s %s/ember -e 'io.write(ember.bench.smi_selector(%q))' 2>&1"):format(env, BUILD, device))
    local out = f:read("a")
    f:close()
    return out
  end

  it("maps cuda:N through CUDA_VISIBLE_DEVICES (indices or UUIDs)", function()
    assert.are.equal("7", selector("CUDA_VISIBLE_DEVICES=GPU-aaaa,7", "cuda:1"))
    assert.are.equal("GPU-aaaa", selector("CUDA_VISIBLE_DEVICES=GPU-aaaa,7", "cuda:0"))
  end)

  it("uses the CUDA index when CUDA_VISIBLE_DEVICES is unset", function()
    assert.are.equal("3", selector("-u CUDA_VISIBLE_DEVICES", "cuda:3"))
  end)
end)

describe("scripts/bench_host.lua", function()
  local function run(args)
    local f = io.popen(("%s/ember run scripts/bench_host.lua %s 2>&1; echo rc=$?"):format(BUILD, args))
    local out = f:read("a")
    f:close()
    return out
  end

  it("prints each phase's host time and the dispatch figures, and appends them as JSON", function()
    local json = os.tmpname()
    local out = run("--layers 1 --steps 1 --samples 1 --warmup 0 --reps 200 --json " .. json)
    assert.truthy(out:find("rc=0", 1, true), out)
    for _, name in ipairs({"zero_grad", "forward", "backward", "optimizer", "total"}) do
      assert.truthy(out:find("\n  " .. name .. " +[%d.]+ us"), name .. " missing in:\n" .. out)
    end
    assert.truthy(out:find("a * w (w requires grad)", 1, true), out)
    local f = assert(io.open(json))
    local rec = require("cjson").decode(f:read("l"))
    f:close()
    os.remove(json)
    for _, k in ipairs({"zero_grad_us", "forward_us", "backward_us", "optimizer_us", "step_host_us", "mul_us",
                        "mul_recorded_us", "mul_inplace_us"}) do
      assert.is_true(type(rec[k]) == "number" and rec[k] > 0, k)
    end
    assert.are.equal(1, rec.config.layers)
    assert.are.equal("wall", rec.config.clock)
  end)

  it("names a bad option's value", function()
    assert.truthy(run("--layers 0"):find("--layers: expected a positive integer", 1, true))
    assert.truthy(run("--d-ff 0"):find("--d-ff: expected a positive integer", 1, true))
    assert.truthy(run("--clock gpu"):find("'--clock' must be one of 'wall', 'cpu'", 1, true))
  end)
end)
