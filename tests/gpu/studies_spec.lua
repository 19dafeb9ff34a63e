-- studies_spec.lua (GPU) — the CUDA side of the study scripts and of
-- ember.bench, which the CPU specs cannot reach: bench_attention's graph and
-- flash cells and its memory columns, memory_profile's allocator figures,
-- mixed_precision on device tensors, and ember.bench's device flush and SM
-- clocks. Small grids: the whole file runs in seconds.
local ember = require "ember"
local cjson = require "cjson"

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../lua/helpers.lua")

-- run(script, args) --> stdout, stderr, status, JSON lines (when --json was given a file by us)
local function run(script, args)
  -- the child process needs device memory that this one's caching allocator
  -- may still hold from earlier specs (their OOM tests fill the GPU)
  collectgarbage()
  ember.cuda.empty_cache()
  local json = H.temp()
  local argv = {"run", "scripts/" .. script}
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  argv[#argv + 1] = "--json"
  argv[#argv + 1] = json
  local o, e, status = H.ember(argv)
  local j = {}
  for l in (H.slurp(json) or ""):gmatch("[^\n]+") do j[#j + 1] = cjson.decode(l) end
  os.remove(json)
  return o, e, status, j
end

describe("ember.bench on CUDA", function()
  it("flushes L2 with a 256 MiB device buffer and reads the SM clocks", function()
    local a = ember.randn({1024, 1024}, {device = "cuda"})
    local r = ember.bench(function() a:matmul(a) end, {warmup = 2, reps = 5, flush_l2 = true})
    assert.are.equal("cuda", r.device)
    assert.are.equal(256 * 1024 * 1024, r.flush_bytes)
    assert.are.equal(5, #r.samples)
    if os.execute("command -v nvidia-smi >/dev/null 2>&1") then
      assert.is_true(r.clock_mhz_before > 0 and r.clock_mhz_after > 0 and r.clock_mhz_max >= r.clock_mhz_after,
        ("clocks %s %s %s"):format(tostring(r.clock_mhz_before), tostring(r.clock_mhz_after), tostring(r.clock_mhz_max)))
      assert.matches(", SM %d+→%d+ MHz%)$", ember.bench.format(r))
    end
  end)

  it("counts asynchronous device work (synchronises after each rep)", function()
    local a = ember.randn({4096, 4096}, {device = "cuda"})
    local synced = ember.bench(function() for _ = 1, 4 do a:matmul(a) end end, {warmup = 1, reps = 3, clocks = false})
    -- 4 f32 4096³ matmuls are > 2 ms on any current GPU without TF32
    assert.is_true(synced.min > 1e-3, "min " .. synced.min)
  end)

  it("times the device with timer = events: the work counted, the launch latency not", function()
    local a = ember.randn({4096, 4096}, {device = "cuda"})
    local ev = ember.bench(function() for _ = 1, 4 do a:matmul(a) end end,
      {warmup = 1, reps = 3, clocks = false, flush_l2 = true, timer = "events"})
    assert.are.equal("events", ev.timer)
    assert.is_true(ev.min > 1e-3, "min " .. ev.min)        -- the same > 2 ms of matmuls
    -- an empty call: the events see (almost) nothing, the host clock sees a sync round trip
    local nop = ember.bench(function() end, {warmup = 1, reps = 5, clocks = false, flush_l2 = true, timer = "events"})
    assert.is_true(nop.median < 20e-6, "empty call " .. nop.median)
  end)
end)

describe("bench_attention.lua on CUDA", function()
  local out, err, status, cells

  setup(function()
    out, err, status, cells = run("bench_attention.lua", {"--d", "16,64,48", "--seq", "128,1024", "--passes", "3",
      "--warmup", "1"})
  end)

  it("runs naive, graph and flash (flash in f32 on the TF32 tensor cores) on every cell and exits 0", function()
    assert.are.equal(0, status, err)
    assert.truthy(out:find("config: impl=naive,graph,flash d=16,64,48 ", 1, true), out)
    assert.truthy(out:find("| d  | seq  | naive fwd ms | naive bwd ms | naive mem MiB | graph fwd ms", 1, true))
    assert.are.equal(3 * 3 * 2, #cells)
    for _, c in ipairs(cells) do
      if c.impl == "flash" and c.d == 48 then
        assert.are.equal("unsupported", c.status)            -- no flash kernel for d = 48
      else
        assert.are.equal("ok", c.status, ("%s d=%d seq=%d: %s"):format(c.impl, c.d, c.seq, tostring(c.error)))
        assert.are.equal("f32", c.dtype)
        assert.is_true(c.fwd_ms > 0 and c.bwd_ms > 0)
        assert.is_true(c.mem_before_bwd_bytes > 0 and c.peak_bytes >= c.mem_before_bwd_bytes)
      end
    end
  end)

  it("keeps a score matrix alive before the naive backward, and none before flash's", function()
    local naive, flash
    for _, c in ipairs(cells) do
      if c.seq == 1024 and c.d == 64 then
        if c.impl == "naive" then naive = c elseif c.impl == "flash" then flash = c end
      end
    end
    assert.is_not_nil(naive) assert.is_not_nil(flash)
    local inputs = 4 * 8 * 1024 * 64 * 4     -- q, k, v, o in f32
    assert.is_true(naive.mem_before_bwd_bytes >= naive.score_bytes + inputs, "naive " .. naive.mem_before_bwd_bytes)
    -- the process holds the same fixed buffers for both (cuBLASLt workspace...):
    -- flash saves at least one (B, T, T) f32 matrix less than naive, less the
    -- (B, T) f32 log-sum-exp it keeps for its backward
    local lse = 8 * 1024 * 4
    assert.is_true(flash.mem_before_bwd_bytes + naive.score_bytes <= naive.mem_before_bwd_bytes + lse,
      ("flash %d, naive %d, one score matrix %d"):format(flash.mem_before_bwd_bytes, naive.mem_before_bwd_bytes,
        naive.score_bytes))
  end)

  it("times the decode kernel (GQA, one query, bottom-right, forward only) against naive", function()
    local o, e, st, dc = run("bench_attention.lua", {"--impl", "naive,flash", "--d", "128", "--seq", "4096",
      "--batch", "2", "--heads", "8", "--kv-heads", "2", "--tq", "1", "--dtype", "bf16", "--causal", "--align",
      "bottom_right", "--fwd-only", "--passes", "3", "--warmup", "1"})
    assert.are.equal(0, st, e)
    assert.truthy(o:find("heads=8 kv_heads=2 tq=1 align=bottom_right fwd_only=true", 1, true))
    assert.are.equal(2, #dc)
    for _, c in ipairs(dc) do
      assert.are.equal("ok", c.status, tostring(c.error))
      assert.is_true(c.fwd_ms > 0)
      assert.are.equal(cjson.null, c.bwd_ms)
    end
  end)

  it("replays the same work faster or no slower than 1.5x the eager naive pass", function()
    local naive, graph = {}, {}
    for _, c in ipairs(cells) do
      local key = c.d .. "/" .. c.seq
      if c.impl == "naive" then naive[key] = c elseif c.impl == "graph" then graph[key] = c end
    end
    for key, g in pairs(graph) do
      assert.is_true(g.fwd_ms < 1.5 * naive[key].fwd_ms + 0.05, key .. " fwd " .. g.fwd_ms .. " vs " .. naive[key].fwd_ms)
    end
  end)
end)

describe("memory_profile.lua on CUDA", function()
  it("measures peak above the step's start, training above forward-only", function()
    local _, err, status, cells = run("memory_profile.lua", {"--model", "tiny", "--context", "64,128", "--vocab", "1000"})
    assert.are.equal(0, status, err)
    assert.are.equal(8, #cells)
    local by = {}
    for _, c in ipairs(cells) do
      assert.are.equal("ok", c.status, tostring(c.error))
      assert.is_true(c.start_bytes > 0 and c.peak_bytes > c.start_bytes)
      by[c.precision .. "/" .. c.mode .. "/" .. math.tointeger(c.context)] = c
    end
    for _, prec in ipairs({"fp32", "bf16"}) do
      for _, T in ipairs({64, 128}) do
        local f, t = by[prec .. "/fwd/" .. T], by[prec .. "/train/" .. T]
        -- a training step starts with the AdamW moments (8N bytes) on top of what a forward starts with
        assert.is_true(t.start_bytes - f.start_bytes >= 8 * t.params, prec .. " " .. T)
        assert.is_true(t.peak_bytes > f.peak_bytes, prec .. " " .. T)
      end
      assert.is_true(by[prec .. "/train/128"].peak_bytes > by[prec .. "/train/64"].peak_bytes)
    end
  end)
end)

describe("mixed_precision.lua on CUDA", function()
  it("gives the CPU's sums and the same autocast dtypes", function()
    local _, err, status, gpu = run("mixed_precision.lua", {"--device", "cuda"})
    assert.are.equal(0, status, err)
    local _, err2, status2, cpu = run("mixed_precision.lua", {"--device", "cpu"})
    assert.are.equal(0, status2, err2)
    for i, v in ipairs(gpu[1].accumulation) do
      assert.are.equal(cpu[1].accumulation[i].result, v.result, "variant " .. i)
    end
    for _, dt in ipairs({"bf16", "f16"}) do
      assert.is_true(gpu[1].autocast[dt].matches_pytorch, dt)
    end
  end)
end)
