-- elementwise_spec.lua (GPU) — kernels/elementwise.cu against the CPU loop of
-- engine/ops/elementwise.c: every binary op (tensor-tensor, tensor-scalar,
-- scalar-tensor), every unary op, clamp, where, masked_fill, triu/tril, on
-- every dtype, through both kernel paths (the Packed128 fast path, its
-- unaligned twin, and the general strided/broadcast/mixed-dtype path), with
-- out=, in-place and overlapping writes, and the fused unary gradients.
--
-- The reference is the CPU on the *same* dtypes: both sides compute in the
-- same compute type (f32 for f32/bf16/f16, f64, i64) and round once, so
-- integer, bool and IEEE-exact float results (+ - * /, comparisons, sqrt,
-- floor ...) must agree exactly, and the rest within compare.lua's tolerance
-- for the output dtype (f32 1e-5: device expf/tanhf/erff are within 2 ulp;
-- bf16/f16: one rounding of nearly equal f32 values can land one ulp apart).
-- An op the CPU rejects must be rejected on the GPU with the same message.
local ember = require "ember"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local cmp = dofile(here .. "compare.lua")

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local N = 4099   -- not a multiple of 8: the vector body and the scalar tail both run
local FLOATS = {"f32", "bf16", "f16", "f64"}
local INTS = {"i32", "i64", "u8"}
local ALL = {"f32", "bf16", "f16", "f64", "i32", "i64", "u8", "bool"}

local function is_float(dt) return dt == "f32" or dt == "f64" or dt == "bf16" or dt == "f16" end

-- Values of dtype dt on the CPU: floats are multiples of 0.5 in [-4, 4] (so
-- comparisons, maximum/minimum and round see ties), integers small, u8 0..255.
local function vals(dt, shape)
  if is_float(dt) then return (ember.randn(shape, {dtype = "f64"}) * 2):round():mul(0.5):to(dt) end
  if dt == "bool" then return ember.rand(shape):lt(0.5) end
  if dt == "u8" then return ember.randint(0, 256, shape):to(dt) end
  return ember.randint(-20, 21, shape):to(dt)
end
local function smooth(dt, shape) return ember.randn(shape, {dtype = "f64"}):to(dt) end

local function gpu(x) if type(x) == "number" then return x end return x:to("cuda") end

-- Run f on CPU inputs and on their CUDA copies; the results must agree (or
-- both raise the same error). Returns the GPU result.
local function agree(what, f, ...)
  local ins, g = {...}, {}
  for i = 1, select("#", ...) do g[i] = gpu(ins[i]) end
  local ok, ref = pcall(f, table.unpack(ins, 1, select("#", ...)))
  local gok, out = pcall(f, table.unpack(g, 1, select("#", ...)))
  if not ok then
    assert.is_false(gok, what .. ": the CPU raised (" .. tostring(ref) .. ") but the GPU did not")
    assert.are.equal((tostring(ref):gsub("^.-:%d+: ", "")), (tostring(out):gsub("^.-:%d+: ", "")))
    return nil
  end
  assert(gok, what .. ": " .. tostring(out))
  assert.are.equal("cuda:0", out.device, what .. ": device")
  assert.are.equal(ref.dtype, out.dtype, what .. ": dtype")
  cmp.assert_close(out, ref, cmp.rtol(ref.dtype), what)
  return out
end

local BINOPS = {"add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
                "logical_and", "logical_or"}
local UNOPS = {"neg", "abs", "sqrt", "rsqrt", "exp", "log", "tanh", "sigmoid", "silu", "relu", "gelu", "sin",
               "cos", "square", "reciprocal", "sign", "logical_not", "floor", "ceil", "round"}

