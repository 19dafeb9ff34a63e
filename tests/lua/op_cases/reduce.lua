-- op_cases/reduce.lua — reductions: sum, mean, max, min, var, logsumexp, softmax, log_softmax.
-- Loaded by tests/lua/op_cases.lua, which says what case() and perf() take.
return function(case, perf, ember, F)
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
  -- perf: 2^24 elements; rows of the LM head's width for the softmaxes
  ---------------------------------------------------------------------------

  local N = {4096, 4096}
  perf("sum", "sum over all (4096,4096)", function(a) return a:sum() end,
    function(T) return {T.randn(N)} end, {backward = true, torch = "a.sum()"})
  perf("sum", "sum over the last dim (4096,4096)", function(a) return a:sum(-1) end,
    function(T) return {T.randn(N)} end, {backward = true, torch = "a.sum(-1)"})
  perf("sum", "sum over dim 0 (4096,4096)", function(a) return a:sum(0) end,
    function(T) return {T.randn(N)} end, {backward = true, torch = "a.sum(0)"})
  -- issue 12's ">= 70% of bandwidth" on inputs well past the H100's 50 MB L2
  -- (the 32-64 MiB ones above sit under it, and their ~15-25 µs is mostly
  -- launch and ramp): 2^26 elements, 128 MiB in bf16, 256 MiB in f32; CUDA
  -- only (the CPU's figures come from the shapes above)
  for _, s in ipairs({{8192, 8192}, {16384, 4096}}) do
    local tag = ("(%d,%d)"):format(s[1], s[2])
    perf("sum", "sum over all " .. tag, function(a) return a:sum() end,
      function(T) return {T.randn(s)} end, {device = "cuda", torch = "a.sum()"})
    perf("sum", "sum over the last dim " .. tag, function(a) return a:sum(-1) end,
      function(T) return {T.randn(s)} end, {device = "cuda", torch = "a.sum(-1)"})
    perf("sum", "sum over dim 0 " .. tag, function(a) return a:sum(0) end,
      function(T) return {T.randn(s)} end, {device = "cuda", torch = "a.sum(0)"})
  end
  perf("mean", "mean over the last dim (4096,4096)", function(a) return a:mean(-1) end,
    function(T) return {T.randn(N)} end, {backward = true, torch = "a.mean(-1)"})
  perf("max", "max over the last dim (4096,4096)", function(a) return (a:max(-1)) end,
    function(T) return {T.randn(N)} end, {backward = true, torch = "a.max(-1).values"})
  perf("min", "min over the last dim (4096,4096)", function(a) return (a:min(-1)) end,
    function(T) return {T.randn(N)} end, {backward = true, torch = "a.min(-1).values"})
  -- issue 12: max/min with indices at 2^26 elements, down columns (reduce_cols_ext) and along rows, CUDA only
  perf("max", "max over dim 0 (8192,8192)", function(a) return (a:max(0)) end,
    function(T) return {T.randn({8192, 8192})} end, {device = "cuda", torch = "a.max(0).values"})
  perf("min", "min over the last dim (8192,8192)", function(a) return (a:min(-1)) end,
    function(T) return {T.randn({8192, 8192})} end, {device = "cuda", torch = "a.min(-1).values"})
  perf("var", "var over the last dim (4096,4096)", function(a) return a:var(-1) end,
    function(T) return {T.randn(N)} end, {backward = true, torch = "a.var(-1)"})
  perf("logsumexp", "logsumexp over the last dim (4096,4096)", function(a) return a:logsumexp(-1) end,
    function(T) return {T.randn(N)} end, {backward = true, torch = "a.logsumexp(-1)"})
  -- issue 12: var and logsumexp at 2^26 elements (one read of 256 / 128 MiB), CUDA only
  perf("var", "var over the last dim (8192,8192)", function(a) return a:var(-1) end,
    function(T) return {T.randn({8192, 8192})} end, {device = "cuda", torch = "a.var(-1)"})
  perf("logsumexp", "logsumexp over the last dim (8192,8192)", function(a) return a:logsumexp(-1) end,
    function(T) return {T.randn({8192, 8192})} end, {device = "cuda", torch = "a.logsumexp(-1)"})
  perf("softmax", "softmax over the last dim (2048,8192)", function(a) return a:softmax(-1) end,
    function(T) return {T.randn({2048, 8192})} end, {backward = true, torch = "a.softmax(-1)"})
  perf("log_softmax", "log_softmax over the last dim (2048,8192)", function(a) return a:log_softmax(-1) end,
    function(T) return {T.randn({2048, 8192})} end, {backward = true, torch = "a.log_softmax(-1)"})
end
