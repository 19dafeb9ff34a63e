-- linear_bwd_stream_spec.lua (GPU) — EMBER_LINEAR_BWD_STREAM=1 (engine/ops/linear_side.c): an autocast linear's
-- backward runs grad W's gemm on a side stream beside grad x's, forked and joined with events. The same gemms on
-- the same operands with the same algorithms, so training gives the bits of the switch at 0: checked in children
-- (the switch is read once a process; tests/gpu/linear_bwd_stream_child.lua) for eager steps, gradient
-- accumulation and DDP-style bucket views as .grad (beta = 1 into them), a step captured with ember.cuda.graph and replayed, the overlapped
-- optimizer's step_in_backward eagerly and captured, and free_grads: losses, weights and gradients element for
-- element. The profiles of the two children show the same linear kernels (name, op, module, phase) — the side
-- stream's keep their attribution — on two streams in backward with the switch on, one with it off. The switch's
-- parsing is tests/lua/linear_bwd_stream_spec.lua's.
local ember = require "ember"
local cjson = require "cjson"
local C, H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "compare.lua")

local HERE = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local SCENARIOS = {"eager", "accum2", "views", "graph", "overlap", "overlap_graph", "overlap_free"}

local function child(mode)
  local tensors, traces = H.temp(".safetensors"), H.temp(".json")
  local out, err, code = H.ember({"run", HERE .. "linear_bwd_stream_child.lua"},
    {env = {EMBER_LINEAR_BWD_STREAM = mode, SCAN_SPEC_OUT = tensors, TRACE_OUT = traces}})
  if code ~= 0 then error(("EMBER_LINEAR_BWD_STREAM=%s child failed (exit %s): %s"):format(mode, tostring(code), err), 2) end
  assert.equals("switch\t" .. (mode == "1" and "true" or "false") .. "\n", out)
  return ember.load(tensors), cjson.decode(H.slurp(traces))
end

describe("EMBER_LINEAR_BWD_STREAM on CUDA", function()
  assert.is_true(ember.cuda.is_available(), "the GPU specs need a CUDA device")
  local got, traces = {}, {}
  setup(function()
    for _, mode in ipairs({"0", "1"}) do got[mode], traces[mode] = child(mode) end
  end)
  teardown(function() H.remove_temps() end)

  it("trains to the same bits with 1 as with 0: losses, weights, gradients, every scenario", function()
    local n = C.assert_modes_agree(got, "0", {"1"})
    assert.equals(n, C.assert_modes_agree(got, "1", {"0"}))       -- and no name only 1 has
    for _, s in ipairs(SCENARIOS) do
      local losses, weights, grads = 0, 0, 0
      for name in pairs(got["0"]) do
        if name == s .. ".losses" then losses = losses + 1 end
        if name:sub(1, #s + 3) == s .. ".w." then weights = weights + 1 end
        if name:sub(1, #s + 3) == s .. ".g." then grads = grads + 1 end
      end
      assert.equals(1, losses, s .. ": its losses were saved")
      assert.truthy(weights >= 20, s .. ": " .. weights .. " weights saved")
      if s == "overlap_free" then assert.equals(0, grads, s .. ": free_grads dropped every gradient")
      else assert.equals(weights, grads, s .. ": a gradient for every weight") end
    end
  end)

  it("keeps every linear kernel's name, op, module and phase; backward's on two streams only with 1", function()
    C.need_cupti(pending)                 -- the children's profiles have kernel records only with CUPTI
    for _, what in ipairs({"eager", "graph"}) do
      local k0, k1 = traces["0"][what].keys, traces["1"][what].keys
      local n = 0
      for key, count in pairs(k0) do
        assert.equals(count, k1[key], what .. ": " .. key)
        n = n + count
      end
      for key in pairs(k1) do assert.is_not_nil(k0[key], what .. ": only with 1: " .. key) end
      assert.truthy(n >= 3 * 15, what .. ": " .. n .. " linear kernels")   -- 15 linears: forward, grad x, grad W
    end
    assert.equals(1, traces["0"].eager.backward_streams)
    assert.equals(2, traces["1"].eager.backward_streams)
  end)
end)