describe("binary ops on CUDA", function()
  for _, op in ipairs(BINOPS) do
    it(op .. " of two contiguous tensors, every dtype", function()
      ember.manual_seed(1)
      for _, dt in ipairs(ALL) do
        local a, b = vals(dt, {N}), vals(dt, {N})
        if op == "pow" and not is_float(dt) and dt ~= "bool" then b = ember.randint(0, 5, {N}):to(dt) end
        agree(op .. " " .. dt, function(x, y) return ember[op](x, y) end, a, b)
      end
    end)

    it(op .. " with a Lua number on either side", function()
      ember.manual_seed(2)
      for _, dt in ipairs(ALL) do
        local a = vals(dt, {N})
        for _, s in ipairs({3, 2.5, -1}) do
          agree(op .. " " .. dt .. " OP " .. s, function(x) return ember[op](x, s) end, a)
          agree(s .. " OP " .. op .. " " .. dt, function(x) return ember[op](s, x) end, a)
        end
      end
    end)
  end

  it("computes smooth f32/bf16/f16/f64 values (not only half-integers)", function()
    ember.manual_seed(3)
    for _, dt in ipairs(FLOATS) do
      local a, b = smooth(dt, {N}), smooth(dt, {N})
      local pos = (ember.rand({N}, {dtype = "f64"}) * 1.5 + 0.5):to(dt)
      for _, op in ipairs({"add", "sub", "mul", "div", "maximum", "minimum"}) do
        agree(op .. " " .. dt, function(x, y) return ember[op](x, y) end, a, b)
      end
      agree("pow " .. dt, function(x, y) return x ^ y end, pos, b)
    end
  end)

  it("broadcasts (3,1,5) with (4,1), (1,5) and a 0-d tensor", function()
    ember.manual_seed(4)
    for _, dt in ipairs({"f32", "bf16", "i64"}) do
      local a = vals(dt, {3, 1, 5})
      agree("(3,1,5)+(4,1) " .. dt, function(x, y) return x + y end, a, vals(dt, {4, 1}))
      agree("(3,1,5)*(1,5) " .. dt, function(x, y) return x * y end, a, vals(dt, {1, 5}))
      agree("(3,1,5)-0d " .. dt, function(x, y) return x - y end, a, vals(dt, {}))
      agree("0d*(N) " .. dt, function(x, y) return x * y end, vals(dt, {}), vals(dt, {N}))
    end
  end)

  it("promotes mixed dtypes as the CPU does (f32+bf16, i32+f16, bool+i64, u8*i32, f32 0-d with bf16)", function()
    ember.manual_seed(5)
    local pairs_ = {{"f32", "bf16"}, {"i32", "f16"}, {"bool", "i64"}, {"u8", "i32"}, {"f64", "f32"}}
    for _, p in ipairs(pairs_) do
      agree(p[1] .. "+" .. p[2], function(x, y) return x + y end, vals(p[1], {N}), vals(p[2], {N}))
      agree(p[1] .. "<" .. p[2], function(x, y) return x:lt(y) end, vals(p[1], {N}), vals(p[2], {N}))
    end
    agree("bf16 * f32 0-d", function(x, y) return x * y end, vals("bf16", {N}), ember.tensor(1.25))
  end)

  it("reads transposed, narrowed (unaligned) and expanded inputs", function()
    ember.manual_seed(6)
    local a, b = smooth("f32", {64, 48}), smooth("f32", {48, 64})
    agree("a + b^T", function(x, y) return x + y:t() end, a, b)
    agree("narrow offset 1 (unaligned fast path)", function(x) return x:narrow(0, 1, N - 1) * 3 end, smooth("f32", {N}))
    agree("bf16 narrow offset 3", function(x, y) return x:narrow(0, 3, N - 3) + y:narrow(0, 0, N - 3) end,
      smooth("bf16", {N}), smooth("bf16", {N}))
    agree("expanded row", function(x, y) return x:expand(64, 48) - y end, smooth("f32", {1, 48}), a)
  end)

  it("writes into out= (with the same-kind cast rule) and in place", function()
    ember.manual_seed(7)
    for _, dt in ipairs({"f32", "bf16", "f16", "i32"}) do
      agree("add_ " .. dt, function(x, y) local c = x:clone(); c:add_(y); return c end, vals(dt, {N}), vals(dt, {N}))
    end
    agree("f32 result into a bf16 out", function(x, y, o) ember.add(x, y, {out = o}); return o end,
      smooth("f32", {N}), smooth("f32", {N}), ember.zeros({N}, {dtype = "bf16"}))
    agree("into a transposed out", function(x, y, o) local t = o:t(); ember.mul(x, y, {out = t}); return o end,
      smooth("f32", {40, 30}), smooth("f32", {40, 30}), ember.zeros({30, 40}))
    agree("comparison into an f32 out", function(x, y, o) ember.lt(x, y, {out = o}); return o end,
      vals("f32", {N}), vals("f32", {N}), ember.zeros({N}))
    -- rejected the same way on both devices
    agree("float result into an integer out", function(x, y, o) return ember.add(x, y, {out = o}) end,
      smooth("f32", {8}), smooth("f32", {8}), ember.zeros({8}, {dtype = "i32"}))
  end)

  it("writes correctly when an input overlaps the output shifted by one", function()
    ember.manual_seed(8)
    agree("x[1:] += x[:-1]", function(x)
      local c = x:clone()
      c:narrow(0, 1, N - 1):add_(c:narrow(0, 0, N - 1))
      return c
    end, smooth("f32", {N}))
  end)
end)

