-- dist_spec.lua (GPU) — the NCCL side of ember.dist in one process (a world
-- of one rank: MPI's singleton start, NCCL with one GPU): CUDA tensors on the
-- comm stream, the fork/join with the current stream (the collective sees
-- the compute that came before it, and what comes after sees its result),
-- async work handles, graph capture and replay of a collective, and the
-- errors for what NCCL cannot do. Several ranks over NCCL are
-- `make test-dist-gpu` (tests/dist with EMBER_DIST_DEVICE=cuda).
local ember = require "ember"
local dist = ember.dist

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device")

local function max_diff(a, b) return (a:to("f64") - b:to("f64")):abs():max():item() end

describe("ember.dist on CUDA tensors (NCCL, one rank)", function()
  setup(function()
    if not dist.available():find("nccl", 1, true) then
      error("this CUDA build has no NCCL (ember.dist.available() = '" .. dist.available() .. "')")
    end
    if not dist.is_initialized() then dist.init({backend = "nccl"}) end
  end)

  it("initialises a world of one over NCCL", function()
    assert.are.equal("nccl", dist.backend())
    assert.are.equal(0, dist.rank())
    assert.are.equal(1, dist.world_size())
  end)

  it("all_reduce in every dtype NCCL reduces leaves a world of one unchanged", function()
    for _, dt in ipairs({"f32", "f64", "bf16", "f16", "i32", "i64", "u8"}) do
      for _, op in ipairs({"sum", "max", "min"}) do
        local x = ember.randint(0, 50, {1000}):to({dtype = dt, device = "cuda"})
        local y = x:clone()
        dist.all_reduce(y, {op = op})
        assert.are.equal(0, max_diff(x, y), dt .. " " .. op)
      end
    end
  end)

  it("the collective waits for the compute before it and what follows sees its result", function()
    -- a long chain of kernels on the current stream writes t; all_gather copies
    -- t into out on the comm stream (a real copy even for one rank): without the
    -- event fork it would read t before the chain finished
    local n = 1 << 22
    local base = ember.randn({n}, {device = "cuda"})
    for _ = 1, 5 do
      local t = base:clone()
      for _ = 1, 50 do t:mul_(1.0001):add_(0.001) end
      local out = ember.zeros({n}, {device = "cuda"})
      dist.all_gather(out, t)
      local later = out * 2          -- current stream, after the join
      assert.are.equal(0, max_diff(out, t))
      assert.are.equal(0, max_diff(later, t * 2))
    end
  end)

  it("async work: wait() orders the current stream after the collective", function()
    local n = 1 << 22
    local t = ember.randn({n}, {device = "cuda"})
    for _ = 1, 20 do t:mul_(1.0001) end
    local out = ember.zeros({n}, {device = "cuda"})
    local w = dist.all_gather(out, t, {async = true})
    w:wait()
    assert.are.equal(0, max_diff(out, t))
    ember.cuda.synchronize()
    assert.is_true(w:is_completed())
    local w2 = dist.all_reduce(ember.ones({1 << 20}, {device = "cuda"}), {async = true})
    w2:wait()
    ember.cuda.synchronize()
    assert.is_true(w2:is_completed())
  end)

  it("broadcast, reduce_scatter and all_gather into a list on CUDA", function()
    local t = ember.randn({3, 5}, {device = "cuda"})
    local b = t:clone()
    dist.broadcast(b, {src = 0})
    assert.are.equal(0, max_diff(b, t))
    local rs = ember.zeros({15}, {device = "cuda"})
    dist.reduce_scatter(rs, t:flatten(), {op = "avg"})
    assert.are.equal(0, max_diff(rs, t:flatten()))
    local list = {ember.zeros({3, 5}, {device = "cuda"})}
    dist.all_gather(list, t)
    assert.are.equal(0, max_diff(list[1], t))
  end)

  it("a captured collective replays with new data", function()
    local x = ember.randn({4096}, {device = "cuda"})
    local y = ember.zeros({4096}, {device = "cuda"})
    local out = ember.zeros({4096}, {device = "cuda"})
    local g = ember.cuda.graph(function()
      y:copy_(x * 3)
      dist.all_reduce(y, {op = "sum"})
      dist.all_gather(out, y)
    end)
    x:copy_(ember.randn({4096}, {device = "cuda"}))
    g:replay()
    assert.is_true(max_diff(out, x * 3) < 1e-6)
  end)

  it("refuses what NCCL cannot do, naming the collective", function()
    local ok, err = pcall(dist.all_reduce, ember.zeros({4}, {dtype = "u16", device = "cuda"}))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("ember.dist.all_reduce: NCCL cannot reduce u16 tensors", 1, true), err)
    ok, err = pcall(dist.all_reduce, ember.zeros({4}))
    assert.is_false(ok)
    assert.truthy(tostring(err):find('backend "nccl" reduces CUDA tensors, got a cpu t', 1, true), err)
    ok, err = pcall(dist.all_reduce, ember.zeros({4, 4}, {device = "cuda"}):transpose(0, 1))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("expected t to be contiguous", 1, true), err)
  end)

  it("counts calls and bytes of CUDA collectives", function()
    dist.reset_stats()
    dist.all_reduce(ember.zeros({256}, {dtype = "bf16", device = "cuda"}))
    local s = dist.stats()
    assert.are.equal(1, s.all_reduce.calls)
    assert.are.equal(512, s.all_reduce.bytes)
  end)
end)
