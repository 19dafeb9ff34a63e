-- scan_ring_spec.lua (GPU) — the opt-in persistent one-pass one-row scan
-- (EMBER_SCAN_ROW=ring: scan_row_ring in kernels/scan_row_ring.cuh, f32
-- accumulators, i.e. f32/bf16/f16 rows; f64 and i64 fall back to split) must
-- give the bits of scan_row_tiles (EMBER_SCAN_ROW=tiles): chain's fixed sums,
-- a cooperative grid of resident blocks, block b taking tiles b, b + G, ...,
-- the next tile copied in ahead. Sizes: two elements, one tile and a bit (fewer tiles than blocks), a
-- chunk and a bit, 301 chunks (~30 tiles a block); misaligned (the scalar
-- loads), reversed (cumsum's backward), and a second run of each sum (the
-- same bits, whatever the timing). The switch is read once a process, so
-- each path runs in a child that saves its results. Kept apart from
-- scan_spec.lua: the default path does not depend on it.
local ember = require "ember"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local cmp, H = dofile(here .. "compare.lua")
assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

-- two elements, one tile and a bit, a chunk and a bit, 301 chunks (more than 8 chunk totals a lane in warp 1's batches)
local BIG = 300 * 64 * 4096 + 4099
local CHILD = [[
local ember = require "ember"
local out = {}
for _, dt in ipairs({"f32", "bf16", "f16", "f64"}) do
  for k, n in ipairs({2, 4097, 64 * 4096 + 5, ]] .. BIG .. [[}) do
    ember.manual_seed(50 + k)
    local x = ember.randn(n, {device = "cuda"}):to(dt)
    local p = (ember.rand(n, {device = "cuda"}) * 0.002 + 0.999):to(dt)
    local key = dt .. "_" .. k
    local idx = n > 1000000 and ember.arange(0, n, 997, {device = "cuda"}) or nil
    local function keep(t) return (idx and t:index_select(0, idx) or t):cpu() end
    out["in_" .. key] = keep(x)
    out["sum_" .. key] = keep(x:cumsum(0))
    out["again_" .. key] = keep(x:cumsum(0))   -- a second run: same bits, whatever the timing
    out["prod_" .. key] = keep(p:cumprod(0))
    local xl = x:detach(); xl.requires_grad = true
    xl:cumsum(0):backward(p)   -- the reversed scan of p
    out["rev_" .. key] = keep(xl.grad)
    out["mis_" .. key] = keep(x:narrow(0, 1, n - 1):cumsum(0))   -- misaligned: the scalar loads
  end
end
ember.save(os.getenv("SCAN_SPEC_OUT"), out)
]]

describe("one-row scan, EMBER_SCAN_ROW=ring", function()
  after_each(function() H.remove_temps() end)

  it("gives the bits of tiles (f32, bf16, f16; f64 through split), forward, cumprod, reversed, misaligned", function()
    local got = cmp.mode_results(H, H.temp_file(CHILD, ".lua"), "EMBER_SCAN_ROW", {"ring", "tiles"})
    assert.are.equal(4 * 4 * 6, cmp.assert_modes_agree(got, "tiles", {"ring"}))
  end)

  it("matches the CPU across 301 chunks (f32 cumsum, in a child)", function()
    local script = H.temp_file([[
local ember = require "ember"
ember.manual_seed(41)
local x = ember.randn(]] .. BIG .. [[, {dtype = "f64"}):to("f32")
ember.save(os.getenv("SCAN_SPEC_OUT"), {x = x, got = x:cuda():cumsum(0):cpu()})
]], ".lua")
    local r = cmp.mode_results(H, script, "EMBER_SCAN_ROW", {"ring"}).ring
    cmp.assert_close(r.got, r.x:cumsum(0), cmp.rtol("f32"), "cumsum f32 n " .. BIG)
  end)

  it("gives the same bits inside graph capture (split there) as eagerly (ring)", function()
    local script = H.temp_file([[
local ember = require "ember"
ember.manual_seed(43)
local out = {}
for _, dt in ipairs({"f32", "bf16"}) do
  local x = ember.randn(64 * 4096 + 5, {device = "cuda"}):to(dt)
  local eager = x:cumsum(0)
  local g, y = ember.cuda.graph(function() return x:cumsum(0) end)
  g:replay()
  out["eager_" .. dt], out["graph_" .. dt] = eager:cpu(), y:cpu()
  g:close()
end
ember.save(os.getenv("SCAN_SPEC_OUT"), out)
]], ".lua")
    local path = H.temp(".safetensors")
    local _, err, code = H.ember({"run", script}, {env = {EMBER_SCAN_ROW = "ring", SCAN_SPEC_OUT = path}})
    assert.are.equal(0, code, "EMBER_SCAN_ROW=ring child (graph capture) failed: " .. err)
    local r = ember.load(path)
    for _, dt in ipairs({"f32", "bf16"}) do
      local d = r["graph_" .. dt]:ne(r["eager_" .. dt]):sum():item()
      assert(d == 0, ("graph vs eager cumsum %s: %d elements differ, expected 0"):format(dt, d))
    end
  end)
end)
