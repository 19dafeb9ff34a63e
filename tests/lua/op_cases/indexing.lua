-- op_cases/indexing.lua — indexing: index_select, gather, scatter, scatter_add,
-- index_add, masked_select, take_along_dim, t:index / t[idx], embedding_bag,
-- and (forward only) nonzero and one_hot.
-- Loaded by tests/lua/op_cases.lua, which says what case() and perf() take.
-- Scatter cases keep the indices along the scattered dim distinct where a
-- duplicate would make the result depend on which write wins (CUDA does not
-- order them); scatter_add / index_add cases repeat indices on purpose.
return function(case, perf, ember, F)
  ---------------------------------------------------------------------------
  -- gathers
  ---------------------------------------------------------------------------

  case("index_select rows with repeats (dim 0)", "index_select",
    function(x, i) return x:index_select(0, i) end,
    function(T) return {T.randn({4, 3}), T.long({2, 0, 2, 3})} end)
  case("index_select along the last dim with an i32 index", "index_select",
    function(x, i) return ember.index_select(x, -1, i) end,
    function(T) return {T.randn({2, 3, 5}), T.long({4, 0, 4}):int()} end)
  case("index_select from a transposed (strided) x", "index_select",
    function(x, i) return x:transpose(0, 1):index_select(1, i) end,
    function(T) return {T.randn({5, 3}), T.long({1, 4, 1})} end)
  case("gather along dim 1 with repeats", "gather",
    function(x, i) return x:gather(1, i) end,
    function(T) return {T.randn({3, 4}), T.long({{0, 3}, {1, 1}, {2, 0}})} end)
  case("gather along dim 0 with an index smaller than x", "gather",
    function(x, i) return x:gather(0, i) end,
    function(T) return {T.randn({4, 5}), T.long({{3, 0, 3}, {1, 1, 2}})} end)
  case("take_along_dim along dim 1, broadcasting the indices' dim 0", "take_along_dim",
    function(x, i) return x:take_along_dim(i, 1) end,
    function(T) return {T.randn({3, 4}), T.long({{3, 0}})} end)
  case("take_along_dim without a dim (flattened)", "take_along_dim",
    function(x, i) return ember.take_along_dim(x, i) end,
    function(T) return {T.randn({3, 4}), T.long({11, 0, 5, 5})} end)

  ---------------------------------------------------------------------------
  -- scatters
  ---------------------------------------------------------------------------

  case("scatter src along dim 1 (src larger than index)", "scatter",
    function(x, src, i) return x:scatter(1, i, src) end,
    function(T) return {T.randn({3, 5}), T.randn({2, 5}), T.long({{4, 0, 2, 1}, {3, 1, 0, 2}})} end)
  case("scatter a value along dim 0", "scatter",
    function(x, i) return x:scatter(0, i, 1.5) end,
    function(T) return {T.randn({3, 4}), T.long({{2, 0, 1, 2}})} end)
  case("scatter_add along dim 0 with duplicate indices", "scatter_add",
    function(x, src, i) return x:scatter_add(0, i, src) end,
    function(T) return {T.randn({3, 4}), T.randn({4, 4}), T.long({{0, 1, 2, 0}, {0, 1, 1, 2}, {2, 2, 0, 0}})} end)
  case("scatter_add along the last dim of a 3-D x", "scatter_add",
    function(x, src, i) return x:scatter_add(-1, i, src) end,
    function(T) return {T.randn({2, 2, 3}), T.randn({2, 2, 4}), T.long({{{0, 0, 2, 1}, {1, 1, 1, 0}}, {{2, 0, 2, 2}, {0, 1, 2, 0}}})} end)
  case("index_add along dim 0 with duplicates and alpha 0.5", "index_add",
    function(x, src, i) return x:index_add(0, i, src, 0.5) end,
    function(T) return {T.randn({4, 3}), T.randn({5, 3}), T.long({3, 0, 3, 1, 3})} end)
  case("index_add along dim 1", "index_add",
    function(x, src, i) return x:index_add(1, i, src, {alpha = 1}) end,
    function(T) return {T.randn({2, 4}), T.randn({2, 3}), T.long({1, 1, 2})} end)

  ---------------------------------------------------------------------------
  -- masks and tensor indexing
  ---------------------------------------------------------------------------

  case("masked_select with a broadcast mask", "masked_select",
    function(x, m) return x:masked_select(m) end,
    function(T) return {T.randn({3, 4}), T.long({1, 0, 1, 1}):to("bool")} end)
  case("masked_select of a broadcast x (gradient summed over dim 0)", "masked_select",
    function(x, m) return ember.masked_select(x, m) end,
    function(T) return {T.randn({1, 4}), T.mask({3, 4})} end)
  case("t[idx] with an i64 tensor on dim 0", "index",
    function(x, i) return x[i] end,
    function(T) return {T.randn({4, 3}), T.long({{3, 0}, {3, 1}})} end)
  case("t:index with non-adjacent tensors (index dims first)", "index",
    function(x, i, j) return x:index({i, nil, j}) end,
    function(T) return {T.randn({3, 4, 5}), T.long({2, 0, 2}), T.long({-1, 0, 3})} end)
  case("t:index with an integer and a tensor after a full dim", "index",
    function(x, j) return x:index({nil, 1, j}) end,
    function(T) return {T.randn({2, 3, 4}), T.long({{3, 0}, {0, 0}})} end)
  case("t:index with adjacent tensors after a full dim", "index",
    function(x, i, j) return x:index({nil, i, j}) end,
    function(T) return {T.randn({2, 3, 4}), T.long({{2}, {0}}), T.long({1, 3})} end)
  case("t:index with a bool mask", "index",
    function(x, m) return x:index({nil, m}) end,
    function(T) return {T.randn({2, 3, 2}), T.long({{1, 0}, {0, 0}, {1, 1}}):to("bool")} end)
  case("F.embedding_bag sum with offsets", "embedding_bag",
    function(w, ids, offs) return F.embedding_bag(ids, w, offs, "sum") end,
    function(T) return {T.randn({5, 3}), T.long({0, 4, 4, 2, 1}), T.long({0, 2, 2})} end)
  case("F.embedding_bag mean over (B, L) ids", "embedding_bag",
    function(w, ids) return F.embedding_bag(ids, w, nil, {mode = "mean"}) end,
    function(T) return {T.randn({5, 3}), T.long({{0, 4, 4}, {2, 1, 0}})} end)

  ---------------------------------------------------------------------------
  -- no gradient: compared forward only
  ---------------------------------------------------------------------------

  case("nonzero of a 3-D x with zeros", "nonzero",
    function(x) return x:nonzero() end,
    function(T) return {T.values({0, 1.5, 0, -2, 0, 0, 3, 0.5, 0, 0, 0, -1}, {2, 3, 2})} end,
    nil, {grad = false})
  case("one_hot of (2, 3) ids with 5 classes", "one_hot",
    function(i) return F.one_hot(i, 5) end,
    function(T) return {T.long({{0, 4, 2}, {2, 2, 1}})} end,
    nil, {grad = false, dtypes = {"f32"}})
  case("one_hot inferring num_classes", "one_hot",
    function(i) return F.one_hot(i) end,
    function(T) return {T.long({3, 0, 1})} end,
    nil, {grad = false, dtypes = {"f32"}})

  ---------------------------------------------------------------------------
  -- perf: 2^24 elements moved; bytes count what the op must touch
  ---------------------------------------------------------------------------

  local function nbytes(t) return t:numel() * t:element_size() end
  -- a gather reads one element and one index (per position, or per row) and writes one
  local function gather_bytes(inputs, out) return 2 * nbytes(out) + nbytes(inputs[2]) end
  perf("index_select", "index_select 65536 random rows of (65536, 256)",
    function(x, i) return x:index_select(0, i) end,
    function(T) return {T.randn({65536, 256}), T.ids({65536}, 65536)} end, {bytes = gather_bytes})
  perf("gather", "gather (4096, 4096) along dim 1",
    function(x, i) return x:gather(1, i) end,
    function(T) return {T.randn({4096, 4096}), T.ids({4096, 4096}, 4096)} end, {bytes = gather_bytes})
  perf("take_along_dim", "take_along_dim (4096, 4096) along dim 1",
    function(x, i) return x:take_along_dim(i, 1) end,
    function(T) return {T.randn({4096, 4096}), T.ids({4096, 4096}, 4096)} end, {bytes = gather_bytes})
  -- scatter-add: read src and the index, read-modify-write the target (its copy included)
  local function scatter_bytes(inputs, out) return 3 * nbytes(out) + nbytes(inputs[2]) + nbytes(inputs[3]) end
  perf("scatter_add", "scatter_add (4096, 4096) into (4096, 4096) along dim 0",
    function(x, src, i) return x:scatter_add(0, i, src) end,
    function(T) return {T.randn({4096, 4096}), T.randn({4096, 4096}), T.ids({4096, 4096}, 4096)} end,
    {bytes = scatter_bytes})
  perf("scatter", "scatter (4096, 4096) along dim 1",
    function(x, src, i) return x:scatter(1, i, src) end,
    function(T) return {T.randn({4096, 4096}), T.randn({4096, 4096}), T.ids({4096, 4096}, 4096)} end,
    {bytes = scatter_bytes})
  perf("index_add", "index_add 65536 rows of 256 into (65536, 256)",
    function(x, src, i) return x:index_add(0, i, src) end,
    function(T) return {T.randn({65536, 256}), T.randn({65536, 256}), T.ids({65536}, 65536)} end,
    {bytes = function(inputs, out) return 3 * nbytes(out) + nbytes(inputs[2]) + nbytes(inputs[3]) end})
  perf("masked_select", "masked_select of 2^24 elements, half selected",
    function(x, m) return x:masked_select(m) end,
    function(T) return {T.randn({4096, 4096}), T.mask({4096, 4096})} end)
  -- the nonzero rows read a bool mask: one "bool" row, not an f32 and a bf16 row of the same input
  perf("nonzero", "nonzero of 2^24 elements, half nonzero",
    function(m) return m:nonzero() end,
    function(T) return {T.mask({4096, 4096})} end, {dtypes = {"bool"}})
  -- 2^26 elements, CUDA only: the size issue 12's bandwidth target is judged at
  perf("masked_select", "masked_select of (8192, 8192), half selected",
    function(x, m) return x:masked_select(m) end,
    function(T) return {T.randn({8192, 8192}), T.mask({8192, 8192})} end,
    {device = "cuda", torch = "a.masked_select(b)"})
  perf("nonzero", "nonzero of (8192, 8192), half nonzero",
    function(m) return m:nonzero() end,
    function(T) return {T.mask({8192, 8192})} end, {device = "cuda", torch = "a.nonzero()", dtypes = {"bool"}})
  perf("one_hot", "one_hot of 131072 ids over 128 classes",
    function(i) return F.one_hot(i, 128) end,
    function(T) return {T.ids({131072}, 128)} end)
  perf("index", "t:index({ids}) of 65536 random rows of (65536, 256)",
    function(x, i) return x:index({i}) end,
    function(T) return {T.randn({65536, 256}), T.ids({65536}, 65536)} end,
    {backward = true, torch = "a[b]",
     bytes = function(inputs, out) return 2 * nbytes(out) + nbytes(inputs[2]) end})
  perf("embedding_bag", "embedding_bag sum of (4096, 16) ids in (50304, 512)",
    function(w, i) return F.embedding_bag(i, w, nil, "sum") end,
    function(T) return {T.randn({50304, 512}), T.ids({4096, 16}, 50304)} end,
    {backward = true, torch = "F.embedding_bag(b, a, mode='sum')",
     bytes = function(inputs, out) return inputs[2]:numel() * 512 * inputs[1]:element_size() + nbytes(out) end})
  -- Issue 12's >= 70 % target is judged at 2^26 elements moved (128 MiB of
  -- bf16, 256 MiB of f32): the shapes above run ~20-60 us, mostly launch and
  -- ramp. CUDA only (the CPU's figures come from the entries above).
  local big = {device = "cuda"}
  local function with(o) local r = {} for k, v in pairs(big) do r[k] = v end for k, v in pairs(o) do r[k] = v end return r end
  perf("index_select", "index_select 262144 random rows of (262144, 256)",
    function(x, i) return x:index_select(0, i) end,
    function(T) return {T.randn({262144, 256}), T.ids({262144}, 262144)} end,
    with {bytes = gather_bytes, torch = "a.index_select(0, b)"})
  perf("index", "t:index({ids}) of 262144 random rows of (262144, 256)",
    function(x, i) return x:index({i}) end,
    function(T) return {T.randn({262144, 256}), T.ids({262144}, 262144)} end,
    with {torch = "a[b]", bytes = function(inputs, out) return 2 * nbytes(out) + nbytes(inputs[2]) end})
  perf("embedding_bag", "embedding_bag sum of (8192, 16) ids in (50304, 512)",
    function(w, i) return F.embedding_bag(i, w, nil, "sum") end,
    function(T) return {T.randn({50304, 512}), T.ids({8192, 16}, 50304)} end,
    with {torch = "F.embedding_bag(b, a, mode='sum')",
          bytes = function(inputs, out)
            return inputs[2]:numel() * (512 * inputs[1]:element_size() + 8) + nbytes(out)
          end})
  perf("gather", "gather (8192, 8192) along dim 1",
    function(x, i) return x:gather(1, i) end,
    function(T) return {T.randn({8192, 8192}), T.ids({8192, 8192}, 8192)} end,
    with {bytes = gather_bytes, torch = "a.gather(1, b)"})
  perf("take_along_dim", "take_along_dim (8192, 8192) along dim 1",
    function(x, i) return x:take_along_dim(i, 1) end,
    function(T) return {T.randn({8192, 8192}), T.ids({8192, 8192}, 8192)} end,
    with {bytes = gather_bytes, torch = "torch.take_along_dim(a, b, 1)"})
  perf("scatter_add", "scatter_add (8192, 8192) into (8192, 8192) along dim 0",
    function(x, src, i) return x:scatter_add(0, i, src) end,
    function(T) return {T.randn({8192, 8192}), T.randn({8192, 8192}), T.ids({8192, 8192}, 8192)} end,
    with {bytes = scatter_bytes, torch = "a.scatter_add(0, c, b)"})
  perf("scatter_add", "scatter_add (8192, 8192) into (8192, 8192) along dim 1",
    function(x, src, i) return x:scatter_add(1, i, src) end,
    function(T) return {T.randn({8192, 8192}), T.randn({8192, 8192}), T.ids({8192, 8192}, 8192)} end,
    with {bytes = scatter_bytes, torch = "a.scatter_add(1, c, b)"})
  perf("scatter", "scatter (8192, 8192) along dim 1",
    function(x, src, i) return x:scatter(1, i, src) end,
    function(T) return {T.randn({8192, 8192}), T.randn({8192, 8192}), T.ids({8192, 8192}, 8192)} end,
    with {bytes = scatter_bytes, torch = "a.scatter(1, c, b)"})
  perf("index_add", "index_add 262144 rows of 256 into (262144, 256)",
    function(x, src, i) return x:index_add(0, i, src) end,
    function(T) return {T.randn({262144, 256}), T.randn({262144, 256}), T.ids({262144}, 262144)} end,
    with {torch = "a.index_add(0, c, b)",
          bytes = function(inputs, out) return 3 * nbytes(out) + nbytes(inputs[2]) + nbytes(inputs[3]) end})
  -- PyTorch beside ours in bench_ops.lua --torch
  return {
    ["index_select 65536 random rows of (65536, 256)"] = [[a.index_select(0, b)]],
    ["gather (4096, 4096) along dim 1"] = [[a.gather(1, b)]],
    ["take_along_dim (4096, 4096) along dim 1"] = [[torch.take_along_dim(a, b, 1)]],
    ["scatter_add (4096, 4096) into (4096, 4096) along dim 0"] = [[a.scatter_add(0, c, b)]],
    ["scatter (4096, 4096) along dim 1"] = [[a.scatter(1, c, b)]],
    ["index_add 65536 rows of 256 into (65536, 256)"] = [[a.index_add(0, c, b)]],
    ["masked_select of 2^24 elements, half selected"] = [[a.masked_select(b)]],
    ["nonzero of 2^24 elements, half nonzero"] = [[a.nonzero()]],
    ["one_hot of 131072 ids over 128 classes"] = [[F.one_hot(a, 128)]],
  }
end
