-- op_cases/elementwise.lua — elementwise ops: binary (with broadcasting and scalars), unary, clamp, where, masked_fill, triu/tril.
-- Loaded by tests/lua/op_cases.lua, which says what case() and perf() take.
return function(case, perf, ember, F)
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
  -- perf: 2^24 elements (64 MiB in f32), contiguous; broadcasting over a row
  ---------------------------------------------------------------------------

  local N = {4096, 4096}
  local binary_torch = {add = "a + b", sub = "a - b", mul = "a * b", div = "a / b", pow = "a ** b",
                        maximum = "torch.maximum(a, b)", minimum = "torch.minimum(a, b)"}
  for _, op in ipairs({"add", "sub", "mul", "div", "pow", "maximum", "minimum"}) do
    local fn = ({add = function(a, b) return a + b end, sub = function(a, b) return a - b end,
                 mul = function(a, b) return a * b end, div = function(a, b) return a / b end,
                 pow = function(a, b) return a ^ b end, maximum = ember.maximum, minimum = ember.minimum})[op]
    perf(op, op .. " (4096,4096) x (4096,4096)", fn,
      function(T) return {T.uniform(N, 0.5, 2), T.uniform(N, 0.5, 2)} end,
      {backward = true, torch = binary_torch[op]})
  end
  perf("add", "add (4096,4096) + (4096) broadcast row", function(a, b) return a + b end,
    function(T) return {T.randn(N), T.randn({4096})} end, {backward = true, torch = "a + b"})
  perf("mul", "mul (4096,4096) * scalar", function(a) return a * 1.5 end,
    function(T) return {T.randn(N)} end, {backward = true, torch = "a * 1.5"})
  local torch_unary = {neg = "-a", abs = "a.abs()", sqrt = "a.sqrt()", rsqrt = "a.rsqrt()", exp = "a.exp()",
    log = "a.log()", tanh = "a.tanh()", sigmoid = "a.sigmoid()", silu = "F.silu(a)", relu = "F.relu(a)",
    gelu = "F.gelu(a)", sin = "a.sin()", cos = "a.cos()", square = "a.square()", reciprocal = "a.reciprocal()"}
  for _, op in ipairs({"neg", "abs", "sqrt", "rsqrt", "exp", "log", "tanh", "sigmoid", "silu", "relu", "gelu",
                       "sin", "cos", "square", "reciprocal"}) do
    perf(op, op .. " (4096,4096)", function(a) return a[op](a) end,
      function(T) return {T.uniform(N, 0.5, 2)} end, {backward = true, torch = torch_unary[op]})
  end
  perf("clamp", "clamp(-0.5, 0.5) (4096,4096)", function(a) return a:clamp(-0.5, 0.5) end,
    function(T) return {T.randn(N)} end, {backward = true, torch = "a.clamp(-0.5, 0.5)"})
  perf("where", "where (4096,4096)", function(c, a, b) return ember.where(c, a, b) end,
    function(T) return {T.mask(N), T.randn(N), T.randn(N)} end, {backward = true, torch = "torch.where(a, b, c)"})
  perf("masked_fill", "masked_fill (4096,4096)", function(a, m) return a:masked_fill(m, 0) end,
    function(T) return {T.randn(N), T.mask(N)} end, {backward = true, torch = "a.masked_fill(b, 0)"})
  -- issue 12's ">= 70% of bandwidth" on inputs well past the H100's 50 MB L2
  -- (reduce.lua does the same for sum): 2^26 elements, CUDA only
  local L = {8192, 8192}
  perf("add", "add (8192,8192) x (8192,8192)", function(a, b) return a + b end,
    function(T) return {T.randn(L), T.randn(L)} end, {device = "cuda", torch = "a + b"})
  perf("add", "add (8192,8192) + (8192) broadcast row", function(a, b) return a + b end,
    function(T) return {T.randn(L), T.randn({8192})} end, {device = "cuda", torch = "a + b"})
  perf("where", "where (8192,8192)", function(c, a, b) return ember.where(c, a, b) end,
    function(T) return {T.mask(L), T.randn(L), T.randn(L)} end, {device = "cuda", torch = "torch.where(a, b, c)"})
  perf("masked_fill", "masked_fill (8192,8192)", function(a, m) return a:masked_fill(m, 0) end,
    function(T) return {T.randn(L), T.mask(L)} end, {device = "cuda", torch = "a.masked_fill(b, 0)"})
  -- issue 12: the binary ops beyond add and the costliest unary ops at 2^26 too (gelu's erf is ~22 lane
  -- instructions an element, near the bf16 budget of ~28 at 70 % of the H200's 4800 GB/s)
  for _, op in ipairs({"maximum", "minimum"}) do
    perf(op, op .. " (8192,8192) x (8192,8192)", ember[op],
      function(T) return {T.uniform(L, 0.5, 2), T.uniform(L, 0.5, 2)} end, {device = "cuda", torch = binary_torch[op]})
  end
  for _, op in ipairs({"gelu", "sigmoid", "tanh"}) do   -- (silu: nn.lua's (8192,6400))
    perf(op, op .. " (8192,8192)", function(a) return a[op](a) end,
      function(T) return {T.uniform(L, 0.5, 2)} end, {device = "cuda", torch = torch_unary[op]})
  end
  perf("triu", "triu (4096,4096)", function(a) return a:triu(1) end,
    function(T) return {T.randn(N)} end, {backward = true, torch = "a.triu(1)"})
  perf("tril", "tril (4096,4096)", function(a) return a:tril() end,
    function(T) return {T.randn(N)} end, {backward = true, torch = "a.tril()"})
end
