-- op_cases/sort.lua — sorting, selection and scans: sort, argsort, topk,
-- kthvalue, median, cumsum, cumprod (differentiable), unique, bincount,
-- searchsorted (grad = false: the eval mode compares their forward).
-- Loaded by tests/lua/op_cases.lua, which says what case() and perf() take.
-- Inputs of the selections are T.distinct (no ties, also after rounding to
-- bf16: spacing 0.3 at |x| < 3 is far above bf16's 2^-7 relative step), so
-- the indices are unique and finite differences never swap two elements.
return function(case, perf, ember, F)
  local NOGRAD = {grad = false}
  local ONCE = {grad = false, dtypes = {"f32"}}   -- integer inputs: the float dtype does not matter

  ---------------------------------------------------------------------------
  -- sort, argsort
  ---------------------------------------------------------------------------
  case("sort values along the last dim", "sort",
    function(a) local v = a:sort(); return v end,
    function(T) return {T.distinct({3, 5}, 0.3)} end)
  case("sort values descending along dim 0", "sort",
    function(a) local v = a:sort(0, {descending = true}); return v end,
    function(T) return {T.distinct({4, 3}, 0.3)} end)
  case("sort values of a transposed view (strided rows)", "sort",
    function(a) local v = a:transpose(0, 1):sort(1, {stable = true}); return v end,
    function(T) return {T.distinct({5, 3}, 0.3)} end)
  case("sort values along the middle dim of a 3-D tensor", "sort",
    function(a) local v = ember.sort(a, 1); return v end,
    function(T) return {T.distinct({2, 4, 3}, 0.3)} end)
  case("sort indices along the last dim", "sort",
    function(a) local _, i = a:sort(-1); return i end,
    function(T) return {T.distinct({3, 6}, 0.3)} end, nil, NOGRAD)
  case("sort indices descending along dim 0 of a 3-D tensor", "sort",
    function(a) local _, i = a:sort(0, {descending = true}); return i end,
    function(T) return {T.distinct({4, 2, 3}, 0.3)} end, nil, NOGRAD)
  case("argsort along dim 1", "argsort",
    function(a) return a:argsort(1) end,
    function(T) return {T.distinct({3, 7}, 0.3)} end, nil, NOGRAD)
  case("argsort descending of a transposed view", "argsort",
    function(a) return a:t():argsort(-1, {descending = true}) end,
    function(T) return {T.distinct({6, 3}, 0.3)} end, nil, NOGRAD)

  ---------------------------------------------------------------------------
  -- topk, kthvalue, median
  ---------------------------------------------------------------------------
  case("topk k=2 along the last dim", "topk",
    function(a) local v = a:topk(2); return v end,
    function(T) return {T.distinct({3, 5}, 0.3)} end)
  case("topk smallest k=3 along dim 0", "topk",
    function(a) local v = a:topk(3, 0, {largest = false}); return v end,
    function(T) return {T.distinct({5, 4}, 0.3)} end)
  case("topk k=2 along the middle dim of a 3-D tensor", "topk",
    function(a) local v = a:topk(2, 1); return v end,
    function(T) return {T.distinct({2, 5, 3}, 0.3)} end)
  case("topk indices k=3 along the last dim", "topk",
    function(a) local _, i = a:topk(3); return i end,
    function(T) return {T.distinct({4, 9}, 0.3)} end, nil, NOGRAD)
  case("kthvalue k=2 along the last dim", "kthvalue",
    function(a) local v = a:kthvalue(2); return v end,
    function(T) return {T.distinct({3, 5}, 0.3)} end)
  case("kthvalue k=3 along dim 0 with keepdim", "kthvalue",
    function(a) local v = a:kthvalue(3, 0, {keepdim = true}); return v end,
    function(T) return {T.distinct({4, 3}, 0.3)} end)
  case("kthvalue indices k=4 along dim 1", "kthvalue",
    function(a) local _, i = a:kthvalue(4, 1); return i end,
    function(T) return {T.distinct({3, 6}, 0.3)} end, nil, NOGRAD)
  case("median over all elements (odd count)", "median",
    function(a) return a:median() end,
    function(T) return {T.distinct({3, 5}, 0.3)} end)
  case("median over all elements (even count: the lower one)", "median",
    function(a) return a:median() end,
    function(T) return {T.distinct({2, 4}, 0.3)} end)
  case("median along dim 1 (even size: the lower one)", "median",
    function(a) local v = a:median(1); return v end,
    function(T) return {T.distinct({3, 4}, 0.3)} end)
  case("median along dim 0 with keepdim", "median",
    function(a) local v = a:median(0, {keepdim = true}); return v end,
    function(T) return {T.distinct({5, 3}, 0.3)} end)
  case("median indices along the last dim", "median",
    function(a) local _, i = a:median(-1); return i end,
    function(T) return {T.distinct({4, 7}, 0.3)} end, nil, NOGRAD)

  ---------------------------------------------------------------------------
  -- cumsum, cumprod
  ---------------------------------------------------------------------------
  case("cumsum along the last dim", "cumsum",
    function(a) return a:cumsum(-1) end,
    function(T) return {T.randn({3, 5})} end)
  case("cumsum along dim 0 of a 3-D tensor", "cumsum",
    function(a) return a:cumsum(0) end,
    function(T) return {T.randn({4, 2, 3})} end)
  case("cumsum of a transposed view", "cumsum",
    function(a) return ember.cumsum(a:t(), 1) end,
    function(T) return {T.randn({5, 3})} end)
  case("cumsum of integers gives i64", "cumsum",
    function(a) return a:cumsum(0) end,
    function(T) return {T.long({3, -1, 4, 1, -5, 9})} end, nil, ONCE)
  case("cumprod along the last dim", "cumprod",
    function(a) return a:cumprod(-1) end,
    function(T) return {T.uniform({3, 5}, 0.5, 1.5)} end)
  case("cumprod along dim 1 of a 3-D tensor", "cumprod",
    function(a) return a:cumprod(1) end,
    function(T) return {T.uniform({2, 4, 3}, -1.5, 1.5)} end)
  case("cumprod with one zero in the row", "cumprod",
    function(a) return a:cumprod(0) end,
    function(T) return {T.values({1.25, -0.75, 0, 1.5, -0.5, 2})} end)
  case("cumprod with two zeros in a row", "cumprod",
    function(a) return a:cumprod(1) end,
    function(T) return {T.values({0.5, 0, 1.25, 0, 2, -1.5, 0.75, 1.5, 0, 1.25}, {2, 5})} end)
  case("cumprod with a leading zero along dim 0", "cumprod",
    function(a) return a:cumprod(0) end,
    function(T) return {T.values({0, 1.5, 0.5, -1.25, 2, 0, 0.75, 1}, {4, 2})} end)

  ---------------------------------------------------------------------------
  -- unique, bincount, searchsorted (no gradient)
  ---------------------------------------------------------------------------
  local REPEATS = {3, 1, 2, 3, 1, 0.5, -2, 2, 3, -2}
  case("unique values of a 2-D tensor", "unique",
    function(a) return a:unique() end,
    function(T) return {T.values(REPEATS, {2, 5})} end, nil, NOGRAD)
  case("unique inverse indices", "unique",
    function(a) local _, inv = a:unique({return_inverse = true}); return inv end,
    function(T) return {T.values(REPEATS, {5, 2})} end, nil, NOGRAD)
  case("unique counts", "unique",
    function(a) local _, c = a:unique({return_counts = true}); return c end,
    function(T) return {T.values(REPEATS)} end, nil, NOGRAD)
  case("unique of integers", "unique",
    function(a) return ember.unique(a) end,
    function(T) return {T.long({5, -3, 5, 0, 7, 0, 0, -3})} end, nil, ONCE)
  case("bincount of integers", "bincount",
    function(a) return a:bincount() end,
    function(T) return {T.long({1, 4, 1, 0, 6, 4, 4})} end, nil, ONCE)
  case("bincount with minlength", "bincount",
    function(a) return a:bincount(nil, 10) end,
    function(T) return {T.long({2, 2, 3, 0})} end, nil, ONCE)
  case("bincount with weights", "bincount",
    function(a, w) return a:bincount(w) end,
    function(T) return {T.long({1, 3, 1, 0, 3}), T.values({0.5, 1.25, -2, 3, 0.75})} end, nil, ONCE)
  case("searchsorted left in a 1-D sequence", "searchsorted",
    function(s, v) return ember.searchsorted(s, v) end,
    function(T) return {T.values({-1, 0, 0.5, 2, 3}), T.values({-2, 0, 0.25, 2, 2.5, 3, 4}, {7})} end,
    nil, NOGRAD)
  case("searchsorted right in rows", "searchsorted",
    function(s, v) return ember.searchsorted(s, v, {right = true}) end,
    function(T) return {T.values({-1, 0, 0.5, 2, 3, -3, -1, 1, 1.5, 4}, {2, 5}),
                        T.values({0, 0.5, 3, -1, 1, 5}, {2, 3})} end, nil, NOGRAD)

  ---------------------------------------------------------------------------
  -- perf: large shapes (the CUDA ones are the target: one segmented sort)
  ---------------------------------------------------------------------------
  local SIZE = {f32 = 4, f64 = 8, bf16 = 2, f16 = 2, i64 = 8, i32 = 4}
  local function numel(t) local n = 1; for _, s in ipairs(t.shape) do n = n * s end; return n end
  -- values in, values + i64 indices out
  local function sort_bytes(inputs, out) return numel(inputs[1]) * SIZE[inputs[1].dtype] + numel(out) * (SIZE[out.dtype] + 8) end
  local function values(fn) return function(...) local v = fn(...); return v end end

  perf("sort", "sort (4096, 4096) along the last dim", values(function(a) return a:sort(-1) end),
    function(T) return {T.randn({4096, 4096})} end, {bytes = sort_bytes, device = "cuda"})
  perf("sort", "sort (2^24) one row", values(function(a) return a:sort() end),
    function(T) return {T.randn({16777216})} end, {bytes = sort_bytes, device = "cuda"})
  perf("sort", "sort (256, 4096) along the last dim", values(function(a) return a:sort(-1) end),
    function(T) return {T.randn({256, 4096})} end, {bytes = sort_bytes, device = "cpu"})
  perf("argsort", "argsort (4096, 4096) along the last dim", function(a) return a:argsort(-1) end,
    function(T) return {T.randn({4096, 4096})} end, {device = "cuda"})
  perf("topk", "topk k=50 over (64, 128000) logits", values(function(a) return a:topk(50) end),
    function(T) return {T.randn({64, 128000})} end, {bytes = sort_bytes, device = "cuda"})
  perf("topk", "topk k=50 over (8, 32000) logits", values(function(a) return a:topk(50) end),
    function(T) return {T.randn({8, 32000})} end, {bytes = sort_bytes, device = "cpu"})
  perf("kthvalue", "kthvalue k=100 over (1024, 4096)", values(function(a) return a:kthvalue(100) end),
    function(T) return {T.randn({1024, 4096})} end, {bytes = sort_bytes})
  perf("median", "median over the last dim of (1024, 4096)", values(function(a) return a:median(-1) end),
    function(T) return {T.randn({1024, 4096})} end, {bytes = sort_bytes})
  perf("cumsum", "cumsum of 2^24 elements", function(a) return a:cumsum(0) end,
    function(T) return {T.randn({16777216})} end)
  perf("cumsum", "cumsum along the last dim of (4096, 4096)", function(a) return a:cumsum(1) end,
    function(T) return {T.randn({4096, 4096})} end, {backward = true})
  perf("cumsum", "cumsum along dim 0 of (4096, 4096)", function(a) return a:cumsum(0) end,
    function(T) return {T.randn({4096, 4096})} end)
  perf("cumprod", "cumprod along dim 0 of (4096, 4096)", function(a) return a:cumprod(0) end,
    function(T) return {T.uniform({4096, 4096}, 0.999, 1.001)} end, {backward = true})
  -- 2^26 elements, CUDA only: the size issue 12's bandwidth target is judged at
  perf("cumsum", "cumsum of 2^26 elements", function(a) return a:cumsum(0) end,
    function(T) return {T.randn({67108864})} end, {device = "cuda", torch = "a.cumsum(0)"})
  perf("cumsum", "cumsum along the last dim of (8192, 8192)", function(a) return a:cumsum(1) end,
    function(T) return {T.randn({8192, 8192})} end, {device = "cuda", torch = "a.cumsum(1)"})
  perf("cumsum", "cumsum along dim 0 of (8192, 8192)", function(a) return a:cumsum(0) end,
    function(T) return {T.randn({8192, 8192})} end, {device = "cuda", torch = "a.cumsum(0)"})
  perf("cumprod", "cumprod along dim 0 of (8192, 8192)", function(a) return a:cumprod(0) end,
    function(T) return {T.uniform({8192, 8192}, 0.999, 1.001)} end, {device = "cuda", torch = "a.cumprod(0)"})
  perf("unique", "unique of 2^22 ids in [0, 100000)", function(a) return a:unique() end,
    function(T) return {T.ids({4194304}, 100000)} end, {dtypes = {"f32"}})
  perf("bincount", "bincount of 2^24 ids in [0, 4096)", function(a) return a:bincount() end,
    function(T) return {T.ids({16777216}, 4096)} end, {dtypes = {"f32"}})
  perf("searchsorted", "searchsorted of 2^20 values in 4096 boundaries",
    function(s, v) return ember.searchsorted(s, v) end,
    function(T) local s = T.const({4096}):sort(); return {s, T.const({1048576})} end)
  -- PyTorch beside ours in bench_ops.lua --torch
  return {
    ["sort (4096, 4096) along the last dim"] = [[a.sort(-1).values]],
    ["sort (2^24) one row"] = [[a.sort().values]],
    ["sort (256, 4096) along the last dim"] = [[a.sort(-1).values]],
    ["argsort (4096, 4096) along the last dim"] = [[a.argsort(-1)]],
    ["topk k=50 over (64, 128000) logits"] = [[a.topk(50).values]],
    ["topk k=50 over (8, 32000) logits"] = [[a.topk(50).values]],
    ["kthvalue k=100 over (1024, 4096)"] = [[a.kthvalue(100).values]],
    ["median over the last dim of (1024, 4096)"] = [[a.median(-1).values]],
    ["cumsum of 2^24 elements"] = [[a.cumsum(0)]],
    ["cumsum along the last dim of (4096, 4096)"] = [[a.cumsum(1)]],
    ["cumprod along dim 0 of (4096, 4096)"] = [[a.cumprod(0)]],
    ["unique of 2^22 ids in [0, 100000)"] = [[torch.unique(a)]],
    ["bincount of 2^24 ids in [0, 4096)"] = [[torch.bincount(a)]],
    ["searchsorted of 2^20 values in 4096 boundaries"] = [[torch.searchsorted(a.sort().values, b)]],
  }
end
