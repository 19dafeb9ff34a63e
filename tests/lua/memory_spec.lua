-- memory_spec.lua — ember.memory on the CPU: the history of storage
-- allocations and frees with op, module path, phase, category and call site;
-- drops at max_entries; JSON and pickle snapshots (the pickle is read back by
-- python3 and replayed as PyTorch's memory_viz does, tests/lua/memory_check.py);
-- argument errors; scripts/memviz.lua on a real and on a 1M-event snapshot.
local ember = require "ember"
local cjson = require "cjson"
local memory = ember.memory
local nn, optim, F = ember.nn, ember.optim, ember.nn.functional

local BUILD = os.getenv("EMBER_BUILD") or "./build"
local SPEC = debug.getinfo(1, "S").source:match("^@(.*)$")

local function here() return debug.getinfo(2, "l").currentline end
local function site(line) return SPEC .. ":" .. line end

local U = dofile((SPEC:match("^(.*/)") or "./") .. "helpers.lua")
local temp, slurp, q, sh, find = U.temp, U.slurp, U.q, U.sh, U.find

local function tiny_lm()
  return nn.TransformerLM(nn.configs.tiny{vocab_size = 50, context_length = 8})
end

local function batch()
  local x = ember.randint(0, 50, {2, 9})
  return x:narrow(1, 0, 8), x:narrow(1, 1, 8)
end

-- the block of the snapshot at a tensor's storage address
local function block_at(snap, t)
  for _, b in ipairs(snap.blocks) do if b.address == t:data_ptr() then return b end end
end

describe("ember.memory", function()
  U.fresh_memory_history(before_each, after_each)

  it("records the allocations and frees of a small computation with their ops and call site", function()
    memory.record_history(true)
    local a = ember.randn(8, 8)
    local c = a:matmul(a) local line = here()
    local d = c:add(1) local line2 = here()
    local addr = c:data_ptr()
    c = nil
    collectgarbage() local free_line = here()
    local trace = memory.snapshot().trace
    local mm = find(trace, {action = "alloc", op = "matmul"})
    assert.are.equal(1, #mm)
    assert.are.equal(256, mm[1].size)
    assert.are.equal(256, mm[1].requested_size)
    assert.are.equal("cpu", mm[1].device)
    assert.are.equal(site(line), mm[1].callsite)
    assert.are.equal("other", mm[1].category)
    assert.are.equal("none", mm[1].phase)
    local add = find(trace, {action = "alloc", op = "add"})
    assert.are.equal(1, #add)
    assert.are.equal(site(line2), add[1].callsite)
    assert.is_true(add[1].time_ns >= mm[1].time_ns)
    local freed = find(trace, {action = "free", addr = addr})
    assert.are.equal(1, #freed)
    assert.are.equal(site(free_line), freed[1].callsite)
    assert.is_not_nil(d)
  end)

  it("names module paths and phases through a training step", function()
    local model = tiny_lm()
    local opt = optim.AdamW(model:parameters(), {lr = 1e-2})
    local inputs, targets = batch()
    memory.record_history(true)
    local loss = F.cross_entropy(model(inputs), targets) local fwd_line = here()
    opt:zero_grad()
    loss:backward() local bwd_line = here()
    opt:step() local opt_line = here()
    local trace = memory.snapshot().trace
    local q_proj = find(trace, {action = "alloc", module = "layers.0.attn.q_proj", phase = "forward"})
    assert.is_true(#q_proj >= 1)
    assert.are.equal("linear", q_proj[1].op)
    assert.are.equal("activation", q_proj[1].category)
    assert.are.equal(site(fwd_line), q_proj[1].callsite)
    local bwd = find(trace, {action = "alloc", phase = "backward"})
    assert.is_true(#bwd > 10)
    for _, e in ipairs(bwd) do assert.are.equal(site(bwd_line), e.callsite) end
    assert.is_true(#find(trace, {action = "alloc", phase = "backward", module = "layers.1.ffn.w2"}) >= 1)
    local opt_allocs = find(trace, {action = "alloc", phase = "optimizer"})
    assert.are.equal(2 * #model:parameters(), #opt_allocs)   -- exp_avg and exp_avg_sq
    for _, e in ipairs(opt_allocs) do
      assert.are.equal("optimizer_state", e.category)
      assert.are.equal(site(opt_line), e.callsite)
    end
  end)

  it("tags parameters, gradients and optimizer state, also when made before recording", function()
    local model = tiny_lm()
    local opt = optim.AdamW(model:parameters(), {lr = 1e-2})
    local inputs, targets = batch()
    F.cross_entropy(model(inputs), targets):backward()
    opt:step()                                             -- state and grads exist before recording
    memory.record_history(true)
    local snap = memory.snapshot()
    local p = model.layers[1].attn.q_proj.weight
    local b = block_at(snap, p)
    assert.is_not_nil(b)
    assert.are.equal("parameter", b.category)
    assert.are.equal("tag", b.history[1].action)          -- known from its tag at the start
    assert.are.equal("gradient", block_at(snap, p.grad).category)
    assert.are.equal("optimizer_state", block_at(snap, opt.state[p].exp_avg).category)
    -- a step while recording: new gradients are tagged as they become .grad
    opt:zero_grad()
    F.cross_entropy(model(inputs), targets):backward()
    opt:step()
    snap = memory.snapshot()
    local g = block_at(snap, p.grad)
    assert.are.equal("gradient", g.category)
    assert.are.equal("alloc", g.history[1].action)
    assert.are.equal("backward", g.history[1].phase)
    assert.are.equal("tag", g.history[2].action)
    assert.are.equal("gradient", g.history[2].category)
    -- zero_grad freed the old gradients (but the one block_at read above: a Lua handle keeps it)
    assert.is_true(#find(snap.trace, {action = "free", category = "gradient"}) >= #model:parameters() - 1)
    -- parameters made while recording are tagged when registered
    local lin = nn.Linear(4, 3)
    assert.are.equal("parameter", block_at(memory.snapshot(), lin.weight).category)
  end)

  it("tags AdamW's shadow weights (the bf16 copies its step writes) as optimizer_state when recording starts",
    function()
    local model = tiny_lm()
    local opt = optim.AdamW(model:parameters(), {lr = 1e-2})
    local inputs, targets = batch()
    ember.autocast("bf16", function() return F.cross_entropy(model(inputs), targets) end):backward()
    opt:step()                                             -- writes the shadows of the cast weights
    local w = model.layers[1].ffn.w1.weight
    assert.is_not_nil(ember.core.shadow_weight(w), "w1 has a shadow")
    memory.record_history(true)
    local snap = memory.snapshot()
    local tags = {}
    for _, e in ipairs(snap.trace) do
      if e.action == "tag" and e.category == "optimizer_state" and e.size >= w:numel() * 2 and
        e.size < w:numel() * 4 then tags[#tags + 1] = e end
    end
    -- the FFN's three weights a layer have one each (bf16: 2 bytes an element, the moments 4)
    local cfg = nn.configs.tiny{}
    assert.is_true(#tags >= cfg.num_layers * 3, "bf16-sized optimizer_state tags: " .. #tags)
  end)

  it("scopes a category and tags a tensor on request", function()
    memory.record_history(true)
    local t = memory.category("communication", ember.zeros, 16)
    local u = ember.zeros(32)
    memory.tag(u, "workspace")
    local snap = memory.snapshot()
    assert.are.equal("communication", block_at(snap, t).category)
    assert.are.equal("workspace", block_at(snap, u).category)
    assert.are.equal(1, #find(snap.trace, {action = "tag", category = "workspace", addr = u:data_ptr()}))
    assert.has_error(function() memory.category("workspace", error, "boom") end, "boom")
    local v = ember.zeros(8)                              -- the override was restored after the error
    assert.are.equal("other", block_at(memory.snapshot(), v).category)
  end)

  it("gives code in coroutines its own call sites", function()
    memory.record_history(true)
    local line1, line2
    local co = coroutine.create(function()
      local t = ember.zeros(5, 7) line1 = here()
      coroutine.yield(t)
    end)
    local _, t1 = coroutine.resume(co)
    local t2 = coroutine.wrap(function() local t = ember.zeros(3, 11) line2 = here() return t end)()
    local trace = memory.snapshot().trace
    assert.are.equal(site(line1), find(trace, {action = "alloc", addr = t1:data_ptr()})[1].callsite)
    assert.are.equal(site(line2), find(trace, {action = "alloc", addr = t2:data_ptr()})[1].callsite)
  end)

  it("keeps caller frames with stack_depth", function()
    memory.record_history(true, {stack_depth = 2})
    local function make() return ember.zeros(9) end
    local t = make() local call_line = here()
    local e = find(memory.snapshot().trace, {action = "alloc", addr = t:data_ptr()})[1]
    local first, second = e.callsite:match("^([^\n]+)\n([^\n]+)")
    assert.truthy(first and first:find(SPEC, 1, true), e.callsite)
    assert.are.equal(site(call_line), second:match("^(.-) in ") or second)
  end)

  it("drops the oldest events beyond max_entries and counts them", function()
    memory.record_history(true, {max_entries = 16})
    local keep = {}
    for i = 1, 20 do keep[i] = ember.zeros(i) end
    local last = keep[20]:data_ptr()
    local st = memory.stats("cpu").history
    assert.are.equal(16, st.entries)
    assert.is_true(st.dropped >= 4)
    assert.are.equal(st.entries + st.dropped, st.recorded)
    local snap = memory.snapshot()
    assert.are.equal(16, #snap.trace)
    assert.are.equal(last, snap.trace[#snap.trace].addr)
    assert.are.equal(st.dropped, snap.history.dropped)
  end)

  it("stops recording with record_history(false) and keeps the history for snapshots", function()
    memory.record_history(true)
    local a = ember.zeros(10)
    memory.record_history(false)
    local b = ember.zeros(12)
    assert.is_false(memory.is_recording())
    local snap = memory.snapshot()
    assert.are.equal(1, #find(snap.trace, {action = "alloc", addr = a:data_ptr()}))
    assert.are.equal(0, #find(snap.trace, {action = "alloc", addr = b:data_ptr()}))
    assert.is_true(snap.history.stopped)
    memory.record_history(true)                           -- a restart begins a fresh history
    assert.are.equal(0, #find(memory.snapshot().trace, {addr = a:data_ptr()}))
  end)

  it("tracks module paths while recording and releases them after", function()
    local context = require "ember.context"
    assert.is_false(context.enabled)
    memory.record_history(true)
    assert.is_true(context.enabled)
    memory.record_history(true, {max_entries = 100})      -- options change; still one holder
    memory.record_history(false)
    assert.is_false(context.enabled)
    memory.record_history(true, {track_modules = false})
    assert.is_false(context.enabled)
  end)

  it("reports allocator statistics", function()
    memory.record_history(true)
    local t = ember.zeros(100)
    local s = memory.stats("cpu")
    assert.are.equal("cpu", s.device)
    assert.is_true(s.history.recording)
    assert.is_true(s.history.live_blocks >= 1 and s.history.live_bytes >= 448)
    assert.are.equal(1000000, s.history.max_entries)
    assert.is_not_nil(t)
  end)

  it("writes a JSON snapshot with segments, live blocks and the trace as rows", function()
    memory.record_history(true)
    local t = ember.ones(4, 4) local line = here()
    local path = memory.snapshot(temp(".json"))
    local doc = cjson.decode(slurp(path))
    assert.are.equal("ember.memory_snapshot", doc.format)
    assert.are.equal(1, doc.version)
    assert.are.same({"time_ns", "action", "device", "addr", "size", "requested_size", "stream", "category",
      "phase", "op", "module", "callsite"}, doc.fields)
    assert.are.equal("", doc.strings[1])
    assert.are.equal(doc.history.entries, #doc.trace)
    assert.are.equal("table", type(doc.segments))
    local found
    for _, row in ipairs(doc.trace) do
      assert.are.equal(12, #row)
      if row[4] == t:data_ptr() and row[2] == "alloc" then found = row end
    end
    assert.is_not_nil(found)
    assert.are.equal(64, found[6])
    assert.are.equal(site(line), doc.strings[found[12] + 1])
    local blk
    for _, b in ipairs(doc.blocks) do if b.address == t:data_ptr() then blk = b end end
    assert.are.equal("cpu", blk.device)
    assert.are.equal("other", blk.category)
    assert.are.equal(site(line), blk.history[1].callsite)
    assert.are.equal(path, memory.snapshot(temp(".dat"), {format = "json"}) and path)
  end)

  it("writes a pickle that python3 loads and that replays as memory_viz does", function()
    if not os.execute("python3 -c 'import pickle' >/dev/null 2>&1") then
      print("memory_spec: python3 not found, the pickle round trip is skipped")
      pending("python3 not found")
      return
    end
    local model = tiny_lm()
    local opt = optim.AdamW(model:parameters(), {lr = 1e-2})
    local inputs, targets = batch()
    memory.record_history(true)
    local line
    for _ = 1, 2 do
      opt:zero_grad()
      F.cross_entropy(model(inputs), targets):backward() line = here()
      opt:step()
    end
    collectgarbage()
    local path = memory.snapshot(temp(".pickle"))
    local out, ok = sh("python3 tests/lua/memory_check.py " .. q(path))
    assert.is_true(ok, out)
    local r = cjson.decode(out)
    assert.are.same({"cpu"}, r.devices)
    assert.is_true(r.actions.alloc > 50 and r.actions.segment_alloc == r.actions.alloc)
    assert.are.equal(r.actions.free_requested, r.actions.free_completed)
    assert.are.equal(1, r.actions.snapshot)
    local set = function(list) local t = {} for _, v in ipairs(list) do t[v] = true end return t end
    local cats, files, names, modules = set(r.categories), set(r.files), set(r.names), set(r.modules)
    for _, c in ipairs({"parameter", "gradient", "activation", "autograd", "optimizer_state", "unknown"}) do
      assert.is_true(cats[c], c)
    end
    assert.is_true(files[SPEC:match("[^/]+$") .. ":" .. line])
    assert.is_true(names["linear [activation, forward, layers.0.attn.q_proj]"])
    assert.is_true(modules["layers.1.ffn.w2"])
    assert.is_true(r.segments > 0)                        -- the live CPU storages
  end)

  it("is reachable as ember.cuda.memory_snapshot and record_memory_history", function()
    ember.cuda.record_memory_history(true)
    local t = ember.zeros(3)
    local snap = ember.cuda.memory_snapshot()
    assert.are.equal(1, #find(snap.trace, {action = "alloc", addr = t:data_ptr()}))
    ember.cuda.record_memory_history(false)
  end)

  describe("rejects bad arguments", function()
    local cases = {
      {function() memory.snapshot(42) end, "ember.memory.snapshot: expected a path string or nil, got number"},
      {function() memory.snapshot("x.txt") end, "ember.memory.snapshot: cannot tell the format of \"x.txt\""},
      {function() memory.snapshot("x.json", {format = "csv"}) end, "expected format \"json\" or \"pickle\", got csv"},
      {function() memory.snapshot("x.json", 3) end, "ember.memory.snapshot: expected an options table or nil, got number"},
      {function() memory.snapshot("/nonexistent-dir/x.json") end, "ember.memory.snapshot: cannot create"},
      {function() memory.record_history("yes") end, "ember.memory.record_history: expected true or false, got string"},
      {function() memory.record_history(true, {max_entries = 0}) end,
       "ember.memory.record_history: expected max_entries to be an integer in [1, inf], got 0"},
      {function() memory.record_history(true, {stack_depth = 40}) end, "expected stack_depth to be an integer in [0, 32], got 40"},
      {function() memory.record_history(true, {max_entry = 10}) end,
       "ember.memory.record_history: unknown option 'max_entry' (expected cpu, max_entries, stack_depth, track_modules)"},
      {function() memory.record_history(true, {cpu = "no"}) end, "expected cpu to be a boolean, got string"},
      {function() memory.record_history(false, {}) end, "record_history(false) takes no options"},
      {function() memory.tag(1, "parameter") end, "ember.memory.tag: expected a tensor, got number"},
      {function() memory.tag(ember.zeros(1), "weights") end, "ember.memory.tag: expected a category (other, parameter"},
      {function() memory.category("parameter", 5) end, "ember.memory.category: expected a function, got number"},
      {function() memory.stats(true) end, "ember.memory.stats: expected a device"},
    }
    for i, c in ipairs(cases) do
      it("case " .. i .. ": " .. c[2]:sub(1, 60), function()
        local ok, err = pcall(c[1])
        assert.is_false(ok)
        assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
      end)
    end
    it("names the caller's line", function()
      local ok, err = pcall(memory.snapshot, 42)
      assert.is_false(ok)
      local _, err2 = pcall(function() memory.snapshot(42) end) local line = here()
      assert.truthy(err2:find(SPEC:match("[^/]+$") .. ":" .. line, 1, true), err2)
      assert.is_not_nil(err)
    end)
  end)

  describe("scripts/memviz.lua", function()
    local EMBER = BUILD .. "/ember"

    it("draws the timeline and lists the largest allocations with their call sites", function()
      local model = tiny_lm()
      local opt = optim.AdamW(model:parameters(), {lr = 1e-2})
      local inputs, targets = batch()
      memory.record_history(true)
      opt:zero_grad()
      F.cross_entropy(model(inputs), targets):backward()
      opt:step()
      local big = ember.zeros(1000, 100) local line = here()  -- the largest allocation
      local json = memory.snapshot(temp(".json"))
      local html = temp(".html")
      for _, by in ipairs({"category", "module"}) do
        local out, ok = sh(table.concat({q(EMBER), "run scripts/memviz.lua", q(json), "-o", q(html), "--by", by,
          "--top", "5"}, " "))
        assert.is_true(ok, out)
        local page = slurp(html)
        assert.truthy(page:find("<svg", 1, true))
        assert.truthy(page:find("<polygon", 1, true))
        assert.truthy(page:find("Largest allocations", 1, true))
        assert.truthy(page:find("390.62 KiB", 1, true), "the 400000-byte tensor")
        assert.truthy(page:find(site(line), 1, true), "its call site")
        assert.truthy(page:find("Peak by module and phase", 1, true))
        assert.truthy(page:find("layers.0", 1, true))
        if by == "category" then
          assert.truthy(page:find("optimizer_state", 1, true) and page:find("activation", 1, true))
        end
      end
      assert.is_not_nil(big)
    end)

    it("stays small and fast on a million-event snapshot", function()
      -- written directly (the engine would need minutes of ops to make it):
      -- 1000 blocks live at a time, phases in turn, three modules
      local path = temp(".json")
      local f = assert(io.open(path, "wb"))
      local n = 1000000
      f:write('{"format":"ember.memory_snapshot","version":1,\n"time_ns":', n * 100, ',\n',
        '"history":{"recording":true,"stopped":false,"max_entries":1000000,"stack_depth":0,"cpu":true,',
        '"entries":', n, ',"dropped":0,"recorded":', n, '},\n"segments":[],\n"blocks":[],\n',
        '"strings":["","matmul","layers.0.attn","layers.1.ffn","train.lua:42","train.lua:43"],\n',
        '"fields":["time_ns","action","device","addr","size","requested_size","stream","category",',
        '"phase","op","module","callsite"],\n"trace":[\n')
      local phases, cats = {"forward", "backward", "optimizer"}, {"activation", "autograd", "optimizer_state"}
      local buf, nbuf = {}, 0
      local fmtrow = '[%d,"%s","cpu",%d,%d,%d,0,"%s","%s",1,%d,%d]%s\n'
      for i = 1, n // 2 do
        local k = (i // 50000) % 3 + 1
        local size = 4096 * (i % 7 + 1)
        nbuf = nbuf + 1
        buf[nbuf] = fmtrow:format(2 * i * 100, "alloc", 4096 * i, size, size, cats[k], phases[k], k % 2 + 2, 4, ",")
        local j = i - 1000
        nbuf = nbuf + 1
        local last = i == n // 2 and "" or ","
        if j >= 1 then
          local js = 4096 * (j % 7 + 1)
          buf[nbuf] = fmtrow:format((2 * i + 1) * 100, "free", 4096 * j, js, 0, cats[(j // 50000) % 3 + 1],
            phases[k], k % 2 + 2, 5, last)
        else
          buf[nbuf] = fmtrow:format((2 * i + 1) * 100, "alloc", 4096 * (n + i), 512, 512, "other", "none", 0, 5, last)
        end
        if nbuf >= 20000 then f:write(table.concat(buf, "", 1, nbuf)) nbuf = 0 end
      end
      f:write(table.concat(buf, "", 1, nbuf), "]}\n")
      f:close()
      local html = temp(".html")
      local t0 = os.time()
      local out, ok = sh(table.concat({q(EMBER), "run scripts/memviz.lua", q(path), "-o", q(html)}, " "))
      local secs = os.time() - t0
      assert.is_true(ok, out)
      local page = slurp(html)
      print(("memory_spec: memviz on 1M events took ~%d s, page %d bytes"):format(secs, #page))
      assert.is_true(#page < 2 * 1024 * 1024, "page of " .. #page .. " bytes")
      assert.is_true(secs < 60, "took " .. secs .. " s")
      assert.truthy(page:find("1000000 events", 1, true))
      assert.truthy(page:find("<svg", 1, true))
      assert.truthy(page:find("train.lua:42", 1, true))
      -- peak: 1000 live blocks of about 4096 * 4 bytes plus the 1000 early 512-byte ones
      assert.truthy(out:find("peak active %d"), out)
    end)
  end)
end)
