-- mem_peak_spec.lua — scripts/lib/mem_peak.lua (what is alive at a recorded
-- peak, grouped by where it was allocated) on hand-written traces, on a real
-- CPU training step's history, and scripts/memory_step.lua end to end on the
-- CPU (the eager step; the capture is CUDA-only: tests/gpu/memory_spec.lua).
local ember = require "ember"
local U = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local P = dofile("scripts/lib/mem_peak.lua")

local function ev(action, addr, size, o)
  o = o or {}
  return {action = action, device = o.device or "cuda:0", addr = addr, size = size, phase = o.phase or "forward",
          category = o.category or "activation", op = o.op or "", module = o.module or "", callsite = ""}
end

local function group(a, key)
  for _, g in ipairs(a.groups) do if g.key == key then return g end end
end

describe("mem_peak.analyse", function()
  it("finds the peak event and groups the blocks alive there by phase / category / op", function()
    local trace = {
      ev("tag", 1, 100, {category = "parameter", phase = "none"}),
      ev("alloc", 10, 40, {op = "linear"}),
      ev("alloc", 11, 30, {op = "linear"}),
      ev("alloc", 12, 8, {op = "silu"}),
      ev("free", 12, 8),                                          -- gone before the peak
      ev("alloc", 13, 50, {phase = "backward", category = "autograd", op = "linear"}),   -- the peak: 120
      ev("free", 10, 40),
      ev("alloc", 14, 35, {phase = "backward", category = "autograd", op = "linear"}),   -- 115: lower
      ev("alloc", 15, 1000, {device = "cpu"}),                    -- another device: ignored
    }
    local a = P.analyse({trace = trace}, {device = "cuda:0", baseline = 150})
    assert.are.equal(6, a.peak_event)
    assert.are.equal(120, a.rise)
    assert.are.equal(270, a.peak)
    assert.are.equal(8, a.events)
    assert.are.equal(70, group(a, "forward activation linear").bytes)
    assert.are.equal(2, group(a, "forward activation linear").count)
    assert.are.equal(50, group(a, "backward autograd linear").bytes)
    assert.is_nil(group(a, "forward activation silu"), "freed before the peak")
    assert.are.equal(100, group(a, "(before) parameter").bytes)
    assert.are.equal(50, group(a, "(before) untagged").bytes)    -- 150 at the start, 100 of it tagged
    local sum = 0
    for _, g in ipairs(a.groups) do sum = sum + g.bytes end
    assert.are.equal(a.peak, sum, "the groups add up to the peak")
    for i = 2, #a.groups do assert.is_true(a.groups[i - 1].bytes >= a.groups[i].bytes, "largest first") end
  end)

  it("counts a pre-existing block freed before the peak out of the start, and follows retags", function()
    local trace = {
      ev("tag", 1, 64, {category = "gradient", phase = "none"}),
      ev("free", 1, 64),                                           -- zero_grad: the old gradient
      ev("alloc", 2, 16, {phase = "backward", category = "autograd", op = "linear"}),
      ev("tag", 2, 16, {category = "gradient", phase = "backward"}),   -- it became a .grad
      ev("alloc", 3, 80, {phase = "optimizer", category = "optimizer_state", op = "zeros_like"}),
    }
    local a = P.analyse({trace = trace}, {baseline = 64 + 32})
    assert.are.equal("cuda:0", a.device, "the first device allocated on")
    assert.are.equal(5, a.peak_event)
    assert.are.equal(32, a.rise)
    assert.are.equal(128, a.peak)
    assert.is_nil(group(a, "(before) gradient"))
    assert.are.equal(32, group(a, "(before) untagged").bytes)
    assert.are.equal(16, group(a, "backward gradient linear").bytes)
    assert.are.equal(80, group(a, "optimizer optimizer_state zeros_like").bytes)
    -- a trace that never rises above its start peaks at the start: everything there is "(before)"
    local b = P.analyse({trace = {trace[1], trace[2], trace[3]}}, {baseline = 96})
    assert.are.equal(0, b.peak_event)
    assert.are.equal(96, b.peak)
    assert.are.equal(64, group(b, "(before) gradient").bytes)
    assert.are.equal(32, group(b, "(before) untagged").bytes)
    assert.matches("at the start of recording", P.report(b))
  end)

  it("folds layer numbers of module paths when grouping by module", function()
    local trace = {
      ev("alloc", 1, 10, {module = "layers.0.ffn.w1"}),
      ev("alloc", 2, 10, {module = "layers.11.ffn.w1"}),
      ev("alloc", 3, 5, {module = "layers.3"}),
      ev("alloc", 4, 1, {module = "lm_head"}),
    }
    local a = P.analyse({trace = trace}, {by = "phase,module"})
    assert.are.equal(20, group(a, "forward layers.*.ffn.w1").bytes)
    assert.are.equal(5, group(a, "forward layers.*").bytes)
    assert.are.equal(1, group(a, "forward lm_head").bytes)
  end)

  it("names bad input", function()
    local ok, err = pcall(P.analyse, {trace = {}}, {by = "phase,colour"})
    assert.is_false(ok)
    assert.matches("unknown key 'colour' in `by` %(expected phase, category, op, module, callsite%)", err)
    ok, err = pcall(P.analyse, "x")
    assert.is_false(ok)
    assert.matches("expected a snapshot table", err)
  end)

  it("diff lists the groups that differ most, with signs", function()
    local a = P.analyse({trace = {ev("alloc", 1, 10, {op = "linear"}), ev("alloc", 2, 5, {op = "silu"})}})
    local b = P.analyse({trace = {ev("alloc", 1, 40, {op = "linear"}), ev("alloc", 3, 2, {op = "rope"})}})
    local rows = P.diff(a, b)
    assert.are.same({key = "forward activation linear", a = 10, b = 40, delta = 30}, rows[1])
    assert.are.same({key = "forward activation silu", a = 5, b = 0, delta = -5}, rows[2])
    assert.are.same({key = "forward activation rope", a = 0, b = 2, delta = 2}, rows[3])
    assert.matches("capture's peak differs from eager's", P.diff_report(a, b, "eager", "capture"))
  end)
end)

