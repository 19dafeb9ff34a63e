-- The profiler's roofline columns on the CPU: the bytes and FLOPs ops
-- declare (EM_OP_COST) against hand counts from their shapes, the rates
-- derived from them, the tables, and the coverage of a tiny LM's training
-- step. Every session asks for backend "host" (host self time per op), so the
-- figures mean the same in a CUDA build. GPU: tests/gpu/profiler_spec.lua.
local ember = require "ember"
local nn, F, context = ember.nn, ember.nn.functional, ember.context
local profiler = ember.profiler

local F32 = 4

local function profile(fn)
  return ember.profile(fn, {backend = "host", print = false})
end

local function row(rows, key)
  for _, r in ipairs(rows) do if r.key == key then return r end end
  error("no row " .. key)
end

describe("profiler roofline columns", function()
  after_each(function()
    if profiler.is_running() then profiler.stop():close() end
    profiler.set_peaks(nil)
  end)

  it("declares a matmul's 2·n·m·k FLOPs and the bytes of a, b and the result", function()
    local a, b = ember.randn(8, 16), ember.randn(16, 4)
    local p = profile(function() return a:matmul(b) end)
    local r = row(p:ops(), "matmul")
    assert.are.equal((8 * 16 + 16 * 4 + 8 * 4) * F32, r.bytes)
    assert.are.equal(2 * 8 * 4 * 16, r.flops)
    -- batched, b broadcast over the batch: b counted once
    local A = ember.randn(3, 8, 16)
    p = profile(function() return A:matmul(b) end)
    r = row(p:ops(), "matmul")
    assert.are.equal((3 * 8 * 16 + 16 * 4 + 3 * 8 * 4) * F32, r.bytes)
    assert.are.equal(2 * 3 * 8 * 4 * 16, r.flops)
  end)

  it("declares elementwise, reduction and norm costs from the shapes", function()
    local a, b = ember.randn(6, 5), ember.randn(5)
    local x, w = ember.randn(4, 8), ember.ones(8)
    local p = profile(function()
      local c = a + b                 -- b broadcast: read once
      local s = a:sum(1)
      local y = F.rmsnorm(x, w)
      return c, s, y
    end)
    local ops = p:ops()
    local add = row(ops, "add")
    assert.are.equal((30 + 5 + 30) * F32, add.bytes)
    assert.are.equal(30, add.flops)
    local sum = row(ops, "sum")
    assert.are.equal((30 + 6) * F32, sum.bytes)
    assert.are.equal(30, sum.flops)
    local rms = row(ops, "rmsnorm")   -- x, w read; y and rstd (one f32 per row) written
    assert.are.equal((32 + 8 + 32 + 4) * F32, rms.bytes)
    assert.are.equal(4 * 32, rms.flops)
  end)

  it("counts flash attention's FLOPs over the causal pairs only, forward and backward", function()
    local B, H, T, D = 1, 2, 4, 16
    local q = ember.randn(B, H, T, D):requires_grad_()
    local k = ember.randn(B, H, T, D):requires_grad_()
    local v = ember.randn(B, H, T, D):requires_grad_()
    local p = profile(function() F.flash_attention(q, k, v, true):sum():backward() end)
    local pairs = T * (T + 1) / 2      -- causal: row i sees i + 1 keys
    local qkvo = 4 * B * H * T * D * F32
    local lse = B * H * T * F32
    local fwd = row(p:ops{phase = "none"}, "flash_attention")
    assert.are.equal(4 * B * H * pairs * D, fwd.flops)
    assert.are.equal(qkvo + lse, fwd.bytes)
    local bwd = row(p:ops{phase = "backward"}, "flash_attention")
    assert.are.equal(10 * B * H * pairs * D, bwd.flops)   -- 2.5x: five matmuls, S recomputed
    assert.are.equal(2 * qkvo + lse, bwd.bytes)           -- + dO read, dq dk dv written
  end)

  it("gives backward ops their cost: a matmul's gradient is two matmuls", function()
    local a = ember.randn(8, 16):requires_grad_()
    local b = ember.randn(16, 4):requires_grad_()
    local c = ember.randn(8, 4)   -- a dense gradient (sum's alone is one broadcast element)
    local p = profile(function() (a:matmul(b) * c):sum():backward() end)
    local r = row(p:ops{phase = "backward"}, "matmul")
    assert.are.equal(3, r.calls)   -- the autograd node's own call (no cost of its own) and its two matmuls
    assert.are.equal(2 * (2 * 8 * 16 * 4), r.flops)   -- ga = g bᵀ (8x4 @ 4x16), gb = aᵀ g (16x8 @ 8x4)
    assert.are.equal(((8 * 4 + 4 * 16 + 8 * 16) + (16 * 8 + 8 * 4 + 16 * 4)) * F32, r.bytes)
  end)

  it("derives GB/s, TF/s and % of peak from the declared cost and the time", function()
    local a, b = ember.randn(64, 64), ember.randn(64, 64)
    local peaks = {gbs = 10, tflops = {f32 = 0.001, f64 = 0.001, tf32 = 0.001, bf16 = 0.001, f16 = 0.001}}
    local p = profile(function() for _ = 1, 3 do local _ = a:matmul(b) + a end end)
    for _, key in ipairs({"matmul", "add"}) do
      local r = row(p:ops{peaks = peaks}, key)
      assert.are.equal(r.roof_ms, r.cost_ms)              -- every call declared a cost
      assert.are.equal(r.self_ms, r.roof_ms)              -- host backend: the rates divide self time
      assert.is_near(r.bytes / (r.cost_ms * 1e-3) / 1e9, r.gbs, 1e-9 * r.gbs)
      assert.is_near(r.flops / (r.cost_ms * 1e-3) / 1e12, r.tflops, 1e-9 * r.tflops)
      -- the floor of each call: max(bytes / peak bandwidth, FLOPs / peak FLOP/s)
      local floor_s = math.max(r.bytes / 10e9, r.flops / 1e9)
      assert.is_near(100 * floor_s / (r.cost_ms * 1e-3), r.pct_peak, 1e-6 * r.pct_peak)
    end
    -- a 64³ matmul at 1 GFLOP/s peak and 10 GB/s: compute-bound; the add: memory-bound
    assert.are.equal("compute", row(p:ops{peaks = peaks}, "matmul").bound)
    assert.are.equal("memory", row(p:ops{peaks = peaks}, "add").bound)
    -- set_peaks applies to every profile; a bad one is refused
    profiler.set_peaks{gbs = 20, tflops = 0.002}
    local r = row(p:ops(), "add")
    assert.is_near(100 * (r.bytes / 20e9) / (r.cost_ms * 1e-3), r.pct_peak, 1e-6 * r.pct_peak)
    assert.has_error(function() profiler.set_peaks{tflops = 1} end,
      "ember.profiler.set_peaks: expected nil or {gbs = number, tflops = table or number}, got a table without gbs")
  end)

  it("prints the roofline columns, and % peak in the op table", function()
    local a, b = ember.randn(32, 32), ember.randn(32, 32)
    local p = profile(function() return a:matmul(b) end)
    local t = p:roofline_table{peaks = {gbs = 10, tflops = 1}}
    for _, h in ipairs({"Op", "Calls", "Time ms", "Costed", "Bytes", "FLOPs", "GB/s", "TF/s", "% peak", "Bound"}) do
      assert.truthy(t:find(h, 1, true), h .. " missing in\n" .. t)
    end
    assert.truthy(t:find("^Roofline by op"))
    assert.truthy(t:find("declared costs cover 100.0%", 1, true), t)
    assert.truthy(t:find("matmul%s+1%s"), t)
    assert.truthy(t:find("12.3k%s+65.5k"), t)   -- 3 x 32² x 4 bytes = 12288, 2 x 32³ FLOPs = 65536
    assert.truthy(p:op_table():find("% peak", 1, true))
    assert.truthy(p:roofline_table{by = "kernel"}:find("no per%-kernel times without CUPTI"))
    assert.has_error(function() p:roofline_table{by = "layer"} end,
      'ember.profile.roofline_table: expected by to be "op", "kernel" or "module", got layer')
  end)

  it("covers over 90% of the op time of a tiny LM's training step with declared costs", function()
    ember.manual_seed(0)
    local model = nn.TransformerLM(nn.configs.tiny{vocab_size = 64, context_length = 16})
    local opt = ember.optim.AdamW(model:parameters(), {lr = 1e-3})
    local data = ember.randint(0, 64, {2, 17})
    local x, y = data:narrow(1, 0, 16), data:narrow(1, 1, 16)
    local function step()
      opt:zero_grad()
      local loss = context.phase("forward", function() return F.cross_entropy(model(x), y) end)
      loss:backward()
      opt:step()
    end
    step()
    local p = profile(step)
    local pct, costed, total = p:cost_coverage()
    assert.truthy(pct > 90, ("coverage %.1f%% (%.3f of %.3f ms)"):format(pct, costed, total))
    for _, ph in ipairs({"forward", "backward", "optimizer"}) do
      local c = p:cost_coverage{phase = ph}
      assert.truthy(c > 90, ph .. (" coverage %.1f%%"):format(c))
    end
    -- the step's ops each carry a cost
    local ops = p:ops()
    for _, key in ipairs({"embedding", "rmsnorm", "linear", "rope_qk", "matmul", "scaled_softmax", "swiglu", "add",
                          "cross_entropy", "adamw_"}) do
      assert.truthy(row(ops, key).bytes > 0, key)
    end
  end)
end)

describe("roofline_table of a profile with graph replays", function()
  -- A replay leaves no host op records (only graph_replay's): the op rows must
  -- come from the replayed kernels' capture-time ops. The profile's handle is
  -- a stand-in that records the query (the C side's grouping of replayed
  -- kernels: tests/c/test_capture_cost.c; on a GPU: tests/gpu/profiler_spec.lua).
  local function fake_profile(graph_kernels_attributed)
    local asked = {}
    local handle = {group = function(_, q)
      asked[#asked + 1] = q
      return {{key = "matmul", calls = 4, total_ms = 1, roof_ms = 1, cost_ms = 1, bytes = 2e6, flops = 3e9,
               floor_ms = 0.5, bound = "compute"}}
    end}
    local p = setmetatable({_c = handle, backend = "cupti", label = "fake CUPTI profile",
                            _stats = {kernels = 4, graph_kernels = 4,
                                      graph_kernels_attributed = graph_kernels_attributed}}, profiler.Profile)
    return p, asked
  end
  local peaks = {gbs = 1000, tflops = 100}

  it("groups the kernels by their capture-time op when replays are attributed", function()
    local p, asked = fake_profile(4)
    assert.is_true(p:replayed())
    local t = p:roofline_table{by = "op", peaks = peaks}
    assert.are.equal("gpu", asked[1].source)
    assert.are.equal("op", asked[1].by)
    assert.truthy(t:find("graph replays: the ops of the capture", 1, true), t)
    assert.truthy(t:find("matmul", 1, true) and t:find(" 2M ", 1, true) and t:find(" 3G ", 1, true), t)
  end)

  it("keeps the host op rows when no replay is attributed", function()
    local p, asked = fake_profile(0)
    assert.is_false(p:replayed())
    p:roofline_table{by = "op", peaks = peaks}
    assert.are.equal("ops", asked[1].source)
  end)
end)
