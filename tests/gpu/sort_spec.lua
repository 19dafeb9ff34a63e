-- sort_spec.lua (GPU) — kernels/sort.cu and kernels/scan.cu against the CPU
-- (engine/ops/sort.c, engine/ops/scan.c) on the same inputs and dtype, over
-- shapes chosen to drive every path: one long row (cub::DeviceRadixSort),
-- many short rows and a few long ones (cub::DeviceSegmentedSort's warp,
-- block and radix paths), a dim that is not the last, a transposed view;
-- every key width (u8/bool, bf16/f16/u16, f32/i32, f64/i64); heavy ties
-- (stability: the indices must match the CPU's exactly) and NaNs. Sorts of
-- rows of at most 1024 take the selection path (kernels/sort.cu's
-- select_rows: a shared-memory bitonic sort per row); longer ones CUB.
-- Scans: the single-row device scan (forward and reversed, through
-- cumsum's backward), the block-per-row scan and the column scan.
--
-- Selections move values without arithmetic: values and indices must match
-- exactly. Scans: compare.lua's tolerance for the result dtype (the GPU
-- accumulates in f32, the CPU in double).
local ember = require "ember"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local cmp = dofile(here .. "compare.lua")

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

-- Run f on the CPU input(s) and on CUDA copies; compare every returned tensor.
local function agree(what, f, inputs, exact)
  local cpu, gpu = {}, {}
  for i, x in ipairs(inputs) do cpu[i] = x; gpu[i] = x:to("cuda") end
  local r = table.pack(f(table.unpack(cpu)))
  local g = table.pack(f(table.unpack(gpu)))
  assert.are.equal(r.n, g.n, what .. ": number of results")
  for i = 1, r.n do
    assert.are.equal("cuda:0", g[i].device, what .. ": device")
    assert.are.equal(r[i].dtype, g[i].dtype, what .. ": dtype")
    cmp.assert_close(g[i], r[i], exact and 0 or cmp.rtol(r[i].dtype), ("%s (result %d)"):format(what, i))
  end
end

local function with_nans(x)
  return x:masked_fill(ember.rand(x.shape):lt(0.05), 0 / 0)
end

local SHAPES = {
  {"one long row", {100003}, 0},
  {"many short rows", {2000, 7}, 1},
  {"medium rows", {64, 3000}, -1},
  {"a few long rows", {3, 70001}, 1},
  {"along dim 0", {500, 9}, 0},
  {"along the middle dim", {6, 400, 5}, 1},
  {"long columns (dim 0 of 5000 rows: strided, inner 3)", {5000, 3}, 0},
}

describe("sort on CUDA matches the CPU exactly", function()
  ember.manual_seed(11)
  for _, dt in ipairs({"f32", "bf16", "f16", "f64"}) do
    for _, s in ipairs(SHAPES) do
      it(("%s %s, NaNs included, ascending and descending"):format(s[1], dt), function()
        local x = with_nans(ember.randn(s[2], {dtype = "f64"})):to(dt)
        agree("sort", function(a) return a:sort(s[3]) end, {x}, true)
        agree("sort desc", function(a) return a:sort(s[3], {descending = true}) end, {x}, true)
      end)
    end
  end
  for _, dt in ipairs({"i32", "i64", "u8", "u16", "bool", "f32", "bf16"}) do
    it(("heavy ties keep input order (%s)"):format(dt), function()
      local x = ember.randint(0, 3, {300, 257}):to(dt)
      agree("sort ties", function(a) return a:sort(1) end, {x}, true)
      agree("sort ties desc", function(a) return a:sort(0, {descending = true}) end, {x}, true)
      agree("sort ties one row", function(a) return a:reshape(-1):sort(0) end, {x}, true)
    end)
  end
  it("rows of 1025 to 4096 (one block sorts each in shared memory) and 4097 (CUB): ties, every key width", function()
    for _, L in ipairs({1025, 2048, 4096, 4097}) do
      local ties = ember.randint(0, 5, {33, L})
      for _, dt in ipairs({"f32", "bf16", "f64", "i64", "u8", "bool"}) do
        agree(("sort ties L=%d %s"):format(L, dt), function(a) return a:sort(1) end, {ties:to(dt)}, true)
        agree(("sort ties desc L=%d %s"):format(L, dt), function(a) return a:sort(1, {descending = true}) end, {ties:to(dt)}, true)
      end
      local x = with_nans(ember.randn({9, L}, {dtype = "f64"})):to("f16")
      agree("argsort f16 L=" .. L, function(a) return a:argsort(1) end, {x}, true)
      agree("median with NaN rows L=" .. L, function(a) return a:median(1) end, {x}, true)
      agree("kthvalue past 1024 L=" .. L, function(a) return a:kthvalue(1025, 1) end, {x}, true)
      agree("sort along dim 0, L=" .. L, function(a) return a:t():sort(1) end, {x:t():contiguous()}, true)
    end
  end)
  it("long rows through the global radix sort: a strided single row, windows past 1024, NaN medians", function()
    -- sort_impl's 32-bit index paths: one row-major row (no division), one
    -- strided row, several rows with a window of cnt < L, an inner stride
    local x = with_nans(ember.randn({2, 9001}, {dtype = "f64"})):to("bf16")
    agree("sort of a strided row", function(a) return a:narrow(0, 1, 1):reshape(-1):narrow(0, 0, 9000):reshape(4500, 2):select(1, 1):sort() end,
      {x}, true)
    agree("kthvalue 3000 of long rows", function(a) return a:kthvalue(3000, 1) end, {x}, true)
    agree("median of long NaN rows", function(a) return a:median(1) end, {x}, true)
    agree("median of one long NaN row", function(a) return a:select(0, 1):median(0) end, {x}, true)
    agree("kthvalue 3000 along dim 0", function(a) return a:t():contiguous():kthvalue(3000, 0) end, {x}, true)
  end)

  it("reads a transposed view", function()
    local x = ember.randn({700, 33})
    agree("sort of a transpose", function(a) return a:t():sort(1) end, {x}, true)
    agree("argsort of a transpose", function(a) return a:t():argsort(0, {descending = true}) end, {x}, true)
  end)
  it("keeps -0 and +0 apart in the values but equal in the order", function()
    local x = ember.tensor({0.0, -0.0, 1, -0.0, 0.0, -1})
    agree("signed zeros", function(a) return a:sort() end, {x}, true)
    local v = x:to("cuda"):sort():cpu():tolist()
    assert.are.equal(1 / 0, 1 / v[2])
    assert.are.equal(-1 / 0, 1 / v[3])
    -- a long row (CUB, values rebuilt from the keys): the zeros' signs come back from the input, in order
    local long = ember.randint(-3, 4, {20011}):to("f32"):mul(0.5):masked_fill(ember.rand(20011):lt(0.2), -0.0)
    for _, dt in ipairs({"f32", "bf16", "f64"}) do
      local c, g = long:to(dt):sort(0), long:to(dt):to("cuda"):sort(0):cpu()
      local cl, gl = c:tolist(), g:tolist()
      for i = 1, #cl do
        assert.are.equal(cl[i], gl[i])
        if cl[i] == 0 then assert.are.equal(1 / cl[i], 1 / gl[i], dt .. ": sign of zero at " .. i) end
      end
    end
  end)
end)

describe("topk, kthvalue, median on CUDA", function()
  ember.manual_seed(12)
  it("topk k=50 of logits rows, largest and smallest", function()
    local x = with_nans(ember.randn({16, 20000}))
    agree("topk", function(a) return a:topk(50) end, {x}, true)
    agree("topk smallest dim 0", function(a) return a:topk(5, 0, {largest = false}) end, {x}, true)
  end)
  -- topk/kthvalue with K = j0 + cnt <= 1024 take the radix select of
  -- kernels/sort.cu (select_rows): long rows (1024 threads) and short ones,
  -- aligned rows (16-byte loads) and not, every key width, and ties at the
  -- K-th key beyond the 2048 shared slots (the gather in index order).
  it("topk by radix select: every key width, long and unaligned rows, k up to 1024 and past it", function()
    local x = with_nans(ember.randn({5, 40001}, {dtype = "f64"}))   -- 40001: rows not 16-byte aligned
    for _, dt in ipairs({"f32", "f64", "bf16", "f16"}) do
      local xd = x:to(dt)
      agree("topk " .. dt, function(a) return a:topk(100) end, {xd}, true)
      agree("topk smallest " .. dt, function(a) return a:topk(7, 1, {largest = false}) end, {xd}, true)
      agree("topk k=1024 " .. dt, function(a) return a:narrow(1, 0, 40000):topk(1024) end, {xd}, true)
      agree("topk k=1025 (sorted) " .. dt, function(a) return a:topk(1025) end, {xd}, true)
    end
    local ids = ember.randint(-50, 50, {6, 30000})
    for _, dt in ipairs({"i64", "i32", "u8", "bool"}) do
      agree("topk ints " .. dt, function(a) return a:topk(33) end, {ids:to(dt)}, true)
    end
  end)
  it("topk and kthvalue with thousands of ties at the k-th value keep the lowest indices", function()
    local z = ember.zeros(4, 9000)
    z:narrow(1, 100, 5):fill_(1)
    agree("topk over zeros", function(a) return a:topk(10) end, {z}, true)
    agree("topk smallest over zeros", function(a) return a:topk(300, 1, {largest = false}) end, {z}, true)
    local few = ember.randint(0, 3, {8, 9000}):to("f32")   -- ~3000 copies of each value
    agree("topk few values", function(a) return a:topk(500) end, {few}, true)
    agree("kthvalue few values", function(a) return a:kthvalue(1000, 1) end, {few}, true)
    agree("topk bf16 long rows", function(a) return a:topk(64) end, {ember.randn({3, 70001}):to("bf16")}, true)
  end)
  it("kthvalue and median along dims, NaN rows included", function()
    local x = with_nans(ember.randn({40, 301}))
    agree("kthvalue", function(a) return a:kthvalue(17, 1) end, {x}, true)
    agree("kthvalue keepdim dim 0", function(a) return a:kthvalue(3, 0, {keepdim = true}) end, {x}, true)
    agree("median", function(a) return a:median(1) end, {x}, true)
    agree("median over all", function(a) return a:median() end, {ember.randn({1001})}, true)
    agree("median over all with NaN", function(a) return a:median() end, {x}, true)
  end)
  it("the values' gradient is scattered through the indices", function()
    local x = ember.randn({8, 100}, {dtype = "f32"})
    local g = ember.randn({8, 10})
    local function grad_of(a, w)
      a = a:detach(); a.requires_grad = true
      local v = a:topk(10, 1)
      local loss = (v * w):sum()
      loss:backward()
      return a.grad
    end
    agree("topk backward", grad_of, {x, g}, true)
  end)
end)

describe("cumsum and cumprod on CUDA", function()
  ember.manual_seed(13)
  for _, dt in ipairs({"f32", "bf16", "f16", "f64"}) do   -- bf16/f16: widened and rounded inside the scan
    it(("every launch shape (%s), forward and backward"):format(dt), function()
      local cases = {{{1 << 20}, 0}, {{300, 2500}, 1}, {{300, 2500}, 0}, {{7, 300, 5}, 1}}
      for _, c in ipairs(cases) do
        local x = ember.randn(c[1], {dtype = "f64"}):to(dt)
        agree("cumsum", function(a) return a:cumsum(c[2]) end, {x})
        local function grad_of(a)
          a = a:detach(); a.requires_grad = true
          a:cumsum(c[2]):backward(ember.ones(a.shape, {dtype = a.dtype, device = a.device}))
          return a.grad
        end
        agree("cumsum backward (reversed scan)", grad_of, {x})
      end
    end)
  end
  it("cumprod with zeros: forward and the exact backward", function()
    local x = ember.rand({64, 200}, {dtype = "f64"}) * 0.2 + 0.9
    x = x:masked_fill(ember.rand({64, 200}):lt(0.01), 0)
    agree("cumprod", function(a) return a:cumprod(1) end, {x})
    local function grad_of(a)
      a = a:detach(); a.requires_grad = true
      a:cumprod(1):sum():backward()
      return a.grad
    end
    agree("cumprod backward", grad_of, {x})
    agree("cumprod backward f32 dim 0", grad_of, {x:t():contiguous():to("f32")})
  end)
  -- kernels/scan.cu's scan_strips (scanned dim not innermost, >= 32 columns):
  -- each column combined in row order in the accumulator (f32 for bf16), one
  -- rounding per output, so the result is the bits of a walk of row ops.
  it("column scans in strips of 32 are the bits of the row-by-row walk, forward and reversed", function()
    for _, dt in ipairs({"f32", "bf16", "f64"}) do
      local acc = dt == "bf16" and "f32" or dt
      -- 600 rows: several tiles (256 f32 / 512 bf16 / 128 f64 rows); 100 columns: a partial strip
      for _, c in ipairs({{{600, 100}, 0}, {{3, 300, 40}, 1}}) do
        local x = (ember.randn(c[1], {dtype = "f64"}) * 0.05 + 1):to(dt):cuda()
        local L = c[1][c[2] + 1]
        for _, op in ipairs({"cumsum", "cumprod"}) do
          for _, reverse in ipairs({false, true}) do
            local rows, a = {}, nil
            for k = 0, L - 1 do
              local r = reverse and L - 1 - k or k
              local v = x:select(c[2], r):to(acc)
              a = a == nil and v or (op == "cumsum" and a + v or a * v)
              rows[r + 1] = a:to(dt)
            end
            local got
            if reverse then   -- the reversed scan: cumsum's backward, or a flipped cumprod
              if op == "cumsum" then
                local xl = x:detach(); xl.requires_grad = true
                xl:cumsum(c[2]):backward(x)
                got = xl.grad
              else
                got = x:flip(c[2]):cumprod(c[2]):flip(c[2])
              end
            else
              got = x[op](x, c[2])
            end
            cmp.assert_same_bits(got, ember.stack(rows, c[2]),
              ("%s %s %s dim %d%s"):format(op, dt, table.concat(c[1], "x"), c[2], reverse and " reversed" or ""))
          end
        end
      end
    end
  end)

  it("cumprod's backward along a dim of >= 32 columns (strips), zeros anywhere, several tiles", function()
    for _, dt in ipairs({"f32", "f64"}) do
      for _, c in ipairs({{{600, 100}, 0}, {{3, 300, 40}, 1}}) do
        local x = ember.rand(c[1], {dtype = "f64"}) * 0.2 + 0.9
        x = x:masked_fill(ember.rand(c[1]):lt(0.005), 0)
        -- zeros in row 0, twice in one column (different tiles), in the last row
        local t = x:tolist()
        local m = c[2] == 0 and t or t[2]   -- (rows, columns) of one outer slice
        m[1][4], m[131][6], m[260][6], m[#m][8] = 0, 0, 0, 0
        x = ember.tensor(t, {dtype = "f64"})
        local function grad_of(a, w)   -- upstream gradient w: every g_j read at its own row
          a = a:detach(); a.requires_grad = true
          local l = (a:cumprod(c[2]) * w):sum()
          l:backward()
          return a.grad
        end
        agree(("cumprod backward %s %s dim %d"):format(dt, table.concat(c[1], "x"), c[2]), grad_of,
          {x:to(dt), ember.randn(c[1], {dtype = "f64"}):to(dt)})
      end
    end
  end)

  it("integer scans give i64 and match exactly", function()
    local x = ember.randint(-5, 6, {4096}):to("i32")
    agree("cumsum i32", function(a) return a:cumsum(0) end, {x}, true)
    agree("cumsum rows i32", function(a) return a:reshape(64, 64):cumsum(1) end, {x}, true)
  end)
end)

describe("unique, bincount, searchsorted on CUDA", function()
  ember.manual_seed(14)
  it("unique with inverse and counts", function()
    for _, dt in ipairs({"i64", "f32", "bf16", "u8"}) do
      local x = ember.randint(0, 200, {50, 401}):to(dt)
      agree("unique " .. dt, function(a) return a:unique({return_inverse = true, return_counts = true}) end, {x}, true)
    end
    agree("unique with NaNs", function(a) return a:unique() end, {with_nans(ember.randint(0, 9, {999}):to("f32"))},
      true)
  end)
  it("unique of integers sorted as narrowed keys (u8, u16, i32) and unnarrowed (a span past 2^31)", function()
    local cases = {{-3, 100, "i64"}, {-1000, 50000, "i32"}, {0, 100000, "i64"}, {0, 60000, "u16"},
                   {-(1 << 40), 1 << 40, "i64"}}
    for _, c in ipairs(cases) do
      local x = ember.randint(c[1], c[2], {3, 70001}):to(c[3])
      agree(("unique [%d, %d) %s"):format(c[1], c[2], c[3]),
        function(a) return a:unique({return_inverse = true, return_counts = true}) end, {x}, true)
    end
  end)
  it("bincount in shared memory, in global memory, and weighted", function()
    agree("bincount small", function(a) return a:bincount() end, {ember.randint(0, 1000, {200000})}, true)
    agree("bincount large", function(a) return a:bincount() end, {ember.randint(0, 50000, {200000})}, true)
    agree("bincount weighted f64", function(a, w) return a:bincount(w) end,
      {ember.randint(0, 100, {5000}), ember.rand({5000}, {dtype = "f64"})})
    agree("bincount weighted f32", function(a, w) return a:bincount(w, 300) end,
      {ember.randint(0, 100, {5000}), ember.rand({5000})})
  end)
  it("bincount in one read (counts and range together): every integer dtype, tails, misaligned, past the bins", function()
    -- 12288 shared bins: values below are counted in the same read as the range; a value past them (or a view
    -- not on a 16-byte boundary) takes the general path; minlength past the bins pads with zeros.
    local cases = {{0, 4096, 1000003, "i64"}, {0, 12288, 300001, "i32"}, {0, 256, 99999, "u8"},
                   {0, 60000, 77777, "u16"}, {0, 12289, 200000, "i64"}, {5, 9, 7, "i64"}, {0, 3, 1, "i32"}}
    for _, c in ipairs(cases) do
      local x = ember.randint(c[1], c[2], {c[3]}):to(c[4])
      agree(("bincount [%d, %d) n %d %s"):format(c[1], c[2], c[3], c[4]), function(a) return a:bincount() end, {x},
        true)
      agree(("bincount [%d, %d) %s, minlength 20000"):format(c[1], c[2], c[4]),
        function(a) return a:bincount(nil, 20000) end, {x}, true)
    end
    local x = ember.randint(0, 700, {4099})
    agree("bincount of a misaligned view", function(a) return a:narrow(0, 1, 4097):bincount() end, {x}, true)
    local big = ember.cat({ember.randint(0, 100, {77777}), ember.tensor({12288}, {dtype = "i64"}),
                           ember.randint(0, 100, {22222})}, 0)
    agree("bincount with one value just past the bins", function(a) return a:bincount() end, {big}, true)
    local neg = ember.cat({ember.randint(0, 100, {4999}), ember.tensor({-3}, {dtype = "i64"})}, 0):cuda()
    local ok, err = pcall(function() return neg:bincount() end)
    assert.is_false(ok)
    assert.matches("bincount: expected non%-negative values, got %-3", tostring(err))
  end)
  it("searchsorted left and right, 1-D and row-wise", function()
    local seq = ember.randint(0, 50, {1000}):to("f32"):sort()
    local v = ember.randint(-2, 53, {37, 11}):to("f32")
    agree("searchsorted left", function(s, a) return ember.searchsorted(s, a) end, {seq, v}, true)
    agree("searchsorted right", function(s, a) return ember.searchsorted(s, a, {right = true}) end, {seq, v}, true)
    local rows = ember.randn({37, 200}):sort(1)
    agree("searchsorted rows", function(s, a) return ember.searchsorted(s, a) end, {rows, ember.randn({37, 9})}, true)
    agree("searchsorted ints", function(s, a) return ember.searchsorted(s, a, {right = true}) end,
      {ember.randint(0, 30, {100}):sort(), ember.randint(0, 30, {500})}, true)
  end)
end)
