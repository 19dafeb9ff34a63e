-- ember.profiler / ember.profile / ember.nvtx on the CPU: host timing per op,
-- module paths and phases in the tables, the Chrome trace, NVTX as a no-op,
-- and the errors. Every session asks for backend "host" so the figures mean
-- the same in a CUDA build. GPU behaviour: tests/gpu/profiler_spec.lua.
local ember = require "ember"
local cjson = require "cjson"
local nn, F, core = ember.nn, ember.nn.functional, ember.core
local profiler, nvtx, context = ember.profiler, ember.nvtx, ember.context

local function tiny_setup()
  ember.manual_seed(0)
  local model = nn.TransformerLM(nn.configs.tiny{vocab_size = 50, context_length = 8})
  local opt = ember.optim.AdamW(model:parameters(), {lr = 1e-3})
  local data = ember.randint(0, 50, {2, 9})
  local x, y = data:narrow(1, 0, 8), data:narrow(1, 1, 8)
  local function step()
    opt:zero_grad()
    local loss = context.phase("forward", function() return F.cross_entropy(model(x), y) end)
    loss:backward()
    opt:step()
    return loss
  end
  return step
end

-- One profiled training step of the tiny LM, shared by the read-only tests.
local step = tiny_setup()
step()                                   -- warm-up: first calls pay one-off costs
local P = ember.profile(function() nvtx.range("step 1", step) end, {backend = "host", print = false})

local function row(rows, key)
  for _, r in ipairs(rows) do if r.key == key then return r end end
end

local function tmpname(suffix)
  local n = os.tmpname()
  os.remove(n)
  return n .. suffix
end

