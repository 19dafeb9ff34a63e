-- memory_spec.lua (GPU) — memory history on the CUDA caching allocator
-- (kernels/alloc.cu's record_event and em_cuda_memory_segments): block and
-- segment events with device, stream and call site; snapshots whose segments
-- tile exactly and whose active blocks add up to memory_allocated(); the
-- cuBLASLt workspace as "workspace"; a training step's categories, phases and
-- module paths on CUDA; the pickle read back by python3 and replayed as
-- memory_viz does (tests/lua/memory_check.py); recording through a CUDA graph
-- capture; scripts/memviz.lua on a CUDA snapshot (reserved line); a captured
-- training step's peak against the eager one's, and scripts/memory_step.lua.
local ember = require "ember"
local cjson = require "cjson"
local memory = ember.memory
local cuda = ember.cuda
local nn, optim, F = ember.nn, ember.optim, ember.nn.functional

assert(cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local BUILD = os.getenv("EMBER_BUILD") or "./build"
local SPEC = debug.getinfo(1, "S").source:match("^@(.*)$")
local MiB = 1024 * 1024

local function here() return debug.getinfo(2, "l").currentline end
local function site(line) return SPEC .. ":" .. line end

local U = dofile((SPEC:match("^(.*/)") or "./") .. "../lua/helpers.lua")
local temp, slurp, q, sh, find = U.temp, U.slurp, U.q, U.sh, U.find

local function block_at(snap, t)
  for _, b in ipairs(snap.blocks) do if b.address == t:data_ptr() then return b end end
end

local function active_bytes(snap, device)
  local n = 0
  for _, s in ipairs(snap.segments) do
    if s.device == device then
      for _, b in ipairs(s.blocks) do if b.state == "active_allocated" then n = n + b.size end end
    end
  end
  return n
end

-- A snapshot and memory_allocated() at the same instant: no collection (whose
-- finalizers free device tensors) may run between the two.
local function snapshot_and_allocated(path)
  collectgarbage()
  collectgarbage("stop")
  local snap = memory.snapshot(path)
  local allocated = cuda.memory_allocated()
  collectgarbage("restart")
  return snap, allocated
end

local function tiny(attn)
  ember.manual_seed(0)
  local model = nn.TransformerLM(nn.configs.tiny{vocab_size = 256, context_length = 64, device = "cuda",
    attn_impl = attn or "auto"})
  local opt = optim.AdamW(model:parameters(), {lr = 1e-3})
  local data = ember.randint(0, 256, {4, 65}, {device = "cuda"})
  return model, opt, data:narrow(1, 0, 64), data:narrow(1, 1, 64)
end

describe("ember.memory on CUDA", function()
  U.fresh_memory_history(before_each, after_each)

  it("records block and segment events of the caching allocator", function()
    cuda.synchronize()
    cuda.empty_cache()
    memory.record_history(true)
    -- 512 MiB: a segment of its own (nothing cached is that big after empty_cache)
    local t = ember.empty(128 * MiB, {device = "cuda"}) local line = here()
    local addr = t:data_ptr()
    t = nil
    collectgarbage()
    cuda.empty_cache()                                   -- the segment goes back to the driver
    local trace = memory.snapshot().trace
    local alloc = find(trace, {action = "alloc", addr = addr})
    assert.are.equal(1, #alloc)
    assert.are.equal("cuda:0", alloc[1].device)
    assert.are.equal(512 * MiB, alloc[1].size)
    assert.are.equal(512 * MiB, alloc[1].requested_size)
    assert.are.equal(site(line), alloc[1].callsite)
    assert.are.equal("integer", math.type(alloc[1].stream))
    local seg = find(trace, {action = "segment_alloc", addr = addr})
    assert.are.equal(1, #seg)
    assert.are.equal(512 * MiB, seg[1].size)
    assert.is_true(seg[1].time_ns <= alloc[1].time_ns)
    assert.are.equal(1, #find(trace, {action = "free", addr = addr}))
    assert.are.equal(1, #find(trace, {action = "segment_free", addr = addr, size = 512 * MiB}))
  end)

  it("snapshots segments whose blocks tile them and sum to memory_allocated()", function()
    memory.record_history(true)
    local keep = {}
    for i = 1, 20 do keep[i] = ember.empty(i * 1000 + 7, {device = "cuda"}) end
    for i = 1, 20, 3 do keep[i] = nil end
    local snap, allocated = snapshot_and_allocated()
    assert.is_true(#snap.segments > 0)
    for _, s in ipairs(snap.segments) do
      local addr = s.address
      for _, b in ipairs(s.blocks) do
        assert.are.equal(addr, b.address)
        addr = addr + b.size
      end
      assert.are.equal(s.total_size, addr - s.address)
    end
    assert.are.equal(allocated, active_bytes(snap, "cuda:0"))
    local b = block_at(snap, keep[2])
    assert.are.equal(2007 * 4, b.requested_size)
    assert.are.equal(0, b.size % 512)
  end)

  it("counts the cuBLASLt workspace as workspace", function()
    local a = ember.randn(64, 64, {device = "cuda"})
    local _ = a:matmul(a)                                -- the workspace may exist from before recording
    memory.record_history(true)
    local c = a:matmul(a)
    local snap = memory.snapshot()
    local ws = 0
    for _, b in ipairs(snap.blocks) do if b.category == "workspace" then ws = ws + b.size end end
    assert.is_true(ws >= 32 * MiB, "workspace bytes " .. ws)
    assert.is_not_nil(c)
  end)

  it("attributes a training step's memory to categories, phases and modules", function()
    local model, opt, x, y = tiny()
    local step = function()
      opt:zero_grad()
      local loss = ember.autocast("bf16", function() return F.cross_entropy(model(x), y) end)
      loss:backward()
      opt:step()
    end
    step()                                               -- optimizer state exists before recording
    memory.record_history(true)
    step()
    local snap, allocated = snapshot_and_allocated()
    local p = model.layers[1].attn.q_proj.weight
    assert.are.equal("parameter", block_at(snap, p).category)
    assert.are.equal("gradient", block_at(snap, p.grad).category)
    assert.are.equal("optimizer_state", block_at(snap, opt.state[p].exp_avg).category)
    assert.is_true(#find(snap.trace, {action = "alloc", phase = "forward", module = "layers.0.attn.q_proj"}) >= 1)
    assert.is_true(#find(snap.trace, {action = "alloc", phase = "backward", category = "autograd"}) >= 1)
    assert.is_true(#find(snap.trace, {action = "tag", category = "gradient"}) >= #model:parameters())
    -- flash attention's backward scratch (head dim 16 under bf16 autocast)
    assert.is_true(#find(snap.trace, {action = "alloc", phase = "backward", category = "workspace"}) >= 1)
    assert.are.equal(allocated, active_bytes(snap, "cuda:0"))
  end)

  it("writes JSON and a pickle that python3 replays as memory_viz does", function()
    local model, opt, x, y = tiny("naive")
    memory.record_history(true, {stack_depth = 2})
    opt:zero_grad()
    F.cross_entropy(model(x), y):backward() local line = here()
    opt:step()
    collectgarbage()
    local json = memory.snapshot(temp(".json"))
    local doc = cjson.decode(slurp(json))
    assert.are.equal("ember.memory_snapshot", doc.format)
    assert.is_true(#doc.segments > 0)
    assert.are.equal(doc.history.entries, #doc.trace)
    local pkl, allocated = snapshot_and_allocated(temp(".pickle"))
    if not os.execute("python3 -c 'import pickle' >/dev/null 2>&1") then
      print("memory_spec (GPU): python3 not found, the pickle replay is skipped")
      pending("python3 not found")
      return
    end
    local out, ok = sh("python3 tests/lua/memory_check.py " .. q(pkl))
    assert.is_true(ok, out)
    local r = cjson.decode(out)
    assert.are.equal("cuda:0", r.devices[1])
    assert.are.equal(allocated, r.active_bytes["cuda:0"])
    assert.is_true(r.actions.alloc > 50)
    local files = {}
    for _, f in ipairs(r.files) do files[f] = true end
    assert.is_true(files[SPEC:match("[^/]+$") .. ":" .. line])
  end)

  it("records through a CUDA graph capture without breaking it", function()
    local model, opt, x, y = tiny()
    local function step()
      opt:zero_grad()
      local loss = ember.autocast("bf16", function() return F.cross_entropy(model(x), y) end)
      loss:backward()
      opt:step()
      return loss
    end
    step()                                               -- eager warm-up: optimizer state
    cuda.synchronize()
    memory.record_history(true)
    local before = memory.stats().history.recorded
    local g, loss = cuda.graph(step, {warmup = 0})
    assert.is_true(memory.stats().history.recorded > before, "allocations during capture were recorded")
    g:replay()
    local first = loss:item()
    g:replay()
    g:replay()
    assert.is_true(loss:item() < first, "replays train")  -- same batch: the loss goes down
    local snap, allocated = snapshot_and_allocated()
    local graph_segments = 0
    for _, s in ipairs(snap.segments) do if s.graph_pool then graph_segments = graph_segments + 1 end end
    assert.is_true(graph_segments > 0)
    assert.are.equal(allocated, active_bytes(snap, "cuda:0"))
    local side = 0
    for _, e in ipairs(snap.trace) do if e.action == "alloc" and e.stream ~= 0 then side = side + 1 end end
    assert.is_true(side > 0, "allocations on the capture's side stream")
    g:close()
  end)

  it("gives memviz a CUDA timeline with the reserved line", function()
    local model, opt, x, y = tiny()
    memory.record_history(true)
    opt:zero_grad()
    F.cross_entropy(model(x), y):backward()
    opt:step()
    local json = memory.snapshot(temp(".json"))
    local html = temp(".html")
    local out, ok = sh(table.concat({q(BUILD .. "/ember"), "run scripts/memviz.lua", q(json), "-o", q(html)}, " "))
    assert.is_true(ok, out)
    local page = slurp(html)
    assert.truthy(page:find("Active memory on cuda:0", 1, true))
    assert.truthy(page:find("stroke-dasharray", 1, true))
  end)

  -- A model whose activations outweigh its gradients (B 16, T 256, 4 layers
  -- of d 512: ~370 MiB of forward, ~60 MB of gradients): what the capture
  -- keeps alive that eager frees shows up. The forward's fresh bytes must pass
  -- the eager collection's bar (lua_tensor.c: max(256 MiB, reserved/16)), so
  -- the cache is emptied first.
  local function activation_heavy()
    ember.manual_seed(0)
    local model = nn.TransformerLM{vocab_size = 1024, context_length = 256, d_model = 512, d_ff = 1536,
      num_layers = 4, num_heads = 8, device = "cuda"}
    local opt = optim.AdamW(model:parameters(), {lr = 1e-3})
    local data = ember.randint(0, 1024, {16, 257}, {device = "cuda"})
    local x, y = data:narrow(1, 0, 256), data:narrow(1, 1, 256)
    local function step()
      model:zero_grad()
      local loss = ember.autocast("bf16", function() return F.cross_entropy(model(x), y) end)
      loss:backward()
      opt:step()
      return loss
    end
    return step, model
  end

  -- The peak of fn() over the allocated bytes at its start, after the
  -- gradients are dropped and garbage collected.
  local function rise(model, fn)
    model:zero_grad()
    collectgarbage()
    collectgarbage()
    cuda.synchronize()
    cuda.reset_peak_memory_stats()
    local base = cuda.memory_allocated()
    local keep = fn()
    cuda.synchronize()
    return cuda.max_memory_allocated() - base, keep
  end

  it("a captured training step peaks no higher than the eager step (the forward's handles collected " ..
     "before backward in the capture too)", function()
    collectgarbage()
    cuda.empty_cache()
    local step, model = activation_heavy()
    step()
    step()
    local eager = rise(model, step)
    local captured, g = rise(model, function() return cuda.graph(step, {warmup = 0}) end)
    g:close()
    -- the fresh private pool may keep a few unsplit remainders (<= 1 MiB a block) that the warm cache split
    assert.is_true(captured <= eager + math.max(4 * MiB, eager // 50),
      ("capture rose %.1f MiB, eager %.1f MiB"):format(captured / MiB, eager / MiB))
    assert.is_true(eager > 64 * MiB, "the step allocates enough to tell: " .. eager / MiB .. " MiB")
  end)

  it("scripts/memory_step.lua: trace peaks equal max_memory_allocated, eager and capture, and the diff", function()
    local out, err, status = U.ember({"run", "scripts/memory_step.lua", "--model", "tiny", "--vocab", "256",
      "--context", "64", "--batch", "4", "--top", "8"})
    assert.are.equal(0, status, err)
    assert.matches("eager: peak [%d.]+ [MG]iB on cuda:0", out)
    assert.matches("capture: peak [%d.]+ [MG]iB on cuda:0", out)
    local checks = U.lines_matching(out, "check: ember.cuda.max_memory_allocated")
    assert.are.equal(2, #checks)
    for _, l in ipairs(checks) do
      assert.matches("equal to the trace's peak", l)
      assert.not_matches("NOT equal", l)
    end
    assert.matches("where capture's peak differs from eager's", out)
  end)

  it("reports the allocator's statistics with the history's", function()
    memory.record_history(true)
    local s = memory.stats()
    local c = cuda.memory_stats()
    assert.are.equal("cuda:0", s.device)
    assert.are.equal(c.allocated_bytes, s.allocated_bytes)
    assert.are.equal(c.reserved_bytes, s.reserved_bytes)
    assert.is_true(s.history.recording)
  end)
end)