describe("unary ops on CUDA", function()
  -- the rounding ties and signed zeros, then random values (negatives give NaN for sqrt/log on both)
  local special = {-2.5, -1.5, -0.5, -0.0, 0.0, 0.5, 1.5, 2.5, 1e-3, -1e-3, 30, -30}
  for _, op in ipairs(UNOPS) do
    it(op .. " on every dtype", function()
      ember.manual_seed(9)
      for _, dt in ipairs(ALL) do
        local a
        if is_float(dt) then
          a = ember.cat({ember.tensor(special, {dtype = "f64"}), ember.randn({N}, {dtype = "f64"}) * 3}):to(dt)
        else
          a = vals(dt, {N})
        end
        agree(op .. " " .. dt, function(x) return x[op](x) end, a)
      end
    end)
  end

  it("runs in place on a strided view", function()
    ember.manual_seed(10)
    agree("exp_ on a transpose", function(x) local c = x:clone(); c:t():exp_(); return c end, smooth("f32", {33, 65}))
  end)
end)

describe("clamp, where, masked_fill on CUDA", function()
  it("clamps floats and integers with both, one, or fractional bounds", function()
    ember.manual_seed(11)
    for _, dt in ipairs({"f32", "bf16", "f16", "f64", "i32", "i64", "u8"}) do
      local a = vals(dt, {N})
      agree("clamp(-1, 2) " .. dt, function(x) return x:clamp(-1, 2) end, a)
      agree("clamp(0.5) " .. dt, function(x) return x:clamp(0.5) end, a)
      agree("clamp(nil, 1) " .. dt, function(x) return x:clamp(nil, 1) end, a)
      agree("clamp_ " .. dt, function(x) local c = x:clone(); c:clamp_(-2, 3); return c end, a)
    end
  end)

  it("selects with where over broadcast shapes, dtypes and a scalar branch", function()
    ember.manual_seed(12)
    local c = ember.rand({5, 1, 7}):lt(0.5)
    for _, dt in ipairs({"f32", "bf16", "i64", "bool"}) do
      agree("where " .. dt, function(m, x, y) return ember.where(m, x, y) end, c, vals(dt, {4, 7}), vals(dt, {5, 4, 1}))
    end
    agree("where with a number", function(m, x) return ember.where(m, x, -0.25) end, c, vals("f32", {5, 3, 7}))
    agree("where f32/bf16 promotes", function(m, x, y) return ember.where(m, x, y) end, c, vals("f32", {7}), vals("bf16", {7}))
    -- same-shape contiguous operands: the mixed-storage kernel reads the bool condition 8 bytes at a time
    local cc = ember.rand({4099}):lt(0.5)
    for _, dt in ipairs({"bf16", "f16", "f32"}) do
      agree("where same shape " .. dt, function(m, x, y) return ember.where(m, x, y) end, cc, vals(dt, {4099}), vals(dt, {4099}))
      agree("masked_fill same shape " .. dt, function(x, k) return x:masked_fill(k, -2.5) end, vals(dt, {4099}), cc)
    end
    agree("where with a u8 condition", function(m, x, y) return ember.where(m, x, y) end, cc:to("u8"), vals("bf16", {4099}),
      vals("bf16", {4099}))
  end)

  it("fills under a broadcast mask, out of place and in place", function()
    ember.manual_seed(13)
    for _, dt in ipairs({"f32", "bf16", "i32", "bool"}) do
      local a, m = vals(dt, {6, 5, 9}), ember.rand({5, 1}):lt(0.5)
      agree("masked_fill " .. dt, function(x, k) return x:masked_fill(k, 1) end, a, m)
      agree("masked_fill_ " .. dt, function(x, k) local c = x:clone(); c:masked_fill_(k, 0); return c end, a, m)
    end
    agree("masked_fill with -inf (attention mask)", function(x, k) return x:masked_fill(k, -math.huge) end,
      smooth("f32", {8, 8}), ember.ones({8, 8}):triu(1):ne(0))
  end)
end)

