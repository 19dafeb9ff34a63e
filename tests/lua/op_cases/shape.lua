-- op_cases/shape.lua — joining and views: cat, stack, view, reshape, transpose, permute, narrow, ....
-- Loaded by tests/lua/op_cases.lua, which says what case() and perf() take.
return function(case, perf, ember, F)
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
  -- perf: joins and copies of 2^24 elements; views cost host time only (no
  -- bytes move: the table shows their time, no rate)
  ---------------------------------------------------------------------------

  local N = {4096, 4096}
  local function no_bytes() return 0 end
  perf("cat", "cat two (4096,2048) along dim 1", function(a, b) return ember.cat({a, b}, 1) end,
    function(T) return {T.randn({4096, 2048}), T.randn({4096, 2048})} end,
    {backward = true, torch = "torch.cat([a, b], 1)"})
  perf("stack", "stack two (4096,2048)", function(a, b) return ember.stack({a, b}, 0) end,
    function(T) return {T.randn({4096, 2048}), T.randn({4096, 2048})} end,
    {backward = true, torch = "torch.stack([a, b], 0)"})
  perf("contiguous", "contiguous of a transposed (4096,4096)", function(a) return a:t():contiguous() end,
    function(T) return {T.randn(N)} end, {backward = true, torch = "a.t().contiguous()"})
  perf("reshape", "reshape of a transposed (4096,4096) (a copy)", function(a) return a:t():reshape(-1) end,
    function(T) return {T.randn(N)} end, {backward = true, torch = "a.t().reshape(-1)"})
  perf("clone", "clone (4096,4096)", function(a) return a:clone() end,
    function(T) return {T.randn(N)} end, {backward = true, torch = "a.clone()"})
  -- casts: the conversion loops of a copy between dtypes (bf16 <-> f32 in SIMD)
  perf("to", "cast f32 -> bf16 (4096,4096)", function(a) return a:to("bf16") end,
    function(T) return {T.randn(N)} end, {dtypes = {"f32"}, torch = "a.to(torch.bfloat16)"})
  perf("to", "cast bf16 -> f32 (4096,4096)", function(a) return a:to("f32") end,
    function(T) return {T.randn(N):to("bf16")} end, {dtypes = {"f32"}, torch = "a.bfloat16().float()"})
  for _, c in ipairs({{"f32", "bf16", "a.to(torch.bfloat16)"}, {"bf16", "f32", "a.bfloat16().float()"}}) do
    perf("to", ("cast %s -> %s (8192,8192)"):format(c[1], c[2]), function(a) return a:to(c[2]) end,
      function(T) return {T.randn({8192, 8192}):to(c[1])} end, {dtypes = {"f32"}, device = "cuda", torch = c[3]})
  end
  local views = {
    {"view", function(a) return a:view(2048, 8192) end, "a.view(2048, 8192)"},
    {"transpose", function(a) return a:transpose(0, 1) end, "a.transpose(0, 1)"},
    {"t", function(a) return a:t() end, "a.t()"},
    {"permute", function(a) return a:permute(1, 0) end, "a.permute(1, 0)"},
    {"narrow", function(a) return a:narrow(0, 1, 2048) end, "a.narrow(0, 1, 2048)"},
    {"select", function(a) return a:select(0, 7) end, "a.select(0, 7)"},
    {"squeeze", function(a) return a:unsqueeze(0):squeeze() end, "a.unsqueeze(0).squeeze()"},
    {"unsqueeze", function(a) return a:unsqueeze(1) end, "a.unsqueeze(1)"},
    {"expand", function(a) return a:narrow(0, 0, 1):expand(4096, 4096) end, "a.narrow(0, 0, 1).expand(4096, 4096)"},
    {"flatten", function(a) return a:flatten() end, "a.flatten()"},
    {"split", function(a) return a:split(1024, 0)[2] end, "a.split(1024, 0)[1]"},
    {"chunk", function(a) return a:chunk(4)[4] end, "a.chunk(4)[3]"},
  }
  for _, v in ipairs(views) do
    perf(v[1], v[1] .. " of (4096,4096) (a view: host time only)", v[2],
      function(T) return {T.randn(N)} end, {bytes = no_bytes, torch = v[3]})
  end
end
