-- gradcheck_spec.lua — every case of the op registry (op_cases.lua) checked
-- with ember.autograd.gradcheck: the gradients backward computes against
-- central finite differences, on f64 CPU inputs.
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/gradcheck_spec.lua
--
-- Tolerances are gradcheck's defaults (eps 1e-6, atol 1e-5, rtol 1e-3): with
-- f64 and O(1) inputs the central difference is accurate to ~1e-10, so these
-- leave room only for genuinely wrong gradients. A case may override them in
-- its `gradcheck` field, with the reason next to it.

local ember = require "ember"

local here = debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./"
local cases = dofile(here .. "op_cases.lua")

-- Every differentiable op of API.md must have at least one case.
local REQUIRED = {
  "add", "sub", "mul", "div", "pow", "maximum", "minimum",
  "neg", "abs", "sqrt", "rsqrt", "exp", "log", "tanh", "sigmoid", "silu", "relu", "gelu",
  "sin", "cos", "square", "reciprocal", "clamp", "where", "masked_fill", "triu", "tril",
  "sum", "mean", "max", "min", "var", "logsumexp", "softmax", "log_softmax", "matmul",
  "linear", "embedding", "cross_entropy", "rmsnorm", "add_rmsnorm", "layer_norm", "rope", "rope_qk", "swiglu", "scaled_dot_product_attention", "flash_attention",
  "cat", "stack", "view", "reshape", "transpose", "t", "permute", "narrow", "select", "squeeze",
  "unsqueeze", "expand", "flatten", "contiguous", "clone", "split", "chunk",
  -- issue 12: dropout and losses
  "dropout", "mse_loss", "l1_loss", "nll_loss", "binary_cross_entropy_with_logits", "gelu_tanh",
  -- ops-indexing
  "index_select", "gather", "scatter", "scatter_add", "index_add", "masked_select", "take_along_dim",
  "index", "embedding_bag",
  -- sorting, selection, scans
  "sort", "topk", "kthvalue", "median", "cumsum", "cumprod",
  -- issue 12: shape & math ops
  "repeat", "tile", "flip", "roll", "diag", "outer", "einsum", "baddbmm", "prod", "norm", "amax", "amin",
  "lerp", "addcmul", "addcdiv",
}

describe("the op registry", function()
  it("has a case for every differentiable op of the API", function()
    local have = {}
    for _, c in ipairs(cases) do have[c.op] = true end
    local missing = {}
    for _, op in ipairs(REQUIRED) do if not have[op] then missing[#missing + 1] = op end end
    assert.same({}, missing)
  end)

  it("has a perf entry (scripts/bench_ops.lua) for every op with a case", function()
    local timed = {}
    for _, p in ipairs(cases.perf) do timed[p.op] = true end
    local missing, seen = {}, {}
    for _, c in ipairs(cases) do
      if c.op ~= "composite" and not timed[c.op] and not seen[c.op] then
        missing[#missing + 1] = c.op
        seen[c.op] = true
      end
    end
    assert.same({}, missing)
  end)

  it("gives every case a unique name", function()
    local seen = {}
    for _, c in ipairs(cases) do
      assert.is_nil(seen[c.name], "duplicate case name: " .. c.name)
      seen[c.name] = true
    end
  end)

  it("builds the same inputs twice for the same case (seeded by name)", function()
    local c = cases[1]
    local a = cases.make_inputs(c)[1]:tolist()
    local b = cases.make_inputs(c)[1]:tolist()
    assert.same(a, b)
  end)
end)

describe("gradcheck", function()
  for _, c in ipairs(cases) do
    if c.grad then it(c.name, function()
      local inputs = cases.make_inputs(c, {dtype = "f64", device = "cpu"})
      local out = c.fn(table.unpack(inputs))
      assert.is_true(out.requires_grad, "the output does not require grad: nothing was recorded")
      local o = {raise = false}
      for k, v in pairs(c.gradcheck or {}) do o[k] = v end
      local ok, msg = ember.autograd.gradcheck(c.fn, inputs, o)
      assert(ok, msg)
    end) end
  end
end)
