-- dist_bench_spec.lua — the distributed studies (scripts/bench_allreduce.lua,
-- bench_ddp.lua, bench_zero.lua) run as a user runs them, in driver mode on
-- the CPU: 2 MPI ranks through `ember launch`, tiny sizes, PyTorch off; and
-- ember.ddp_planner's simulation against hand-computed schedules. The CUDA
-- paths (NCCL, events, memory statistics) run on the GPU host.
--
-- Run from the repository root:  EMBER_BUILD=$PWD/build busted tests/lua/dist_bench_spec.lua
-- Needs Open MPI's mpirun (the script cases are pending without it).
local cjson = require "cjson"

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local HAVE_MPIRUN = H.have("mpirun")

-- Run a study in driver mode (not under a launch: the rank variables unset).
local function study(script, args)
  local argv = {"run", "scripts/" .. script}
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  return H.ember(argv, {wrap = "env -u EMBER_RANK -u EMBER_WORLD_SIZE -u EMBER_LOCAL_RANK timeout 120"})
end

local function json_lines(path)
  local out = {}
  for l in (H.slurp(path) or ""):gmatch("[^\n]+") do out[#out + 1] = cjson.decode(l) end
  return out
end

local function has(text, s) return text:find(s, 1, true) ~= nil end

local it_mpi = HAVE_MPIRUN and it or pending

describe("distributed studies (CPU, 2 ranks)", function()
  after_each(H.remove_temps)

  it_mpi("bench_allreduce: a table with busbw and JSON lines with the fields", function()
    local json, md = H.temp(".jsonl"), H.temp(".md")
    local out, err, status = study("bench_allreduce.lua", {"--device", "cpu", "--sizes", "0.01,0.1",
      "--nproc", "2", "--warmup", "1", "--iters", "3", "--torch", "off", "--json", json, "--md", md})
    assert.are.equal(0, status, err .. out)
    assert.truthy(out:match("device: cpu"), out)
    assert.truthy(out:match("commit: "), out)
    assert.truthy(has(out, "| size MiB |"), out)
    assert.truthy(has(out, "Ember busbw GB/s"), out)
    assert.truthy(has(out, "PyTorch: not run (--torch off)"), out)
    local recs = json_lines(json)
    assert.are.equal(2, #recs)
    for i, r in ipairs(recs) do
      assert.are.equal("ember", r.impl)
      assert.are.equal(2, r.world_size)
      assert.are.equal(({0.01, 0.1})[i], r.size_mib)
      assert.are.equal(math.floor(r.size_mib * 2 ^ 20 / 4) * 4, r.bytes)
      for _, k in ipairs({"time_us", "algbw_gbs", "busbw_gbs", "commit", "device", "date"}) do
        assert.is_not_nil(r[k], k)
      end
      -- algbw = bytes / time; busbw = algbw * 2(n-1)/n = algbw for 2 ranks
      assert.is_true(math.abs(r.algbw_gbs - r.bytes / (r.time_us * 1e-6) / 1e9) <= 1e-9 * r.algbw_gbs)
      assert.are.equal(r.algbw_gbs, r.busbw_gbs)
      assert.are.equal("f32", r["config.dtype"])
    end
    assert.truthy(has(H.slurp(md), "| size MiB |"))
  end)

  it_mpi("bench_ddp: every strategy on a tiny model prints step times and the bytes accounting", function()
    local json = H.temp(".jsonl")
    local out, err, status = study("bench_ddp.lua", {"--device", "cpu", "--model", "tiny", "--vocab", "128",
      "--context", "16", "--batch", "2", "--precision", "fp32", "--nproc", "2", "--warmup", "1", "--steps", "2",
      "--comm-reps", "1", "--bucket-mb", "0.01,25", "--plan", "--torch", "off", "--json", json})
    assert.are.equal(0, status, err .. out)
    for _, s in ipairs({"none (compute only)", "naive", "flat", "overlap", "bucketed"}) do
      assert.truthy(out:match("\n| " .. s:gsub("%p", "%%%0") .. " +|"), s .. "\n" .. out)
    end
    assert.truthy(has(out, "Ember 2 GPU ms"), out)
    assert.truthy(has(out, "planner: suggested bucket"), out)
    local by = {}
    for _, r in ipairs(json_lines(json)) do
      by[("%d %s %s"):format(r.world_size, r.strategy, r.bucket_mb and ("%g"):format(r.bucket_mb) or "nil")] = r
    end
    for _, key in ipairs({"2 naive nil", "2 flat nil", "2 overlap nil", "2 bucketed 0.01", "2 bucketed 25",
        "1 none nil", "2 none nil"}) do
      local r = by[key]
      assert.is_not_nil(r, key)
      assert.is_true(r.step_ms > 0, key)
      if r.strategy ~= "none" and r.world_size == 2 then
        -- stats() payload per step is the gradient bytes: the formula holds exactly
        assert.is_true(math.abs(r.measured_wire_bytes_per_step - r.formula_wire_bytes_per_step) < 1e-6, key)
      end
    end
    assert.is_true(by["2 bucketed 0.01"].measured_allreduce_calls_per_step > 1)
    assert.are.equal(1, by["2 bucketed 25"].measured_allreduce_calls_per_step)
    assert.is_number(by["2 bucketed 25"].predicted_exposed_ms)
    assert.truthy(has(out, "= formula"), out)
  end)

  it_mpi("bench_zero: AdamW and ShardedOptimizer, the sharded state about half on 2 ranks", function()
    local json = H.temp(".jsonl")
    local out, err, status = study("bench_zero.lua", {"--device", "cpu", "--model", "tiny", "--vocab", "128",
      "--context", "16", "--batch", "2", "--precision", "fp32", "--nproc", "2", "--warmup", "0", "--steps", "2",
      "--torch", "off", "--json", json})
    assert.are.equal(0, status, err .. out)
    assert.truthy(out:match("\n| adamw +|"), out)
    assert.truthy(out:match("\n| sharded +|"), out)
    local by = {}
    for _, r in ipairs(json_lines(json)) do by[r.variant] = r end
    assert.are.equal(by.adamw.state_bytes, by.sharded.state_unsharded_bytes)
    assert.is_true(by.sharded.state_bytes < 0.75 * by.adamw.state_bytes)
    assert.is_true(by.sharded.step_ms > 0)
  end)
end)

describe("ember.ddp_planner", function()
  local P = require "ember.ddp_planner"
  local MiB = 2 ^ 20
  -- four 1 MiB gradients in registration order, ready in reverse order 1 ms apart
  local timeline = {backward_ms = 4, params = {
    {bytes = MiB, ready_ms = 4}, {bytes = MiB, ready_ms = 3}, {bytes = MiB, ready_ms = 2}, {bytes = MiB, ready_ms = 1}}}

  it("simulates buckets as ddp_bucketed plans them, one comm stream", function()
    -- buckets (cap 2 MiB, first 1 MiB): {p4} ready 1, {p3, p2} ready 3, {p1} ready 4
    -- latency 0.1 ms, 1 MiB/ms: {p4} 1 -> 2.1; {p3,p2} 3 -> 5.1; {p1} max(4, 5.1) -> 6.2
    -- exposed = 6.2 - 4 (end of backward) = 2.2 ms
    local exposed, info = P.simulate(timeline, {latency_ms = 0.1, bytes_per_ms = MiB}, 2, 1)
    assert.are.equal(3, info.buckets)
    assert.is_true(math.abs(exposed - 2.2) < 1e-12, tostring(exposed))
    assert.is_true(math.abs(info.comm_ms - 4.3) < 1e-12)
  end)

  it("suggests the bucket size with the least predicted exposed communication", function()
    -- latency 1 ms, 100 MiB/ms: 1 MiB buckets end at 5.04 (exposed 1.04); 1000 MiB: {p4}, {p3,p2,p1}
    -- ending at 4 + 1 + 0.03 = 5.03 (exposed 1.03)
    local plan = P.suggest(timeline, {latency_ms = 1, bytes_per_ms = 100 * MiB}, {1, 1000})
    assert.are.equal(1000, plan.suggested_mb)
    assert.is_true(math.abs(plan.candidates[1].exposed_ms - 1.04) < 1e-9)
    assert.is_true(math.abs(plan.candidates[2].exposed_ms - 1.03) < 1e-9)
  end)

  it("fits latency and bandwidth by least squares", function()
    local link = P.fit_link({{bytes = 100, ms = 1.1}, {bytes = 200, ms = 1.2}, {bytes = 400, ms = 1.4}})
    assert.is_true(math.abs(link.latency_ms - 1.0) < 1e-9)
    assert.is_true(math.abs(link.bytes_per_ms - 1000) < 1e-6)
  end)

  it("measures when each gradient of a model is ready (CPU, host clock)", function()
    local ember = require "ember"
    local nn, F = ember.nn, ember.nn.functional
    ember.manual_seed(0)
    local cfg = nn.configs.tiny{vocab_size = 64, context_length = 8}
    local model = nn.TransformerLM(cfg)
    local x = ember.randint(0, 64, {2, 9})
    local t = P.ready_times(model, function() return F.cross_entropy(model(x:narrow(1, 0, 8)), x:narrow(1, 1, 8)) end)
    assert.are.equal(#model:parameters(), #t.params)
    for _, e in ipairs(t.params) do
      assert.is_true(e.ready_ms >= 0 and e.ready_ms <= t.backward_ms + 1e-9)
    end
    -- the lm_head (registered last) is ready before the token embeddings (first)
    assert.is_true(t.params[#t.params].ready_ms <= t.params[1].ready_ms)
  end)
end)
