-- op_cases_spec.lua (GPU) — the registry's eval mode: every case of the
-- shared op registry (tests/lua/op_cases.lua) run on CUDA in f32, bf16 and
-- f16 (or the case's cuda_dtypes) and compared
-- with the same case on the CPU in f64:
--   * inputs: the case's inputs built in the dtype on "cuda"; the reference
--     gets exactly those values (already rounded to the dtype) as f64 CPU
--     tensors, so the comparison measures the GPU's arithmetic, not the
--     rounding of the inputs;
--   * forward: the output, and its dtype against the same case run on the
--     CPU in the same dtype (the GPU must not change result types);
--   * backward: the gradient of every float input of sum(out * w), w fixed
--     random weights rounded to the output's dtype.
-- Tolerances: compare.lua (|got - ref| <= atol + rtol |ref|, atol = rtol *
-- max(1, max |ref|); rtol f32 1e-5, bf16 1e-2, f16 2.5e-3). The one
-- "composite" case chains five ops forward and about fifteen backward, each
-- rounding its output to the dtype: three times the tolerance for it.
--
-- Run on a GPU host: EMBER_TEST_GPU=1 EMBER_BUILD=<build> bash tests/run_all.sh
-- A case whose op has no CUDA implementation yet fails with
-- "not implemented for device cuda:0": that is a real gap, not a skip.
local ember = require "ember"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local cases = dofile(here .. "../lua/op_cases.lua")
local cmp = dofile(here .. "compare.lua")

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local DTYPES = {"f32", "bf16", "f16"}
local COMPOSITE_FACTOR = 3

local function is_float(t)
  return t.dtype == "f32" or t.dtype == "f64" or t.dtype == "bf16" or t.dtype == "f16"
end

-- The GPU inputs' values on the CPU: floats as f64 (leaves that require grad
-- stay so), integers and bools unchanged.
local function reference_inputs(inputs)
  local ref = {}
  for i, x in ipairs(inputs) do
    local c = x:detach():to({device = "cpu", dtype = is_float(x) and "f64" or x.dtype})
    if is_float(x) and x.requires_grad then c.requires_grad = true end
    ref[i] = c
  end
  return ref
end

-- sum(out * w) with w ~ randn rounded to out's dtype; the same w for both sides.
local function weighted_sum(out, w64)
  local w = w64:to({dtype = out.dtype, device = out.device})
  return (out * w):sum()
end

local function weights_for(out)
  ember.manual_seed(20261121)
  return ember.randn(out.shape, {dtype = "f64"}):to(out.dtype):to("f64")
end

for _, c in ipairs(cases) do
  for _, dtype in ipairs(c.cuda_dtypes or DTYPES) do
    it(("%s [%s]"):format(c.name, dtype), function()
      local rtol = cmp.rtol(dtype) * (c.op == "composite" and COMPOSITE_FACTOR or 1)
      local inputs = cases.make_inputs(c, {dtype = dtype, device = "cuda"})
      local ref_in = reference_inputs(inputs)

      local out = c.fn(table.unpack(inputs))
      local ref = c.fn(table.unpack(ref_in))
      assert.are.equal("cuda:0", out.device, "the output left the GPU")
      local same = c.fn(table.unpack(cases.make_inputs(c, {dtype = dtype, device = "cpu"})))
      assert.are.equal(same.dtype, out.dtype, "result dtype differs from the CPU's for " .. dtype .. " inputs")
      cmp.assert_close(out, ref, rtol, "forward")

      if not c.grad then return end   -- an op without a gradient: the forward is the check
      local w = weights_for(out)
      weighted_sum(out, w):backward()
      weighted_sum(ref, w):backward()
      local checked = 0
      for i, x in ipairs(inputs) do
        if x.requires_grad then
          assert.is_not_nil(x.grad, ("input %d has no gradient"):format(i))
          assert.are.equal("cuda:0", x.grad.device, ("input %d: gradient left the GPU"):format(i))
          cmp.assert_close(x.grad, ref_in[i].grad, rtol, ("gradient of input %d"):format(i))
          checked = checked + 1
        end
      end
      assert.is_true(checked > 0, "no input required grad: nothing was checked")
    end)
  end
end
