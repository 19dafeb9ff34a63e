-- op_cases.lua — the op-test registry: one entry per differentiable op case,
-- shared by every mode that wants to iterate "all the ops" (STYLE.md: one
-- op-test registry). gradcheck_spec.lua checks each case's gradients against
-- finite differences on f64 CPU inputs; a GPU spec can build the same inputs
-- on "cuda" and compare against the CPU, and a micro-benchmark can time fn.
--
--   local cases = dofile("tests/lua/op_cases.lua")
--   for _, c in ipairs(cases) do
--     local inputs = cases.make_inputs(c, {dtype = "f64", device = "cpu"})
--     local y = c.fn(table.unpack(inputs))
--   end
--
-- An entry is {name =, op =, fn =, inputs =, gradcheck = {atol =, rtol =}}:
--   name       what the case checks, read as a test title
--   op         the API op it covers (gradcheck_spec checks that every
--              differentiable op of API.md has at least one case)
--   fn         function(inputs...) -> tensor
--   inputs     function(T) -> list of inputs, built with the factory T below
--              so that dtype/device/requires_grad come from the caller
--   gradcheck  optional tolerances for ember.autograd.gradcheck
-- Inputs avoid kinks: abs/relu/clamp/maximum/max inputs are kept at least
-- 0.1 away from their non-differentiable points (eps is 1e-6), and
-- sqrt/log/div see values bounded away from 0.

local ember = require "ember"
local F = ember.nn.functional

local cases = {}