describe("the vector paths' edges on CUDA", function()
  -- bf16/f16 threads keep two 16-byte vectors in flight (v and v + grid
  -- stride) and the kernels are instantiated per operand count: sizes whose
  -- vector count is odd, not a multiple of the block, or a whole block plus
  -- one leave some threads without their second vector, and an n % 8 tail.
  it("writes every element for unary, binary, ternary and where at awkward sizes", function()
    ember.manual_seed(14)
    for _, n in ipairs({8, 9, 2403, 4096 + 8, 65536 * 3 + 7}) do
      local c = ember.rand({n}):lt(0.5)
      for _, dt in ipairs({"bf16", "f16", "f32"}) do
        local a, b, w = smooth(dt, {n}), smooth(dt, {n}), ember.rand({n}):to(dt)
        agree("neg n=" .. n .. " " .. dt, function(x) return -x end, a)
        -- bf16/f16: ew_fixed (the op compiled in) for these
        for _, op in ipairs({"gelu", "silu", "sigmoid", "tanh"}) do
          agree(op .. " n=" .. n .. " " .. dt, function(x) return x[op](x) end, a)
        end
        agree("gelu tanh n=" .. n .. " " .. dt, function(x) return ember.nn.functional.gelu(x, {approximate = "tanh"}) end, a)
        agree("add n=" .. n .. " " .. dt, function(x, y) return x + y end, a, b)
        agree("number - x n=" .. n .. " " .. dt, function(x) return 0.75 - x end, a)
        agree("div n=" .. n .. " " .. dt, function(x, y) return x / y end, a, b)
        agree("maximum n=" .. n .. " " .. dt, function(x, y) return ember.maximum(x, y) end, a, b)
        agree("minimum n=" .. n .. " " .. dt, function(x, y) return ember.minimum(x, y) end, a, b)
        agree("addcmul n=" .. n .. " " .. dt, function(x, y, z) return x:addcmul(y, z, {value = 0.5}) end, a, b, w)
        agree("addcdiv n=" .. n .. " " .. dt, function(x, y, z) return x:addcdiv(y, z, {value = -2}) end, a, b, w)
        agree("lerp by a number n=" .. n .. " " .. dt, function(x, y) return x:lerp(y, 0.3) end, a, b)
        agree("mul n=" .. n .. " " .. dt, function(x, y) return x * y end, a, b)
        agree("mul by a number n=" .. n .. " " .. dt, function(x) return x * 1.5 end, a)
        agree("lerp n=" .. n .. " " .. dt, function(x, y, z) return x:lerp(y, z) end, a, b, w)
        agree("where n=" .. n .. " " .. dt, function(m, x, y) return ember.where(m, x, y) end, c, a, b)
        agree("masked_fill n=" .. n .. " " .. dt, function(x, k) return x:masked_fill(k, -2.5) end, a, c)
      end
    end
  end)

  it("broadcasts along rows (a bias row, a per-row scale, a ternary) at awkward row counts", function()
    -- the rows kernel: every operand unit-stride along the last dim (whole
    -- 16-byte vectors) or constant along it; 72 columns = 9 bf16 vectors, so
    -- a thread's two vectors fall in different rows
    ember.manual_seed(15)
    for _, rows in ipairs({1, 3, 257, 1031}) do
      for _, dt in ipairs({"bf16", "f16", "f32"}) do
        local a, bias, scale = smooth(dt, {rows, 72}), smooth(dt, {72}), smooth(dt, {rows, 1})
        local w = ember.rand({rows, 1}):to(dt)
        agree("x + bias rows=" .. rows .. " " .. dt, function(x, y) return x + y end, a, bias)
        agree("x * per-row scale rows=" .. rows .. " " .. dt, function(x, y) return x * y end, a, scale)
        agree("exp rows of a narrowed view " .. rows .. " " .. dt, function(x) return x:narrow(1, 8, 64):exp() end, a)
        agree("lerp(x, bias, per-row w) rows=" .. rows .. " " .. dt, function(x, y, z) return x:lerp(y, z) end, a, bias, w)
      end
    end
  end)
end)