describe("ember.profiler on the CPU", function()
  after_each(function()
    if profiler.is_running() then profiler.stop():close() end
  end)

  it("labels a host-only profile and keeps no kernel rows", function()
    assert.are.equal("host", P.backend)
    assert.truthy(P.label:find("^host timing per op only"))
    assert.are.same({}, P:kernels())
    assert.truthy(P:kernel_table():find("no per%-kernel times without CUPTI"))
  end)

  it("times every op on the host, self time within total", function()
    local ops = P:ops()
    assert.truthy(#ops >= 10)
    for _, r in ipairs(ops) do
      assert.truthy(r.calls >= 1, r.key)
      assert.truthy(r.total_ms >= r.self_ms - 1e-9, r.key)
      assert.truthy(r.self_ms >= 0, r.key)
      assert.is_nil(r.kernels)             -- unknown without CUPTI
      assert.is_nil(r.device_ms)
    end
    local s = P:stats()
    assert.truthy(s.top_op_ms <= s.wall_ms)
    local self_sum = 0
    for _, r in ipairs(ops) do self_sum = self_sum + r.self_ms end
    assert.truthy(math.abs(self_sum - s.top_op_ms) < 1e-3 * math.max(1, s.top_op_ms), "self times add up to top-level time")
  end)

  it("sees the ops of forward, backward and optimizer in their phases", function()
    local ops = P:ops()
    local mm = row(ops, "matmul") or row(ops, "linear")
    assert.truthy(mm, "a matmul-type op")
    assert.truthy(mm.forward_calls > 0)
    assert.truthy(mm.backward_calls > 0)
    assert.truthy(row(ops, "rmsnorm").forward_calls > 0)
    assert.truthy(row(ops, "cross_entropy").forward_calls > 0)
    local adamw = row(ops, "adamw_")
    assert.truthy(adamw and adamw.optimizer_calls == adamw.calls)
    local s = P:stats()
    assert.are.equal(1, s.phases.forward.count)
    assert.are.equal(1, s.phases.backward.count)
    assert.are.equal(1, s.phases.optimizer.count)
    assert.are.equal(1, s.steps)
  end)

  it("counts nested ops once: attention's self time excludes its matmuls", function()
    local attn = row(P:ops(), "scaled_dot_product_attention")
    assert.truthy(attn)
    assert.truthy(attn.total_ms > attn.self_ms)
  end)

  it("attributes ops to module paths, rolled up by depth", function()
    local by_module = P:ops{by = "module"}
    assert.truthy(row(by_module, "layers.0.attn.q_proj"))
    assert.truthy(row(by_module, "layers.1.ffn.w2"))
    assert.truthy(row(by_module, ""), "optimizer and loss ops at the top level")
    local d2 = P:ops{by = "module", depth = 2}
    assert.truthy(row(d2, "layers.0") and row(d2, "layers.1"))
    assert.is_nil(row(d2, "layers.0.attn"))
    local rolled = P:ops{by = "module", depth = 3, rollup = true}
    local attn = row(rolled, "layers.*.attn")
    assert.truthy(attn)
    local a0, a1 = 0, 0
    for _, r in ipairs(P:ops{by = "module", module = "layers.0.attn*"}) do a0 = a0 + r.self_ms end
    for _, r in ipairs(P:ops{by = "module", module = "layers.1.attn*"}) do a1 = a1 + r.self_ms end
    assert.truthy(math.abs(attn.self_ms - (a0 + a1)) < 1e-6)
    local t = P:module_table{depth = 2, rollup = true}
    assert.truthy(t:find("layers%.%*"))
    assert.truthy(t:find("%(top level%)"))
    assert.truthy(t:find("Forward ms") and t:find("Backward ms") and t:find("Optimizer ms"))
  end)

  it("filters op rows by phase and module pattern", function()
    for _, r in ipairs(P:ops{phase = "optimizer"}) do assert.are.equal(r.calls, r.optimizer_calls) end
    local fwd_attn = P:ops{phase = "forward", module = "*.attn*"}
    assert.truthy(row(fwd_attn, "rope_qk"))
    assert.is_nil(row(fwd_attn, "adamw_"))
  end)

  it("prints an op table, a summary and everything", function()
    local t = P:op_table{top = 5}
    assert.truthy(t:find("^Ops: host timing per op only"))
    assert.truthy(t:find("Self ms"))
    local s = P:summary()
    assert.truthy(s:find("host time per op"))
    assert.truthy(s:find("forward%s+1 interval"))
    local out = {}
    local real = print
    _G.print = function(...) out[#out + 1] = table.concat({...}, "\t") end
    local ok, err = pcall(P.print, P)
    _G.print = real
    assert.is_true(ok, err)
    assert.truthy(table.concat(out, "\n"):find("Modules"))
  end)

  it("writes a Chrome trace that parses, with op, phase and range events", function()
    local path = tmpname(".json")
    local bytes = P:export_chrome_trace(path)
    local f = assert(io.open(path))
    local text = f:read("a")
    f:close()
    os.remove(path)
    assert.are.equal(#text, bytes)
    local doc = cjson.decode(text)
    assert.are.equal("ember", doc.otherData.tool)
    local ops, phases, ranges, meta = 0, {}, {}, 0
    local q_proj
    for _, e in ipairs(doc.traceEvents) do
      assert.truthy(e.ph and e.pid and e.tid and e.name)
      if e.ph == "M" then meta = meta + 1
      elseif e.tid == 100 then phases[e.name] = true
      elseif e.tid == 200 then ranges[e.name] = true
      elseif e.ph == "X" then
        ops = ops + 1
        assert.truthy(e.ts >= 0 and e.dur >= 0)
        if e.args and e.args.m == "layers.0.attn.q_proj" and e.args.p == "forward" then q_proj = e end
      end
    end
    assert.are.equal(P:stats().ops, ops)
    assert.truthy(phases.forward and phases.backward and phases.optimizer)
    assert.truthy(ranges["step 1"])
    assert.truthy(q_proj and (q_proj.name == "linear" or q_proj.name == "matmul" or q_proj.name == "copy_"))
    assert.truthy(meta >= 3)
    -- compact: well under 200 bytes per event (docs/profiling.md quotes the figure)
    assert.truthy(bytes / #doc.traceEvents < 200, ("%.0f bytes per event"):format(bytes / #doc.traceEvents))
  end)

  it("writes JSON with the stats and the rows", function()
    local doc = cjson.decode(P:to_json())
    assert.are.equal("host", doc.backend)
    assert.truthy(#doc.ops >= 10)
    assert.are.equal(1, doc.stats.phases.backward.count)
  end)

  it("counts marked steps, user ranges and marks", function()
    local p = ember.profile(function()
      for i = 1, 3 do
        nvtx.range("step " .. i, function() ember.randn(4):add(1) end)
        profiler.step()
      end
      nvtx.mark("done")
    end, {backend = "host", print = false})
    local s = p:stats()
    assert.are.equal(3, s.steps)
    assert.truthy(s.steps_how:find("marked"))
    assert.are.equal(3, s.ranges)
    assert.are.equal(1, s.marks)
    p:close()
  end)

  it("returns fn's results after the profile, and re-raises fn's error with the profiler stopped", function()
    local p, a, b = ember.profile(function() return 1, "two" end, {backend = "host", print = false})
    assert.are.equal(1, a)
    assert.are.equal("two", b)
    assert.are.equal("host", p.backend)
    assert.has_error(function()
      ember.profile(function() error("boom", 0) end, {backend = "host", print = false})
    end, "boom")
    assert.is_false(profiler.is_running())
    assert.is_false(context.enabled)
  end)

  it("leaves module tracking as it found it", function()
    assert.is_false(context.enabled)
    profiler.start{backend = "host"}
    assert.is_true(context.enabled)
    profiler.stop():close()
    assert.is_false(context.enabled)
    profiler.start{backend = "host", modules = false}
    assert.is_false(context.enabled)
    profiler.stop():close()
  end)

  it("raises clear errors", function()
    profiler.start{backend = "host"}
    assert.has_error(function() profiler.start() end,
      "ember.profiler.start: a profile is already running (call ember.profiler.stop() first)")
    profiler.stop():close()
    assert.has_error(function() profiler.stop() end,
      "ember.profiler.stop: no profile is running (call ember.profiler.start() first)")
    assert.has_error(function() ember.profile(42) end, "ember.profile: expected a function, got number")
    assert.has_error(function() profiler.start{backend = "nsight"} end,
      'ember.profiler.start: unknown backend "nsight" (expected "auto", "cupti", "events" or "host")')
    assert.has_error(function() profiler.start("host") end,
      "ember.profiler.start: expected an options table or nil, got string")
    assert.has_error(function() P:kernel_table{phase = "sideways"} end,
      'ember.profile.kernel_table: expected phase to be "forward", "backward", "optimizer" or "none", got sideways')
    assert.has_error(function() P:op_table{top = 0} end,
      "ember.profile.op_table: expected top to be a positive integer, got 0")
    assert.has_error(function() P:group{by = "colour"} end,
      'ember.profile: expected option \'by\' to be "name", "op", "module" or "phase", got "colour"')
    assert.has_error(function() P:export_chrome_trace() end,
      "ember.profile.export_chrome_trace: expected a path string, got nil")
    local ok, err = pcall(P.export_chrome_trace, P, "/nonexistent-dir/trace.json")
    assert.is_false(ok)
    assert.truthy(tostring(err):find("^ember%.export_chrome_trace: cannot create"))
    if not ember.cuda.is_available() then
      assert.has_error(function() profiler.start{backend = "cupti"} end)
      assert.is_false(profiler.is_running())
    end
    local p = ember.profile(function() end, {backend = "host", print = false})
    p:close()
    assert.has_error(function() p:ops() end, "ember.profile: this profile was closed")
  end)
end)

describe("ember.nvtx", function()
  it("exists everywhere and says whether it emits", function()
    assert.are.equal(ember.cuda.is_compiled(), nvtx.available())
    if not nvtx.available() then
      assert.is_false(nvtx.enable(true))
      assert.is_false(nvtx.enabled())
      assert.is_false(context.enabled)   -- a no-op enable takes no tracking
    end
    nvtx.enable(false)
  end)

  it("runs fn inside a range and returns its results; pops on error", function()
    local a, b = nvtx.range("r", function(x, y) return x + 1, y end, 1, "y")
    assert.are.equal(2, a)
    assert.are.equal("y", b)
    assert.has_error(function() nvtx.range("r", function() error("inside", 0) end) end, "inside")
    nvtx.push("manual")
    nvtx.mark("here")
    nvtx.pop()
  end)

  it("checks its arguments", function()
    assert.has_error(function() nvtx.range(nil, print) end,
      "ember.nvtx.range: expected argument 1 (name) to be a string, got nil")
    assert.has_error(function() nvtx.range("r", 3) end,
      "ember.nvtx.range: expected argument 2 (fn) to be a function, got number")
    assert.has_error(function() nvtx.push(7) end, "ember.nvtx.push: expected argument 1 (name) to be a string, got number")
    assert.has_error(function() nvtx.mark() end, "ember.nvtx.mark: expected argument 1 (name) to be a string, got nil")
  end)
end)

describe("EMBER_PROFILER_BACKEND", function()
  local EMBER = (os.getenv("EMBER_BUILD") or "./build") .. "/ember"
  it("overrides auto, and a bad value is an error naming it", function()
    local pipe = io.popen("EMBER_PROFILER_BACKEND=host " .. EMBER ..
      [[ -e 'ember.profiler.start() print(ember.profiler.stop().backend)' 2>&1]])
    local out = pipe:read("a")
    pipe:close()
    assert.are.equal("host\n", out)
    pipe = io.popen("EMBER_PROFILER_BACKEND=bogus " .. EMBER .. [[ -e 'ember.profiler.start()' 2>&1]])
    out = pipe:read("a")
    pipe:close()
    assert.truthy(out:find('EMBER_PROFILER_BACKEND="bogus"', 1, true), out)
  end)
end)
