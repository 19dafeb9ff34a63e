-- norm_tail_spec.lua (GPU) — the rmsnorm backward's A/B switches
-- (kernels/norm.cu) must not change a bit: EMBER_RMSNORM_BWD_TAIL=old (the
-- weight gradient's tail as it was: every thread fences, a second counter)
-- against the default, and EMBER_RMSNORM_BWD_PREFETCH=0 (no L2 prefetch of a
-- block's next row tile, no L1 prefetch of w's chunks) against the default. Both switches are read once a
-- process: each run is a child that saves its gradients. Cases: the models'
-- (2048, 768) f32 and bf16 (one and two row tiles a block), 3001 rows (several
-- tiles a block, a last tile short: the prefetch's bound), 8192 x 64 (many
-- small blocks), 37 x 4096 and 5 x 160 (fewer blocks than reducers), bf16 at
-- 2 chunks a thread, the residual sum (gx read, and prefetched), and a
-- captured graph replayed twice (the counters in a fresh buffer).
local ember = require "ember"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local cmp, H = dofile(here .. "compare.lua")
assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local CHILD = [[
local ember = require "ember"
local F = ember.nn.functional
local out = {}
local cases = {{"f32", 2048, 768}, {"f32", 3001, 1600}, {"f32", 8192, 64}, {"f32", 37, 4096}, {"f32", 5, 160},
               {"bf16", 2048, 768}, {"bf16", 3001, 1600}, {"bf16", 301, 264}, {"f32", 3001, 4096}}
for k, c in ipairs(cases) do
  local dt, n, d = c[1], c[2], c[3]
  ember.manual_seed(90 + k)
  local x = ember.randn({n, d}, {device = "cuda"}):to(dt)
  local g = ember.randn({n, d}, {device = "cuda"}):to(dt)
  local w = ember.randn({d}, {device = "cuda"})
  local xx, ww = x:detach(), w:detach()
  xx.requires_grad, ww.requires_grad = true, true
  F.rmsnorm(xx, ww, 1e-5):backward(g)
  out["gx_" .. k], out["gw_" .. k] = xx.grad:cpu(), ww.grad:cpu()
  -- the residual sum: the mul's backward runs first, rmsnorm adds into its gradient
  local xr, wr = x:detach(), w:detach()
  xr.requires_grad, wr.requires_grad = true, true
  local r = F.rmsnorm(xr, wr, 1e-5) + xr * g
  r:sum():backward()
  out["sum_gx_" .. k], out["sum_gw_" .. k] = xr.grad:cpu(), wr.grad:cpu()
end
ember.manual_seed(7)
local x = ember.randn({2048, 768}, {device = "cuda"})
local g = ember.randn({2048, 768}, {device = "cuda"})
local w = ember.randn({768}, {device = "cuda"}); w.requires_grad = true
local graph = ember.cuda.graph(function()
  w.grad = nil
  F.rmsnorm(x, w, 1e-5):backward(g)
end, {warmup = 0})
for rep = 1, 2 do
  w.grad:fill_(0 / 0)
  graph:replay()
  ember.cuda.synchronize()
  out["graph_gw_" .. rep] = w.grad:cpu()
end
graph:close()
ember.save(os.getenv("NORM_SPEC_OUT"), out)
]]

local function run(script, envs)
  local got = {}
  for name, env in pairs(envs) do
    local path = H.temp(".safetensors")
    env.NORM_SPEC_OUT = path
    local _, err, code = H.ember({"run", script}, {env = env})
    if code ~= 0 then error(("%s child failed (exit %s): %s"):format(name, tostring(code), err), 2) end
    got[name] = ember.load(path)
  end
  return got
end

describe("rmsnorm backward, EMBER_RMSNORM_BWD_TAIL and EMBER_RMSNORM_BWD_PREFETCH", function()
  after_each(function() H.remove_temps() end)

  it("give the default's bits: gx and gw, 9 shapes, the residual sum, graph replays", function()
    local script = H.temp_file(CHILD, ".lua")
    local got = run(script, {
      default = {},
      old_tail = {EMBER_RMSNORM_BWD_TAIL = "old"},
      new_tail = {EMBER_RMSNORM_BWD_TAIL = "new"},
      no_prefetch = {EMBER_RMSNORM_BWD_PREFETCH = "0"},
      both_old = {EMBER_RMSNORM_BWD_TAIL = "old", EMBER_RMSNORM_BWD_PREFETCH = "0"},
    })
    assert.are.equal(9 * 4 + 2, cmp.assert_modes_agree(got, "default",
      {"old_tail", "new_tail", "no_prefetch", "both_old"}))
    -- the replays wrote every element (the fill was NaN) and agree with each other
    assert.are.equal(0, got.default.graph_gw_1:ne(got.default.graph_gw_2):sum():item())
    assert.are.equal(0, got.default.graph_gw_1:isnan():sum():item())
  end)

  it("refuses a value it does not know, naming both", function()
    local script = H.temp_file([[
local ember = require "ember"
local x = ember.randn({64, 256}, {device = "cuda"}); x.requires_grad = true
local w = ember.randn({256}, {device = "cuda"}); w.requires_grad = true
ember.nn.functional.rmsnorm(x, w, 1e-5):sum():backward()
]], ".lua")
    local _, err, code = H.ember({"run", script}, {env = {EMBER_RMSNORM_BWD_TAIL = "fast"}})
    assert.are_not.equal(0, code)
    assert.truthy((err or ""):find("expected EMBER_RMSNORM_BWD_TAIL to be new or old, got 'fast'", 1, true),
      "stderr: " .. tostring(err))
  end)
end)
