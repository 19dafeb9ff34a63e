-- shape_spec.lua (GPU) — ember.cat and ember.stack of CUDA tensors
-- (engine/ops/shape.c: one result allocation, each input copied into its
-- slice with copy_, so the device work is kernels/copy.cu's) against the
-- CPU: dims, dtype promotion, non-contiguous inputs, the legacy skipped empty
-- 1-D input, and gradients (narrow of the result's gradient). Copies move
-- values without arithmetic: results must be exact.
local ember = require "ember"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local cmp = dofile(here .. "compare.lua")

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local function on(device, list)
  local out = {}
  for i, t in ipairs(list) do out[i] = t:to(device) end
  return out
end

-- f(list of tensors) on the CPU and on CUDA copies: exactly equal results.
local function agree(what, f, list)
  local ref = f(list)
  local got = f(on("cuda", list))
  assert.are.equal("cuda:0", got.device, what .. ": device")
  cmp.assert_equal(got, ref, what)
end

describe("ember.cat on CUDA", function()
  it("joins along dims 0, 1 and -1", function()
    ember.manual_seed(1)
    local a, b, c = ember.randn(3, 4, 5), ember.randn(3, 2, 5), ember.randn(3, 4, 5)
    agree("dim 0", function(l) return ember.cat({l[1], l[3]}, 0) end, {a, b, c})
    agree("dim 1", function(l) return ember.cat({l[1], l[2], l[3]}, 1) end, {a, b, c})
    agree("dim -1", function(l) return ember.cat({l[1], l[3]}, -1) end, {a, b, c})
  end)

  it("promotes dtypes and keeps integers and bools exact", function()
    ember.manual_seed(2)
    agree("f32 + bf16", function(l) return ember.cat(l, 0) end, {ember.randn(2, 3), ember.randn(4, 3):to("bf16")})
    agree("i32 + i64", function(l) return ember.cat(l, 1) end, {ember.randint(-9, 9, {2, 3}):to("i32"), ember.randint(-9, 9, {2, 2})})
    agree("bool", function(l) return ember.cat(l, 0) end, {ember.rand(5):lt(0.5), ember.rand(3):lt(0.5)})
  end)

  it("copies non-contiguous inputs and skips an empty 1-D input", function()
    ember.manual_seed(3)
    agree("transposed + narrowed", function(l) return ember.cat({l[1]:t(), l[2]:narrow(1, 1, 4)}, 0) end,
      {ember.randn(4, 6), ember.randn(2, 5)})
    agree("empty 1-D skipped", function(l) return ember.cat({l[1], l[2]}, 0) end, {ember.zeros(0), ember.randn(3, 2)})
  end)

  it("sends each input the slice of the gradient", function()
    ember.manual_seed(4)
    local a, b, w = ember.randn(3, 4), ember.randn(3, 2), ember.randn(3, 6)
    local function grads(device)
      local x, y = a:to(device):clone(), b:to(device):clone()
      x.requires_grad = true; y.requires_grad = true
      local loss = (ember.cat({x, y}, 1) * w:to(device)):sum()
      loss:backward()
      return x.grad, y.grad
    end
    local gx, gy = grads("cuda")
    local rx, ry = grads("cpu")
    cmp.assert_equal(gx, rx, "gradient of the first input")
    cmp.assert_equal(gy, ry, "gradient of the second input")
  end)
end)

describe("ember.stack on CUDA", function()
  it("stacks along a new first, middle and last dim", function()
    ember.manual_seed(5)
    local list = {ember.randn(3, 4), ember.randn(3, 4), ember.randn(3, 4)}
    for _, d in ipairs({0, 1, -1}) do
      agree("dim " .. d, function(l) return ember.stack(l, d) end, list)
    end
    agree("bf16", function(l) return ember.stack(l, 0) end, {list[1]:to("bf16"), list[2]:to("bf16")})
  end)
end)