local function case(name, op, fn, inputs, gradcheck)
  cases[#cases + 1] = {name = name, op = op, fn = fn, inputs = inputs, gradcheck = gradcheck}
end

---------------------------------------------------------------------------
-- the input factory
---------------------------------------------------------------------------

local function numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

-- T: builds inputs on CPU in f64, then converts to the requested dtype/device.
-- Float inputs are leaves with requires_grad (unless o.requires_grad == false);
-- integer/bool inputs (ids, targets, masks) never require grad.
local function factory(o)
  o = o or {}
  local dtype, device = o.dtype or "f64", o.device or "cpu"
  local rg = o.requires_grad ~= false
  local T = {}

  local function leaf(t64) return ember.tensor(t64, {dtype = dtype, device = device, requires_grad = rg}) end
  local function from_list(list, shape)
    return ember.tensor(list, {dtype = "f64"}):view(shape)
  end

  --- standard normal leaf
  function T.randn(shape) return leaf(ember.randn(shape, {dtype = "f64"})) end
  --- uniform in [lo, hi)
  function T.uniform(shape, lo, hi)
    return leaf(ember.rand(shape, {dtype = "f64"}) * (hi - lo) + lo)
  end
  --- normal values pushed at least `gap` away from every point in `points`
  function T.away(shape, points, gap)
    local v = ember.randn(numel(shape), {dtype = "f64"}):tolist()
    for i, x in ipairs(v) do
      for _ = 1, #points do          -- repeat: moving off one point may land near another
        for _, p in ipairs(points) do
          if math.abs(x - p) < gap then x = p + (x >= p and gap or -gap) * 1.5 end
        end
      end
      v[i] = x
    end
    return leaf(from_list(v, shape))
  end
  --- values at least `spacing` apart (no ties for max/min), in shuffled order
  function T.distinct(shape, spacing)
    local n = numel(shape)
    local p = 7
    while n % p == 0 or p % n == 0 do p = p + 2 end   -- a step coprime with n
    local noise = ember.rand(n, {dtype = "f64"}):tolist()
    local v = {}
    for k = 0, n - 1 do
      v[k + 1] = ((k * p) % n - n / 2) * spacing + (noise[k + 1] - 0.5) * spacing * 0.3
    end
    return leaf(from_list(v, shape))
  end
  --- a leaf with these exact values
  function T.values(list, shape) return leaf(from_list(list, shape or {#list})) end
  --- a float tensor of the working dtype that does not require grad
  function T.const(shape) return ember.randn(shape, {dtype = "f64"}):to({dtype = dtype, device = device}) end
  --- integer ids in [0, n) (i64)
  function T.ids(shape, n) return ember.randint(0, n, shape):to(device) end
  --- an i64 tensor with these exact values
  function T.long(list) return ember.tensor(list, {dtype = "i64"}):to(device) end
  --- positions 0..n-1 (i64)
  function T.positions(n) return ember.arange(n):to(device) end
  --- a bool mask with about half the entries set
  function T.mask(shape) return ember.rand(shape):lt(0.5):to(device) end
  return T
end

-- Deterministic seed per case (so adding a case does not change the others).
local function seed_of(name)
  local h = 5381
  for i = 1, #name do h = (h * 33 + name:byte(i)) % 2147483647 end
  return h
end

---------------------------------------------------------------------------
-- elementwise binary
---------------------------------------------------------------------------

case("add broadcasts (2,3) + (3)", "add",
  function(a, b) return a + b end,
  function(T) return {T.randn({2, 3}), T.randn({3})} end)
case("add method with a scalar", "add",
  function(a) return a:add(1.5) end,
  function(T) return {T.randn({2, 3})} end)
case("sub broadcasts (2,1,3) - (4,1)", "sub",
  function(a, b) return a - b end,
  function(T) return {T.randn({2, 1, 3}), T.randn({4, 1})} end)
case("sub with the scalar first (2 - a)", "sub",
  function(a) return 2 - a end,
  function(T) return {T.randn({3})} end)
case("mul broadcasts (3,1) * (1,4)", "mul",
  function(a, b) return a * b end,
  function(T) return {T.randn({3, 1}), T.randn({1, 4})} end)
case("mul of a tensor with itself", "mul",
  function(a) return a * a end,
  function(T) return {T.randn({2, 3})} end)
case("div broadcasts (2,3) / (3)", "div",
  function(a, b) return a / b end,
  function(T) return {T.randn({2, 3}), T.away({3}, {0}, 0.5)} end)
case("div with the scalar first (1 / a)", "div",
  function(a) return 1 / a end,
  function(T) return {T.away({2, 3}, {0}, 0.5)} end)
case("pow with tensor base and exponent", "pow",
  function(a, b) return a ^ b end,
  function(T) return {T.uniform({2, 3}, 0.5, 2), T.randn({2, 3})} end)
case("pow with a scalar exponent (a ^ 3)", "pow",
  function(a) return a:pow(3) end,
  function(T) return {T.randn({2, 3})} end)
case("pow with a fractional exponent on a positive base (a ^ 2.5)", "pow",
  function(a) return a ^ 2.5 end,
  function(T) return {T.uniform({4}, 0.5, 2)} end)
case("pow with a scalar base (2 ^ a)", "pow",
  function(a) return 2 ^ a end,
  function(T) return {T.randn({4})} end)
case("maximum broadcasts (2,3) vs (3), away from ties", "maximum",
  function(a, b) return ember.maximum(a, b) end,
  function(T) return {T.away({2, 3}, {-0.3, 0.2, 0.7}, 0.1), T.values({-0.3, 0.2, 0.7})} end)
case("minimum broadcasts (2,3) vs (3), away from ties", "minimum",
  function(a, b) return ember.minimum(a, b) end,
  function(T) return {T.away({2, 3}, {-0.3, 0.2, 0.7}, 0.1), T.values({-0.3, 0.2, 0.7})} end)

---------------------------------------------------------------------------
-- elementwise unary
---------------------------------------------------------------------------

local function unary(op, make)
  case(op, op, function(a) return a[op](a) end, make)
end
unary("neg", function(T) return {T.randn({2, 3})} end)
unary("abs", function(T) return {T.away({2, 3}, {0}, 0.1)} end)
unary("sqrt", function(T) return {T.uniform({2, 3}, 0.5, 2)} end)
unary("rsqrt", function(T) return {T.uniform({2, 3}, 0.5, 2)} end)
unary("exp", function(T) return {T.randn({2, 3})} end)
unary("log", function(T) return {T.uniform({2, 3}, 0.5, 2)} end)
unary("tanh", function(T) return {T.randn({2, 3})} end)
unary("sigmoid", function(T) return {T.randn({2, 3})} end)
unary("silu", function(T) return {T.randn({2, 3})} end)
unary("relu", function(T) return {T.away({2, 3}, {0}, 0.1)} end)
unary("gelu", function(T) return {T.randn({2, 3})} end)
unary("sin", function(T) return {T.randn({2, 3})} end)
unary("cos", function(T) return {T.randn({2, 3})} end)
unary("square", function(T) return {T.randn({2, 3})} end)
unary("reciprocal", function(T) return {T.away({2, 3}, {0}, 0.5)} end)
case("unary minus operator", "neg",
  function(a) return -a end,
  function(T) return {T.randn({3})} end)
case("clamp(-0.5, 0.5), away from both bounds", "clamp",
  function(a) return a:clamp(-0.5, 0.5) end,
  function(T) return {T.away({3, 4}, {-0.5, 0.5}, 0.1)} end)
case("clamp with only a lower bound", "clamp",
  function(a) return a:clamp(0.2) end,
  function(T) return {T.away({3, 4}, {0.2}, 0.1)} end)
case("clamp with only an upper bound", "clamp",
  function(a) return a:clamp(nil, -0.1) end,
  function(T) return {T.away({3, 4}, {-0.1}, 0.1)} end)
case("where broadcasts a (2,3) and b (3) under a bool condition", "where",
  function(c, a, b) return ember.where(c, a, b) end,
  function(T) return {T.mask({2, 3}), T.randn({2, 3}), T.randn({3})} end)
case("where with a scalar branch", "where",
  function(c, a) return ember.where(c, a, 0.5) end,
  function(T) return {T.mask({2, 3}), T.randn({2, 3})} end)
case("masked_fill zeroes the gradient where the mask is set", "masked_fill",
  function(a, m) return a:masked_fill(m, -2) end,
  function(T) return {T.randn({2, 3}), T.mask({2, 3})} end)
case("masked_fill with a broadcast mask (1,3)", "masked_fill",
  function(a, m) return a:masked_fill(m, 0) end,
  function(T) return {T.randn({2, 3}), T.mask({1, 3})} end)
case("triu(1) keeps the strict upper triangle", "triu",
  function(a) return a:triu(1) end,
  function(T) return {T.randn({4, 4})} end)
case("tril(-1) of a batch of rectangular matrices", "tril",
  function(a) return a:tril(-1) end,
  function(T) return {T.randn({2, 3, 4})} end)
case("tril() keeps the diagonal", "tril",
  function(a) return ember.tril(a) end,
  function(T) return {T.randn({3, 3})} end)

---------------------------------------------------------------------------
-- reductions
---------------------------------------------------------------------------

case("sum over all elements", "sum",
  function(a) return a:sum() end,
  function(T) return {T.randn({2, 3, 4})} end)
case("sum over one dim", "sum",
  function(a) return a:sum(1) end,
  function(T) return {T.randn({2, 3, 4})} end)
case("sum over several dims {0, 2}", "sum",
  function(a) return a:sum({0, 2}) end,
  function(T) return {T.randn({2, 3, 4})} end)
case("sum over a negative dim with keepdim", "sum",
  function(a) return a:sum(-1, {keepdim = true}) end,
  function(T) return {T.randn({2, 3, 4})} end)
case("mean over all elements", "mean",
  function(a) return a:mean() end,
  function(T) return {T.randn({2, 3, 4})} end)
case("mean over one dim", "mean",
  function(a) return a:mean(-1) end,
  function(T) return {T.randn({2, 3, 4})} end)
case("mean over several dims with keepdim", "mean",
  function(a) return a:mean({0, 1}, {keepdim = true}) end,
  function(T) return {T.randn({2, 3, 4})} end)
case("max over a dim (values), no ties", "max",
  function(a) local v = a:max(1); return v end,
  function(T) return {T.distinct({3, 4}, 0.3)} end)
case("max over a dim with keepdim", "max",
  function(a) local v = a:max(0, {keepdim = true}); return v end,
  function(T) return {T.distinct({3, 4}, 0.3)} end)
case("max over all elements", "max",
  function(a) return a:max() end,
  function(T) return {T.distinct({3, 4}, 0.3)} end)
case("min over a dim (values), no ties", "min",
  function(a) local v = a:min(-1); return v end,
  function(T) return {T.distinct({3, 4}, 0.3)} end)
case("min over all elements", "min",
  function(a) return a:min() end,
  function(T) return {T.distinct({2, 5}, 0.3)} end)
case("var over all elements (unbiased)", "var",
  function(a) return a:var() end,
  function(T) return {T.randn({3, 4})} end)
case("var over one dim", "var",
  function(a) return a:var(1) end,
  function(T) return {T.randn({3, 4})} end)
case("var with correction 0 and keepdim", "var",
  function(a) return a:var(0, {correction = 0, keepdim = true}) end,
  function(T) return {T.randn({3, 4})} end)
case("logsumexp over the last dim", "logsumexp",
  function(a) return a:logsumexp(-1) end,
  function(T) return {T.randn({3, 4})} end)
case("logsumexp over dim 0 with keepdim", "logsumexp",
  function(a) return a:logsumexp(0, {keepdim = true}) end,
  function(T) return {T.randn({3, 4})} end)
case("softmax over the last dim", "softmax",
  function(a) return a:softmax(-1) end,
  function(T) return {T.randn({2, 3, 4})} end)
case("softmax over dim 0", "softmax",
  function(a) return a:softmax(0) end,
  function(T) return {T.randn({3, 4})} end)
case("log_softmax over the last dim", "log_softmax",
  function(a) return a:log_softmax(-1) end,
  function(T) return {T.randn({2, 3, 4})} end)
case("log_softmax over dim 1", "log_softmax",
  function(a) return F.log_softmax(a, 1) end,
  function(T) return {T.randn({2, 3, 4})} end)

---------------------------------------------------------------------------
-- matmul
---------------------------------------------------------------------------

case("matmul 2-D (3,4) @ (4,2)", "matmul",
  function(a, b) return a:matmul(b) end,
  function(T) return {T.randn({3, 4}), T.randn({4, 2})} end)
case("matmul batched with broadcast (2,1,3,4) @ (3,4,2)", "matmul",
  function(a, b) return a:matmul(b) end,
  function(T) return {T.randn({2, 1, 3, 4}), T.randn({3, 4, 2})} end)
case("matmul 3-D @ 2-D (2,3,4) @ (4,5)", "matmul",
  function(a, b) return ember.matmul(a, b) end,
  function(T) return {T.randn({2, 3, 4}), T.randn({4, 5})} end)
case("matmul 1-D @ 2-D (4) @ (4,2)", "matmul",
  function(a, b) return a:matmul(b) end,
  function(T) return {T.randn({4}), T.randn({4, 2})} end)
case("matmul 2-D @ 1-D (3,4) @ (4)", "matmul",
  function(a, b) return a:matmul(b) end,
  function(T) return {T.randn({3, 4}), T.randn({4})} end)
case("matmul 1-D @ 1-D is a dot product", "matmul",
  function(a, b) return a:matmul(b) end,
  function(T) return {T.randn({5}), T.randn({5})} end)
case("matmul batched @ 1-D (2,3,4) @ (4)", "matmul",
  function(a, b) return a:matmul(b) end,
  function(T) return {T.randn({2, 3, 4}), T.randn({4})} end)
case("matmul with a transposed (non-contiguous) operand", "matmul",
  function(a, b) return a:matmul(b:t()) end,
  function(T) return {T.randn({3, 4}), T.randn({2, 4})} end)

---------------------------------------------------------------------------
-- neural-net ops
---------------------------------------------------------------------------

case("F.linear with bias, (2,3,4) x (5,4) + (5)", "linear",
  function(x, w, b) return F.linear(x, w, b) end,
  function(T) return {T.randn({2, 3, 4}), T.randn({5, 4}), T.randn({5})} end)
case("F.linear without bias", "linear",
  function(x, w) return F.linear(x, w) end,
  function(T) return {T.randn({3, 4}), T.randn({2, 4})} end)
case("F.embedding: gradient w.r.t. the weight, repeated ids accumulate", "embedding",
  function(w, ids) return F.embedding(ids, w) end,
  function(T)
    return {T.randn({5, 4}), T.long({{0, 2, 2}, {4, 0, 1}})}
  end)
case("F.cross_entropy over (2,3,5) logits", "cross_entropy",
  function(logits, targets) return F.cross_entropy(logits, targets) end,
  function(T) return {T.randn({2, 3, 5}), T.ids({2, 3}, 5)} end)
case("F.cross_entropy over (4,3) logits", "cross_entropy",
  function(logits, targets) return F.cross_entropy(logits, targets) end,
  function(T) return {T.randn({4, 3}), T.ids({4}, 3)} end)
case("F.rmsnorm with a weight", "rmsnorm",
  function(x, w) return F.rmsnorm(x, w) end,
  function(T) return {T.randn({2, 3, 8}), T.randn({8})} end)
case("F.rmsnorm without a weight, larger eps", "rmsnorm",
  function(x) return F.rmsnorm(x, nil, 0.1) end,
  function(T) return {T.randn({3, 6})} end)
case("F.layer_norm with weight and bias", "layer_norm",
  function(x, w, b) return F.layer_norm(x, 8, w, b) end,
  function(T) return {T.randn({2, 3, 8}), T.randn({8}), T.randn({8})} end)
case("F.layer_norm without weight or bias, larger eps", "layer_norm",
  function(x) return F.layer_norm(x, {6}, nil, nil, 0.1) end,
  function(T) return {T.randn({3, 6})} end)
case("F.rope over (2,4,6) with positions 0..3", "rope",
  function(x, pos) return F.rope(x, pos) end,
  function(T) return {T.randn({2, 4, 6}), T.positions(4)} end)
case("F.rope over heads (1,2,4,4) with theta 100", "rope",
  function(x, pos) return F.rope(x, pos, 100) end,
  function(T) return {T.randn({1, 2, 4, 4}), T.positions(4)} end)
case("F.rope with default positions", "rope",
  function(x) return F.rope(x) end,
  function(T) return {T.randn({3, 4})} end)
case("F.swiglu(a, b) = silu(a) * b", "swiglu",
  function(a, b) return F.swiglu(a, b) end,
  function(T) return {T.randn({2, 5}), T.randn({2, 5})} end)
case("F.silu", "silu",
  function(a) return F.silu(a) end,
  function(T) return {T.randn({2, 5})} end)
case("scaled_dot_product_attention, not causal, Tq != Tk, dv != d", "scaled_dot_product_attention",
  function(q, k, v) return F.scaled_dot_product_attention(q, k, v) end,
  function(T) return {T.randn({1, 2, 3, 4}), T.randn({1, 2, 5, 4}), T.randn({1, 2, 5, 3})} end)
case("scaled_dot_product_attention, causal, Tq == Tk", "scaled_dot_product_attention",
  function(q, k, v) return F.scaled_dot_product_attention(q, k, v, {causal = true}) end,
  function(T) return {T.randn({2, 4, 3}), T.randn({2, 4, 3}), T.randn({2, 4, 3})} end)
case("scaled_dot_product_attention, causal, Tq != Tk (top-left aligned)", "scaled_dot_product_attention",
  function(q, k, v) return F.scaled_dot_product_attention(q, k, v, {causal = true}) end,
  function(T) return {T.randn({1, 3, 4}), T.randn({1, 5, 4}), T.randn({1, 5, 4})} end)
case("scaled_dot_product_attention with an explicit scale", "scaled_dot_product_attention",
  function(q, k, v) return F.scaled_dot_product_attention(q, k, v, {scale = 0.3}) end,
  function(T) return {T.randn({3, 2}), T.randn({4, 2}), T.randn({4, 2})} end)

---------------------------------------------------------------------------
-- joining and views
---------------------------------------------------------------------------

case("cat along dim 1 of (2,3) and (2,2)", "cat",
  function(a, b) return ember.cat({a, b}, 1) end,
  function(T) return {T.randn({2, 3}), T.randn({2, 2})} end)
case("cat of three tensors along dim 0", "cat",
  function(a, b, c) return ember.cat({a, b, c}, 0) end,
  function(T) return {T.randn({1, 3}), T.randn({2, 3}), T.randn({1, 3})} end)
case("cat of one tensor used twice", "cat",
  function(a) return ember.cat({a, a}, -1) end,
  function(T) return {T.randn({2, 2})} end)
case("stack along dim 0", "stack",
  function(a, b) return ember.stack({a, b}, 0) end,
  function(T) return {T.randn({2, 3}), T.randn({2, 3})} end)
case("stack along the last dim", "stack",
  function(a, b) return ember.stack({a, b}, -1) end,
  function(T) return {T.randn({2, 3}), T.randn({2, 3})} end)
case("view (2,3) as (3,2)", "view",
  function(a) return a:view(3, 2) * ember.arange(6):view(3, 2):to({dtype = a.dtype, device = a.device}) end,
  function(T) return {T.randn({2, 3})} end)
case("reshape of a transposed tensor (a copy)", "reshape",
  function(a) return a:t():reshape(-1) end,
  function(T) return {T.randn({2, 3})} end)
case("transpose(0, 2)", "transpose",
  function(a) return a:transpose(0, 2) end,
  function(T) return {T.randn({2, 3, 4})} end)
case("t() of a matrix", "t",
  function(a) return a:t() end,
  function(T) return {T.randn({2, 3})} end)
case("permute(2, 0, 1)", "permute",
  function(a) return a:permute(2, 0, 1) end,
  function(T) return {T.randn({2, 3, 4})} end)
case("narrow(1, 1, 2)", "narrow",
  function(a) return a:narrow(1, 1, 2) end,
  function(T) return {T.randn({3, 4})} end)
case("select(0, -1)", "select",
  function(a) return a:select(0, -1) end,
  function(T) return {T.randn({3, 4})} end)
case("squeeze all size-1 dims", "squeeze",
  function(a) return a:squeeze() end,
  function(T) return {T.randn({1, 3, 1, 2})} end)
case("unsqueeze(1)", "unsqueeze",
  function(a) return a:unsqueeze(1) end,
  function(T) return {T.randn({3, 2})} end)
case("expand (1,3) to (4,3)", "expand",
  function(a) return a:expand(4, 3) end,
  function(T) return {T.randn({1, 3})} end)
case("expand adds leading dims (3) to (2,4,3)", "expand",
  function(a) return a:expand(2, 4, 3) end,
  function(T) return {T.randn({3})} end)
case("flatten(1)", "flatten",
  function(a) return a:flatten(1) end,
  function(T) return {T.randn({2, 3, 2})} end)
case("contiguous of a transposed tensor", "contiguous",
  function(a) return a:t():contiguous() end,
  function(T) return {T.randn({2, 3})} end)
case("clone", "clone",
  function(a) return a:clone() * a end,
  function(T) return {T.randn({4})} end)
case("split(2, 1) second piece", "split",
  function(a) return a:split(2, 1)[2] end,
  function(T) return {T.randn({2, 5})} end)
case("chunk(3) last piece", "chunk",
  function(a) local c = a:chunk(3); return c[#c] end,
  function(T) return {T.randn({6, 2})} end)

---------------------------------------------------------------------------
-- composites (several ops in one graph)
---------------------------------------------------------------------------

case("a small attention block: rmsnorm -> linear -> rope -> attention -> linear", "composite",
  function(x, wn, wq, wo)
    local h = F.rmsnorm(x, wn)
    local q = F.rope(F.linear(h, wq), nil)
    local o = F.scaled_dot_product_attention(q, q, h, {causal = true})
    return F.linear(o, wo)
  end,
  function(T) return {T.randn({3, 4}), T.randn({4}), T.randn({4, 4}), T.randn({2, 4})} end)

---------------------------------------------------------------------------
-- access
---------------------------------------------------------------------------

--- Build case c's inputs: seeded by its name, dtype/device/requires_grad from o.
function cases.make_inputs(c, o)
  ember.manual_seed(seed_of(c.name))
  return c.inputs(factory(o))
end

cases.factory = factory

return cases