describe("mem_peak on a recorded CPU training step", function()
  U.fresh_memory_history(before_each, after_each)

  it("the peak is the largest running sum of the trace, and the step's activations are alive at it", function()
    local nn, F = ember.nn, ember.nn.functional
    ember.manual_seed(3)
    local m = nn.TransformerLM(nn.configs.tiny{vocab_size = 50, context_length = 8})
    local opt = ember.optim.AdamW(m:parameters())
    local x = ember.randint(0, 50, {2, 9})
    local function step()
      m:zero_grad()
      local loss = ember.context.phase("forward", function() return F.cross_entropy(m(x:narrow(1, 0, 8)),
        x:narrow(1, 1, 8)) end)
      ember.context.phase("backward", loss.backward, loss)
      opt:step()
    end
    step()
    ember.memory.record_history(true)
    step()
    local snap = ember.memory.snapshot()
    ember.memory.record_history(false)
    local a = P.analyse(snap, {device = "cpu"})
    local cur, best = 0, 0
    for _, e in ipairs(snap.trace) do
      if e.device == "cpu" and e.action == "alloc" then cur = cur + e.size; best = math.max(best, cur)
      elseif e.device == "cpu" and e.action == "free" then cur = cur - e.size end
    end
    assert.is_true(best > 0)
    assert.are.equal(best, a.rise)
    assert.are.equal("alloc", a.at.action)
    local fwd = 0
    for _, g in ipairs(a.groups) do if g.key:match("^forward ") then fwd = fwd + g.bytes end end
    assert.is_true(fwd > 0, "forward allocations alive at the peak")
    assert.is_not_nil(group(a, "(before) parameter"), "the parameters, tagged when recording started")
    assert.is_not_nil(group(a, "(before) optimizer_state"), "AdamW's moments")
  end)
end)

describe("scripts/memory_step.lua on the CPU", function()
  it("prints the eager step's peak and the groups alive at it", function()
    local out, err, status = U.ember({"run", "scripts/memory_step.lua", "--device", "cpu", "--model", "tiny",
      "--vocab", "64", "--context", "16", "--batch", "2", "--precision", "fp32", "--warmup", "1", "--top", "5"})
    assert.are.equal("", err)
    assert.are.equal(0, status)
    assert.matches("eager: peak %d+%.%d+ MiB above the start on cpu %(no baseline: blocks from before are " ..
      "listed when tagged%), event %d+ of %d+", out)
    assert.matches("alive at the peak, by phase / category / op", out)
    assert.matches("%(before%) parameter", out)
    assert.not_matches("capture:", out)
  end)

  it("names a bad --by and --keep-grads without --overlap-optimizer", function()
    local _, err, status = U.ember({"run", "scripts/memory_step.lua", "--device", "cpu", "--model", "tiny",
      "--by", "phase,size"})
    assert.are_not.equal(0, status)
    assert.matches("unknown key 'size' in `by`", err)
    _, err, status = U.ember({"run", "scripts/memory_step.lua", "--device", "cpu", "--keep-grads"})
    assert.are_not.equal(0, status)
    assert.matches("%-%-keep%-grads needs %-%-overlap%-optimizer", err)
  end)
end)
