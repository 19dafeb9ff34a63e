-- profiler_spec.lua (GPU) — ember.profiler with CUPTI on a tiny TransformerLM
-- training step under bf16 autocast: kernels carry their module path and
-- phase, launches are counted per op, the tables add up, kernel time agrees
-- with wall time on a device-bound loop, the CUDA-event fallback is labelled,
-- graph replays are attributed, NVTX does not disturb anything.
local ember = require "ember"
local cjson = require "cjson"
local nn, optim, F = ember.nn, ember.optim, ember.nn.functional
local profiler, nvtx = ember.profiler, ember.nvtx

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

-- CUPTI subscribed before any capture, so graph nodes keep their ops' context.
local cupti_ok, cupti_why = profiler.init()

local V, T, B = 256, 64, 4

local function setup()
  ember.manual_seed(0)
  local model = nn.TransformerLM(nn.configs.tiny{vocab_size = V, context_length = T, device = "cuda"})
  local opt = optim.AdamW(model:parameters(), {lr = 1e-3})
  local data = ember.randint(0, V, {B, T + 1}, {device = "cuda"})
  local x, y = data:narrow(1, 0, T), data:narrow(1, 1, T)
  local function step()
    opt:zero_grad()
    local loss = ember.context.phase("forward", function()
      return ember.autocast("bf16", function() return F.cross_entropy(model(x), y) end)
    end)
    loss:backward()
    opt:step()
    return loss
  end
  return step, model
end

local function has(rows, pattern)
  for _, r in ipairs(rows) do if r.key:find(pattern) then return r end end
end