describe("the bf16/f16 select and row kernels on CUDA (ew_select16, ew_rows2d)", function()
  -- Equal bits to the CPU: a select and a correctly rounded + - * are exact in
  -- f32 and round once, on both devices. Signed zeros and infinities go
  -- through too; 1/x tells -0 from +0 (assert_equal alone would not).
  local function same(what, got, ref)
    cmp.assert_equal(got:cpu(), ref, what)
    cmp.assert_equal(got:cpu():to("f32"):reciprocal(), ref:to("f32"):reciprocal(), what .. " (1/x: signed zeros)")
  end
  -- smooth values with -0, +0, +-inf, NaN, a tiny value and subnormals (bf16
  -- below 1.2e-38, f16 below 6.1e-5) mixed in: ew_select16w selects raw 16-bit
  -- words and redoes a step holding a NaN the f32 way
  local function edgy(dt, n)
    local x, picks = (ember.randn({n}, {dtype = "f64"}) * 3):tolist(),
      {-0.0, 0.0, math.huge, -math.huge, 1e-30, 0 / 0, -1e-40, 3e-6}
    for i = 1, n, 7 do x[i] = picks[(i // 7) % #picks + 1] end
    return ember.tensor(x, {dtype = "f64"}):to(dt)
  end

  it("where and masked_fill agree bit for bit with the CPU at awkward sizes, both branch kinds", function()
    ember.manual_seed(21)
    -- ew_select16: 16 conditions a vector, two vectors a thread; ew_select16w
    -- (the default, EMBER_SELECT16): 8 a vector, four a thread. Sizes below
    -- one vector, odd vector counts, a grid's worth plus a tail, a large one
    for _, n in ipairs({1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48 + 5, 4096 * 3 + 11, 1048576 + 16 * 7 + 3}) do
      local c = ember.rand({n}):lt(0.5)
      for _, dt in ipairs({"bf16", "f16"}) do
        local a, b = edgy(dt, n), edgy(dt, n)
        local gc, ga, gb = c:to("cuda"), a:to("cuda"), b:to("cuda")
        local tag = (" n=%d %s"):format(n, dt)
        same("where" .. tag, ember.where(gc, ga, gb), ember.where(c, a, b))
        same("where, a number first" .. tag, ember.where(gc, 0.1, gb), ember.where(c, 0.1, b))
        same("where, a number second" .. tag, ember.where(gc, ga, -0.0), ember.where(c, a, -0.0))
        same("masked_fill 0.1" .. tag, ga:masked_fill(gc, 0.1), a:masked_fill(c, 0.1))
        same("masked_fill -inf" .. tag, ga:masked_fill(gc, -math.huge), a:masked_fill(c, -math.huge))
        same("masked_fill NaN" .. tag, ga:masked_fill(gc, 0 / 0), a:masked_fill(c, 0 / 0))
        same("where, a NaN number second" .. tag, ember.where(gc, ga, 0 / 0), ember.where(c, a, 0 / 0))
        local ip = ga:clone(); ip:masked_fill_(gc, 3)
        local ic = a:clone(); ic:masked_fill_(c, 3)
        same("masked_fill_" .. tag, ip, ic)
      end
    end
  end)

  it("where's backward (one branch a zero) agrees with the CPU in bf16", function()
    ember.manual_seed(22)
    local n = 4096 + 40
    local c, g = ember.rand({n}):lt(0.5), ember.randn({n}):to("bf16")
    local function grads(device)
      local x = ember.randn({n}, {dtype = "f64"}):to("bf16"):to(device)
      local y = x:clone()
      x.requires_grad, y.requires_grad = true, true
      ember.where(c:to(device), x, y):backward(g:to(device))
      return x.grad, y.grad
    end
    ember.manual_seed(23); local gx, gy = grads("cuda")
    ember.manual_seed(23); local rx, ry = grads("cpu")
    same("where grad of a", gx, rx)
    same("where grad of b", gy, ry)
  end)

  it("per-row values in f32 (outer, a per-row scale: ew_rows2d) agree bit for bit with the CPU", function()
    ember.manual_seed(25)
    for _, shape in ipairs({{1, 4}, {5, 8}, {257, 36}, {1031, 72}, {2049, 768}}) do
      local rows, cols = shape[1], shape[2]
      local x, row, col = edgy("f32", rows * cols):reshape({rows, cols}), edgy("f32", cols), edgy("f32", rows)
      local gx, grow, gcol = x:to("cuda"), row:to("cuda"), col:to("cuda")
      local tag = (" (%d,%d) f32"):format(rows, cols)
      same("outer" .. tag, ember.outer(gcol, grow), ember.outer(col, row))
      same("x * per-row scale" .. tag, gx * gcol:reshape({rows, 1}), x * col:reshape({rows, 1}))
      same("per-row value - x" .. tag, gcol:reshape({rows, 1}) - gx, col:reshape({rows, 1}) - x)
    end
  end)

  -- ew_outer2d (issue 12): a per-row value op a row broadcast down the rows, f32/bf16/f16, at least
  -- 128 column vectors. 4 rows a thread (a single short block; a partial x block) and 16 (5 x blocks,
  -- the last partial; 1 block wide with 130 of 256 threads busy), the last row block partial; the
  -- per-row operand first (outer) and second (a row op a per-row value), and a per-row i32 operand.
  it("outer-like broadcasts (ew_outer2d) agree bit for bit with the CPU, 4 and 16 rows a thread", function()
    ember.manual_seed(26)
    for _, c in ipairs({{3, 1024, "f32"}, {1031, 1100 * 4, "f32"}, {6563, 1028 * 4, "f32"},
                        {129, 4096, "bf16"}, {32773, 130 * 8, "bf16"}, {2051, 200 * 8, "f16"}}) do
      local rows, cols, dt = c[1], c[2], c[3]
      local col, row = ember.randn({rows}):to(dt), ember.randn({cols}):to(dt)
      local gcol, grow = col:to("cuda"), row:to("cuda")
      local tag = (" (%d,%d) %s"):format(rows, cols, dt)
      cmp.assert_same_bits(ember.outer(gcol, grow), ember.outer(col, row), "outer" .. tag)
      cmp.assert_same_bits(grow:reshape({1, cols}) - gcol:reshape({rows, 1}),
        row:reshape({1, cols}) - col:reshape({rows, 1}), "row - per-row value" .. tag)
      cmp.assert_same_bits(gcol:reshape({rows, 1}) + grow, col:reshape({rows, 1}) + row, "per-row value + row" .. tag)
      local ic = ember.randint(-50, 50, {rows, 1}):to("i32")
      cmp.assert_same_bits(ic:cuda() * grow, ic * row, "i32 per-row value * row" .. tag)
    end
  end)

  it("row-broadcast ops agree bit for bit with the CPU over row counts, widths and views", function()
    ember.manual_seed(24)
    -- widths: one 8-element vector a row, 9 (a thread count that is no
    -- multiple of the row), 96 (the small model's 768), 512 (4096); rows
    -- that leave a thread's second row past the end
    for _, shape in ipairs({{1, 8}, {5, 8}, {257, 72}, {1031, 72}, {3, 768}, {2049, 768}, {129, 4096}}) do
      local rows, cols = shape[1], shape[2]
      for _, dt in ipairs({"bf16", "f16"}) do
        local x, bias = edgy(dt, rows * cols):reshape({rows, cols}), edgy(dt, cols)
        local gx, gb = x:to("cuda"), bias:to("cuda")
        local tag = (" (%d,%d) %s"):format(rows, cols, dt)
        same("x + bias" .. tag, gx + gb, x + bias)
        same("bias - x" .. tag, gb - gx, bias - x)
        same("x * bias" .. tag, gx * gb, x * bias)
        same("x + bias, in place" .. tag, gx:clone():add_(gb), x:clone():add_(bias))
        -- a per-row value (stride 0 along cols): outer, a per-row scale, a per-row value first
        local col = edgy(dt, rows)
        local gcol = col:to("cuda")
        same("outer" .. tag, ember.outer(gcol, gb), ember.outer(col, bias))
        same("x * per-row scale" .. tag, gx * gcol:reshape({rows, 1}), x * col:reshape({rows, 1}))
        same("per-row value - x" .. tag, gcol:reshape({rows, 1}) - gx, col:reshape({rows, 1}) - x)
        same("where, per-row branch" .. tag, ember.where(gx:gt(0), gcol:reshape({rows, 1}), gx),
          ember.where(x:gt(0), col:reshape({rows, 1}), x))
        if cols > 8 then   -- a narrowed view (row stride cols, 8 columns in) and a number
          same("narrowed view * 2" .. tag, gx:narrow(1, 8, cols - 8) * 2, x:narrow(1, 8, cols - 8) * 2)
          same("narrowed view + narrowed bias" .. tag, gx:narrow(1, 8, cols - 8) + gb:narrow(0, 0, cols - 8),
            x:narrow(1, 8, cols - 8) + bias:narrow(0, 0, cols - 8))
        end
      end
    end
  end)
end)

describe("triu / tril on CUDA", function()
  it("keeps the triangle for several diagonals, batches, dtypes and a transposed input", function()
    ember.manual_seed(14)
    for _, dt in ipairs({"f32", "bf16", "i64", "bool", "f64"}) do
      for _, k in ipairs({-2, 0, 1, 3}) do
        agree("triu " .. dt .. " " .. k, function(x) return x:triu(k) end, vals(dt, {5, 7}))
        agree("tril " .. dt .. " " .. k, function(x) return x:tril(k) end, vals(dt, {2, 3, 4, 6}))
      end
    end
    agree("tril of a transpose", function(x) return x:t():tril() end, smooth("f32", {9, 6}))
  end)
end)

describe("fused unary gradients on CUDA", function()
  local DIFF = {"abs", "sqrt", "rsqrt", "exp", "log", "tanh", "sigmoid", "silu", "relu", "gelu", "sin", "cos",
                "square", "reciprocal", "neg"}
  for _, dt in ipairs({"f32", "bf16", "f64"}) do
    it("matches the CPU's backward of every differentiable unary op and clamp [" .. dt .. "]", function()
      ember.manual_seed(15)
      local base = (ember.rand({N}, {dtype = "f64"}) * 2 + 0.25)   -- positive: sqrt/log/rsqrt defined
      local sign = ember.rand({N}, {dtype = "f64"}):lt(0.5):to("f64") * 2 - 1
      local w = ember.randn({N}, {dtype = "f64"}):to(dt)
      for _, op in ipairs(DIFF) do
        local v = (op == "sqrt" or op == "rsqrt" or op == "log") and base or base * sign
        local function grad_on(device)
          local x = v:to({dtype = dt, device = device}):clone()   -- a fresh leaf on both sides
          x.requires_grad = true
          local y = op == "neg" and -x or x[op](x)
          local loss = (y * w:to(device)):sum()
          loss:backward()
          return x.grad
        end
        local g, ref = grad_on("cuda"), grad_on("cpu")
        assert.are.equal("cuda:0", g.device)
        cmp.assert_close(g, ref, cmp.rtol(dt), op .. " gradient " .. dt)
      end
      local function clamp_grad(device)
        local x = (base * sign):to({dtype = dt, device = device}):clone()
        x.requires_grad = true
        local loss = (x:clamp(-1, 1) * w:to(device)):sum()
        loss:backward()
        return x.grad
      end
      cmp.assert_close(clamp_grad("cuda"), clamp_grad("cpu"), cmp.rtol(dt), "clamp gradient " .. dt)
      local function gelu_tanh_grad(device)   -- bf16: ew_fixed's EM_EW_G_GELU_TANH
        local x = (base * sign):to({dtype = dt, device = device}):clone()
        x.requires_grad = true
        local loss = (ember.nn.functional.gelu(x, {approximate = "tanh"}) * w:to(device)):sum()
        loss:backward()
        return x.grad
      end
      cmp.assert_close(gelu_tanh_grad("cuda"), gelu_tanh_grad("cpu"), cmp.rtol(dt), "gelu tanh gradient " .. dt)
    end)
  end
end)
