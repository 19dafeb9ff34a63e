-- scan_pdl_spec.lua (GPU) — the L2-segmented one-row scan (EMBER_SCAN_ROW=l2 /
-- l2f, kernels/scan_row_l2.cuh) with programmatic dependent launch
-- (EMBER_SCAN_ROW_PDL=1: each kernel may be scheduled while the one before it
-- drains, and waits for it before touching memory) must give split's bits,
-- as it does without. Kept apart from scan_spec.lua: the default path does
-- not launch that way. Both switches are read once a process: each run is a
-- child that saves its results. Sizes: one tile and a bit, 8 chunks less a
-- bit (with l2:3 / l2f:3: segments of 3, 3, 2), 301 chunks; misaligned,
-- reversed, cumprod, each sum twice; and a graph capture (where PDL is off).
local ember = require "ember"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local cmp, H = dofile(here .. "compare.lua")
assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local BIG = 300 * 64 * 4096 + 4099
local CHILD = [[
local ember = require "ember"
local out = {}
for _, dt in ipairs({"f32", "bf16", "f64"}) do
  for k, n in ipairs({4097, 8 * 64 * 4096 - 4093, ]] .. BIG .. [[}) do
    ember.manual_seed(70 + k)
    local x = ember.randn(n, {device = "cuda"}):to(dt)
    local p = (ember.rand(n, {device = "cuda"}) * 0.002 + 0.999):to(dt)
    local key = dt .. "_" .. k
    local idx = n > 1000000 and ember.arange(0, n, 997, {device = "cuda"}) or nil
    local function keep(t) return (idx and t:index_select(0, idx) or t):cpu() end
    out["sum_" .. key] = keep(x:cumsum(0))
    out["again_" .. key] = keep(x:cumsum(0))
    out["prod_" .. key] = keep(p:cumprod(0))
    local xl = x:detach(); xl.requires_grad = true
    xl:cumsum(0):backward(p)
    out["rev_" .. key] = keep(xl.grad)
    out["mis_" .. key] = keep(x:narrow(0, 1, n - 1):cumsum(0))
  end
  local x = ember.randn(8 * 64 * 4096 - 4093, {device = "cuda"}):to(dt)
  local g, y = ember.cuda.graph(function() return x:cumsum(0) end)
  g:replay()
  out["graph_" .. dt], out["eager_" .. dt] = y:cpu(), x:cumsum(0):cpu()
  g:close()
end
ember.save(os.getenv("SCAN_SPEC_OUT"), out)
]]

-- the child's results under each environment (a table of variables)
local function run(script, envs)
  local got = {}
  for name, env in pairs(envs) do
    local path = H.temp(".safetensors")
    env.SCAN_SPEC_OUT = path
    local _, err, code = H.ember({"run", script}, {env = env})
    if code ~= 0 then error(("%s child failed (exit %s): %s"):format(name, tostring(code), err), 2) end
    got[name] = ember.load(path)
  end
  return got
end

describe("one-row scan, EMBER_SCAN_ROW=l2 / l2f with EMBER_SCAN_ROW_PDL=1", function()
  after_each(function() H.remove_temps() end)

  it("gives split's bits (f32, bf16, f64), forward, cumprod, reversed, misaligned, run twice, graph", function()
    local script = H.temp_file(CHILD, ".lua")
    local envs = {split = {EMBER_SCAN_ROW = "split"}}
    local others = {}
    for _, mode in ipairs({"l2", "l2:3", "l2f", "l2f:3", "auto"}) do
      envs[mode .. "+pdl"] = {EMBER_SCAN_ROW = mode, EMBER_SCAN_ROW_PDL = "1"}
      others[#others + 1] = mode .. "+pdl"
    end
    local got = run(script, envs)
    assert.are.equal(3 * 3 * 5 + 3 * 2, cmp.assert_modes_agree(got, "split", others))
    for _, mode in ipairs(others) do
      for _, dt in ipairs({"f32", "bf16", "f64"}) do
        local d = got[mode]["graph_" .. dt]:ne(got[mode]["eager_" .. dt]):sum():item()
        assert(d == 0, ("%s graph vs eager cumsum %s: %d elements differ, expected 0"):format(mode, dt, d))
      end
    end
  end)
end)