local function keys(rows)
  local k = {}
  for _, r in ipairs(rows) do k[#k + 1] = r.key end
  return table.concat(k, ", ")
end

-- One profiled step (after two warm-up steps), shared by the read-only tests.
local step = setup()
step() step()
ember.cuda.synchronize()
local P = ember.profile(function() step() profiler.step() end, {print = false})

describe("ember.profiler with CUPTI", function()
  after_each(function()
    if profiler.is_running() then profiler.stop():close() end
  end)

  it("uses CUPTI", function()
    assert.is_true(cupti_ok, tostring(cupti_why))
    assert.are.equal("cupti", P.backend, P.label)
    assert.are.equal(0, P:stats().dropped)
  end)

  it("finds the flash, rmsnorm and matmul kernels in their modules and phases", function()
    local probe = ember.empty({1, 4, 1, 16}, {dtype = "bf16", device = "cuda"})
    local flash = ember.core.flash_applies(probe, probe, probe)
    local fwd_attn = P:kernels{phase = "forward", module = "layers.0.attn"}
    local bwd_attn = P:kernels{phase = "backward", module = "layers.0.attn"}
    if flash then
      assert.truthy(has(fwd_attn, "flash_fwd"), keys(fwd_attn))
      assert.truthy(has(bwd_attn, "flash_dq") or has(bwd_attn, "flash_dkdv"), keys(bwd_attn))
    else
      assert.truthy(#fwd_attn > 0 and #bwd_attn > 0)
    end
    local ln = P:kernels{phase = "forward", module = "layers.0.ln1"}
    assert.truthy(has(ln, "rms"), keys(ln))
    -- matmuls: whatever cuBLASLt names them, they belong to the linear of q_proj
    local q_fwd = P:kernels{by = "op", phase = "forward", module = "layers.0.attn.q_proj"}
    local mm = has(q_fwd, "^linear$") or has(q_fwd, "^matmul$")
    assert.truthy(mm and mm.kernels > 0, keys(q_fwd))
    local q_bwd = P:kernels{by = "op", phase = "backward", module = "layers.0.attn.q_proj"}
    assert.truthy(has(q_bwd, "^linear$"), keys(q_bwd))   -- backward kernels carry their autograd node
    local opt_rows = P:kernels{phase = "optimizer"}
    assert.truthy(has(opt_rows, "adamw"), keys(opt_rows))
  end)

  it("launches kernels in every phase, each counted once by its op", function()
    local s = P:stats()
    for _, ph in ipairs({"forward", "backward", "optimizer"}) do
      assert.truthy(s.phases[ph].kernels > 0, ph)
      assert.are.equal(1, s.phases[ph].count, ph)
    end
    assert.are.equal(1, s.steps)
    -- forward and optimizer: every kernel is launched inside an op scope, and
    -- the launch callbacks (runtime + driver) must count each launch once
    for _, ph in ipairs({"forward", "optimizer"}) do
      local launched, recorded = 0, 0
      for _, r in ipairs(P:ops{phase = ph}) do launched = launched + r.kernels end
      for _, r in ipairs(P:kernels{by = "op", phase = ph, kernels_only = true}) do
        if r.key ~= "" then recorded = recorded + r.kernels end
      end
      assert.are.equal(recorded, launched, ph .. ": kernels launched in op scopes vs kernel records of ops")
      assert.are.equal(s.phases[ph].kernels, recorded, ph .. ": kernels outside any op")
    end
    local linear = has(P:ops(), "^linear$")
    assert.truthy(linear.kernels > 0 and linear.device_ms > 0)
  end)

  it("prints a kernel table whose % column sums to 100", function()
    local t = P:kernel_table{top = 10000}
    local sum, n = 0, 0
    -- the first percentage of a row is its "% GPU" share ("% peak", the roofline column, follows it)
    for line in t:gmatch("[^\n]+") do
      local p = line:match("  (%d+%.%d)%%")
      if p then sum = sum + tonumber(p) n = n + 1 end
    end
    assert.truthy(n >= 5, t)
    assert.truthy(math.abs(sum - 100) < 0.05 * n + 0.1, ("%% column sums to %.1f over %d rows"):format(sum, n))
    for _, ph in ipairs({"forward", "backward", "optimizer"}) do
      assert.truthy(P:kernel_table{phase = ph, top = 5}:find("Kernel"), ph)
    end
  end)

  it("keeps kernel time within the wall window and close to it on a device-bound loop", function()
    local a = ember.randn({4096, 4096}, {device = "cuda"})
    local b = ember.randn({4096, 4096}, {device = "cuda"})
    a:matmul(b)
    ember.cuda.synchronize()
    local p = ember.profile(function() for _ = 1, 10 do a:matmul(b) end end, {print = false})
    local s = p:stats()
    assert.truthy(s.kernels >= 10)
    -- one stream: kernels do not overlap, so their sum is the busy time and fits in the window
    assert.truthy(s.kernel_ms <= s.wall_ms, ("%.3f ms of kernels in %.3f ms"):format(s.kernel_ms, s.wall_ms))
    assert.truthy(s.gpu_busy_ms >= 0.99 * s.kernel_ms and s.gpu_busy_ms <= s.kernel_ms + s.copy_ms + 0.01,
      ("busy %.3f ms, kernels %.3f ms, copies %.3f ms"):format(s.gpu_busy_ms, s.kernel_ms, s.copy_ms))
    assert.truthy(s.kernel_ms >= 0.7 * s.wall_ms, ("%.3f ms of kernels in %.3f ms"):format(s.kernel_ms, s.wall_ms))
    p:close()
  end)

  it("writes a trace with GPU tracks whose kernels name their op and module", function()
    local path = os.tmpname() .. ".json"
    P:export_chrome_trace(path)
    local f = assert(io.open(path))
    local doc = cjson.decode(f:read("a"))
    f:close()
    os.remove(path)
    local kernels, with_module = 0, 0
    for _, e in ipairs(doc.traceEvents) do
      if e.pid >= 100 and e.ph == "X" and e.cat == "kernel" then
        kernels = kernels + 1
        if e.args and e.args.m and e.args.p then with_module = with_module + 1 end
      end
    end
    assert.are.equal(P:stats().kernels, kernels)
    assert.truthy(with_module > kernels / 2)
  end)

  it("says when nothing ran on the GPU", function()
    local p = ember.profile(function() ember.randn(64, 64):matmul(ember.randn(64, 64)) end, {print = false})
    assert.are.equal("cupti", p.backend)
    assert.truthy(p:kernel_table():find("no GPU activity recorded"))
    p:close()
  end)

  it("starts fresh each session", function()
    local p1 = ember.profile(step, {print = false})
    local p2 = ember.profile(step, {print = false})
    assert.are.equal(p1:stats().kernels, p2:stats().kernels)
    p1:close() p2:close()
  end)
end)

describe("the CUDA-event fallback", function()
  it("times ops with CUDA events when asked, and labels the tables", function()
    local p = ember.profile(step, {backend = "events", print = false})
    assert.are.equal("events", p.backend)
    assert.truthy(p.label:find('^CUDA%-event timing per op; CUPTI unavailable: backend "events" was asked for'))
    local linear = has(p:ops(), "^linear$")
    assert.truthy(linear.device_ms and linear.device_ms > 0)
    assert.truthy(p:op_table():find("CUDA events around the op"))
    assert.truthy(p:kernel_table():find("no per%-kernel times without CUPTI"))
    assert.truthy(p:stats().op_device_ms > 0)
    p:close()
  end)

  it("is what auto falls back to when libcupti cannot be loaded", function()
    local ember_bin = (os.getenv("EMBER_BUILD") or "./build") .. "/ember"
    local pipe = io.popen("EMBER_CUPTI_PATH=/nonexistent/libcupti.so " .. ember_bin ..
      [[ -e 'local x = ember.randn(256, 256, {device="cuda"}); ]] ..
      [[local p = ember.profile(function() x:matmul(x) end, {print=false}); print(p.backend); print(p.label)' 2>&1]])
    local out = pipe:read("a")
    pipe:close()
    assert.truthy(out:find("^events\n"), out)
    assert.truthy(out:find("CUPTI unavailable: cannot load libcupti", 1, true), out)
  end)
end)

describe("graph replays", function()
  it("are profiled, with the ops and phases of the capture", function()
    local gstep = setup()
    gstep()
    ember.cuda.synchronize()
    local g = ember.cuda.graph(function() gstep() end, {warmup = 0})
    g:replay()
    ember.cuda.synchronize()
    local p = ember.profile(function() g:replay() end, {print = false})
    local s = p:stats()
    assert.truthy(s.graph_kernels > 0)
    assert.are.equal(s.kernels, s.graph_kernels)
    assert.are.equal(s.graph_kernels, s.graph_kernels_attributed)
    assert.truthy(s.phases.backward.kernels > 0)
    assert.truthy(#p:kernels{phase = "forward", module = "layers.0.attn*"} > 0)
    assert.truthy(has(p:ops(), "^graph_replay$"))
    p:close()
    g:close()
  end)
end)

describe("ember.nvtx on CUDA", function()
  it("emits op ranges without changing results", function()
    assert.is_true(nvtx.available())
    local s1 = setup()
    local base = {s1():item(), s1():item()}
    local s2 = setup()
    assert.is_true(nvtx.enable(true))
    local ok, res = pcall(function()
      return nvtx.range("two steps", function() return {s2():item(), s2():item()} end)
    end)
    nvtx.enable(false)
    assert.is_true(ok, res)
    for i = 1, 2 do assert.truthy(math.abs(base[i] - res[i]) <= 1e-6 * math.abs(base[i]), i) end
    -- and with the profiler running at the same time
    nvtx.enable(true)
    local p = ember.profile(s2, {print = false})
    nvtx.enable(false)
    assert.truthy(p:stats().kernels > 0)
    p:close()
  end)
end)

describe("roofline columns with CUPTI", function()
  it("gives kernels their op call's cost, split by duration, and covers the step", function()
    -- a bf16 gemm: one op call, its kernel(s) inherit 2·n·m·k FLOPs and a, b, c bytes
    local n, k, m = 512, 256, 128
    local a = ember.randn(n, k, {device = "cuda", dtype = "bf16"})
    local b = ember.randn(k, m, {device = "cuda", dtype = "bf16"})
    local p = ember.profile(function() return a:matmul(b) end, {print = false})
    local op = has(p:ops{peaks = {gbs = 3350, tflops = 989.4}}, "^matmul$")
    assert.truthy(op, keys(p:ops()))
    assert.are.equal(2 * n * k * m, op.flops)
    assert.are.equal((n * k + k * m + n * m) * 2, op.bytes)
    assert.truthy(op.cost_ms > 0 and op.cost_ms == op.roof_ms)
    local kb, kf = 0, 0
    for _, r in ipairs(p:kernels{by = "op"}) do
      if r.key == "matmul" then kb, kf = kb + r.bytes, kf + r.flops end
    end
    assert.truthy(math.abs(kf - op.flops) <= 1e-9 * op.flops, ("kernels %g vs op %g FLOPs"):format(kf, op.flops))
    assert.truthy(math.abs(kb - op.bytes) <= 1e-9 * op.bytes)
    -- 512x256x128 in bf16 is 73 FLOPs a byte, under the H100's ridge (989.4 TF/s / 3350 GB/s = 295):
    -- its floor is the bytes
    assert.are.equal(op.bytes / 3350e9 > op.flops / 989.4e12 and "memory" or "compute", op.bound)
    assert.are.equal("memory", op.bound)
    p:close()
    -- the tiny LM's step: declared costs cover most of the kernel time
    local cov = P:cost_coverage()
    assert.truthy(cov > 90, ("coverage %.1f%%"):format(cov))
    local t = P:roofline_table{by = "kernel"}
    assert.truthy(t:find("% peak", 1, true), t)
    assert.truthy(t:find("H100", 1, true) or t:find("H200", 1, true), t)   -- the datasheet peaks in the footer
  end)
end)

describe("roofline columns of graph replays", function()
  -- The same step eager and captured (each after the same warm-up): every op
  -- row of the replays carries what the eager step's declares, per step.
  local function by_key(rows)
    local t = {}
    for _, r in ipairs(rows) do t[r.key] = r end
    return t
  end
  local function close(a, b) return math.abs(a - b) <= 1e-9 * math.max(math.abs(a), math.abs(b)) end

  it("give replayed kernels their captured op's bytes and FLOPs, as eager", function()
    assert.is_true(cupti_ok, tostring(cupti_why))
    local estep = setup()
    estep() estep()
    ember.cuda.synchronize()
    local pe = ember.profile(function() estep() end, {print = false})
    local gstep = setup()
    gstep() gstep()
    ember.cuda.synchronize()
    local g = ember.cuda.graph(function() gstep() end, {warmup = 0})
    g:replay()
    ember.cuda.synchronize()
    local replays = 2
    local pg = ember.profile(function() for _ = 1, replays do g:replay() end end, {print = false})
    assert.is_true(pg:replayed())
    assert.is_false(pe:replayed())
    -- kernels only: a replayed memset node reaches the profile under graph_replay, not its captured op
    -- (docs/profiling.md; the tiny LM's fill_ of its embedding gradient's zeros)
    for _, by in ipairs({"op", "module", "phase"}) do
      local e, r = by_key(pe:kernels{by = by, kernels_only = true}), by_key(pg:kernels{by = by, kernels_only = true})
      local costed = 0
      for key, er in pairs(e) do
        if er.bytes > 0 or er.flops > 0 then
          costed = costed + 1
          local rr = r[key]
          assert.truthy(rr, ("%s %s: no replayed row"):format(by, key))
          assert.truthy(close(rr.bytes, replays * er.bytes),
            ("%s %s: replays %g bytes, eager %g per step"):format(by, key, rr.bytes, er.bytes))
          assert.truthy(close(rr.flops, replays * er.flops),
            ("%s %s: replays %g FLOPs, eager %g per step"):format(by, key, rr.flops, er.flops))
          assert.truthy(rr.gbs and rr.gbs > 0 and rr.pct_peak and rr.bound, ("%s %s: no rates"):format(by, key))
        end
      end
      assert.truthy(costed > 0, by)
      for key, rr in pairs(r) do   -- and nothing costed that eager does not cost
        if rr.bytes > 0 then
          assert.truthy(e[key] and e[key].bytes > 0, ("%s %s: costed only in replays"):format(by, key))
        end
      end
    end
    -- the tables: the roofline by op comes from the replayed kernels, covered as eager's
    local t = pg:roofline_table{by = "op"}
    assert.truthy(t:find("graph replays: the ops of the capture", 1, true), t)
    local cov = pg:cost_coverage()
    assert.truthy(cov > 90, ("coverage of the replays %.1f%%"):format(cov))
    pe:close()
    pg:close()
    g:close()
  end)
end)
