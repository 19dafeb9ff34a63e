-- matmul_spec.lua — the VALUES of matmul and F.linear (engine/ops/matmul.c):
-- torch.matmul's shape rules (1-D·1-D, 1-D@2-D, 2-D@1-D, 2-D, batched,
-- broadcast batch dims), strided inputs, and every dtype family: f64/f32 (BLAS),
-- bf16/f16 (f32 accumulation, one rounding), integers (exact).
-- Gradients live in gradcheck_spec.lua, errors in bad_input_spec.lua.
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/matmul_spec.lua
--
-- References are Lua triple loops in double over t:tolist() values.
-- Tolerance: the classic dot-product error bound. A length-k dot product in
-- precision u (f64: 2^-53, f32: 2^-24) in any summation order is within
-- k·u·Σ|a_i·b_i| of the exact value (Higham, γ_k), so each element is checked
-- against (k + 2)·u·Σ|a_i·b_i| (+2: the final rounding and FMA slack). This is
-- tight enough that a wrong index or a missing term fails by orders of
-- magnitude, and loose enough for any BLAS blocking.

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local F = ember.nn.functional

local U64, U32 = 2 ^ -53, 2 ^ -24

local flat, f32 = H.flat, H.f32

local randn = H.randn

-- Reference matmul of two 2-D Lua tables: values and the Σ|a·b| bound per element.
local function mm(a, b)
  local n, k, m = #a, #b, #b[1]
  local c, bound = {}, {}
  for i = 1, n do
    c[i], bound[i] = {}, {}
    for j = 1, m do
      local s, sa = 0.0, 0.0
      for p = 1, k do
        s = s + a[i][p] * b[p][j]
        sa = sa + math.abs(a[i][p] * b[p][j])
      end
      c[i][j], bound[i][j] = s, sa
    end
  end
  return c, bound
end

-- got (nested list) against the reference (nested lists), element by element
local function assert_mm(got, want, bound, k, u, what)
  local function walk(g, w, b, path)
    if type(w) == "table" then
      assert.equals(#w, #g, what .. ": size at " .. path)
      for i = 1, #w do walk(g[i], w[i], b[i], path .. "[" .. i .. "]") end
      return
    end
    local tol = (k + 2) * u * b
    if not (math.abs(g - w) <= tol) then
      error(string.format("%s%s: got %.17g, expected %.17g (tolerance %.3g)", what, path, g, w, tol), 3)
    end
  end
  walk(got, want, bound, "")
end

local function row(v) return {v} end                     -- 1-D list -> (1, k)
local function col(v) local c = {} for i, x in ipairs(v) do c[i] = {x} end return c end

---------------------------------------------------------------------------

describe("matmul shapes (torch.matmul rules), f64", function()
  it("2-D @ 2-D: (3, 4) @ (4, 5)", function()
    local a, b = randn(1, {3, 4}), randn(2, {4, 5})
    local r = a:matmul(b)
    assert.same({3, 5}, r.shape)
    local want, bound = mm(a:tolist(), b:tolist())
    assert_mm(r:tolist(), want, bound, 4, U64, "2-D")
  end)

  it("1-D · 1-D is a 0-d dot product", function()
    local a, b = randn(3, {7}), randn(4, {7})
    local r = a:matmul(b)
    assert.equals(0, r:dim())
    local want, bound = mm(row(a:tolist()), col(b:tolist()))
    assert_mm(r:item(), want[1][1], bound[1][1], 7, U64, "dot")
  end)

  it("1-D @ 2-D: (4) @ (4, 3) gives (3)", function()
    local a, b = randn(5, {4}), randn(6, {4, 3})
    local r = a:matmul(b)
    assert.same({3}, r.shape)
    local want, bound = mm(row(a:tolist()), b:tolist())
    assert_mm(r:tolist(), want[1], bound[1], 4, U64, "vec @ mat")
  end)

  it("2-D @ 1-D: (3, 4) @ (4) gives (3)", function()
    local a, b = randn(7, {3, 4}), randn(8, {4})
    local r = a:matmul(b)
    assert.same({3}, r.shape)
    local want, bound = mm(a:tolist(), col(b:tolist()))
    local got = r:tolist()
    for i = 1, 3 do assert_mm(got[i], want[i][1], bound[i][1], 4, U64, "mat @ vec [" .. i .. "]") end
  end)

  it("batched: (2, 3, 4) @ (2, 4, 5) multiplies matching batches", function()
    local a, b = randn(9, {2, 3, 4}), randn(10, {2, 4, 5})
    local r = a:matmul(b)
    assert.same({2, 3, 5}, r.shape)
    local la, lb, lr = a:tolist(), b:tolist(), r:tolist()
    for i = 1, 2 do
      local want, bound = mm(la[i], lb[i])
      assert_mm(lr[i], want, bound, 4, U64, "batch " .. i)
    end
  end)

  it("broadcasts batch dims: (2, 1, 3, 4) @ (5, 4, 2) gives (2, 5, 3, 2)", function()
    local a, b = randn(11, {2, 1, 3, 4}), randn(12, {5, 4, 2})
    local r = a:matmul(b)
    assert.same({2, 5, 3, 2}, r.shape)
    local la, lb, lr = a:tolist(), b:tolist(), r:tolist()
    for i = 1, 2 do
      for j = 1, 5 do
        local want, bound = mm(la[i][1], lb[j])
        assert_mm(lr[i][j], want, bound, 4, U64, string.format("batch (%d, %d)", i, j))
      end
    end
  end)

  it("a batched matrix times a shared 2-D matrix: (2, 3, 4) @ (4, 5)", function()
    local a, b = randn(13, {2, 3, 4}), randn(14, {4, 5})
    local r = a:matmul(b)
    assert.same({2, 3, 5}, r.shape)
    local la, lr = a:tolist(), r:tolist()
    for i = 1, 2 do
      local want, bound = mm(la[i], b:tolist())
      assert_mm(lr[i], want, bound, 4, U64, "shared rhs, batch " .. i)
    end
  end)

  it("1-D @ batched: (4) @ (2, 4, 3) gives (2, 3)", function()
    local a, b = randn(15, {4}), randn(16, {2, 4, 3})
    local r = a:matmul(b)
    assert.same({2, 3}, r.shape)
    local lb, lr = b:tolist(), r:tolist()
    for i = 1, 2 do
      local want, bound = mm(row(a:tolist()), lb[i])
      assert_mm(lr[i], want[1], bound[1], 4, U64, "vec @ batch " .. i)
    end
  end)

  it("an empty inner dim gives zeros: (2, 0) @ (0, 3)", function()
    local r = ember.zeros(2, 0):matmul(ember.zeros(0, 3))
    assert.same({{0, 0, 0}, {0, 0, 0}}, r:tolist())
  end)

  it("a larger f64 product (33, 65) @ (65, 17) exercises BLAS blocking", function()
    local a, b = randn(17, {33, 65}), randn(18, {65, 17})
    local want, bound = mm(a:tolist(), b:tolist())
    assert_mm(a:matmul(b):tolist(), want, bound, 65, U64, "large")
  end)
end)

describe("matmul with k cut into blocks (few tiles, long k: engine/ops/matmul.c's gemm_kblock)", function()
  -- (40 x 50, k 1100) is one tile of over 2M multiply-adds: k runs as 4
  -- blocks (3 of 288, one of 236) whose partials are summed in block order;
  -- (520 x 8, k 2048) is 2 tiles of 272 and 248 rows, each 8 k-blocks of 256
  it("a transposed-view (1100, 40)ᵀ @ (1100, 50) in f64 matches the reference", function()
    local a, b = randn(51, {1100, 40}), randn(52, {1100, 50})
    local want, bound = mm(a:t():tolist(), b:tolist())
    assert_mm(a:t():matmul(b):tolist(), want, bound, 1100, U64, "k blocks")
  end)

  it("(520, 2048) @ (2048, 8) in f64 (2 tiles of >= 256 rows x 8 k-blocks) matches the reference", function()
    -- the reference by broadcast products summed over k (the reduction code,
    -- not the gemm's): a Lua triple loop of 8.5M steps would take seconds
    local a, b = randn(56, {520, 2048}), randn(57, {2048, 8})
    local want = (a:unsqueeze(2) * b:unsqueeze(0)):sum(1)
    local bound = (a:abs():unsqueeze(2) * b:abs():unsqueeze(0)):sum(1)
    assert_mm(a:matmul(b):tolist(), want:tolist(), bound:tolist(), 2048, U64, "big tiles, k blocks")
  end)

  it("F.linear with a bias (beta = 1 on the first block) matches x wᵀ + b in f64", function()
    local x, w, bias = randn(53, {40, 1100}), randn(54, {50, 1100}), randn(55, {50})
    local want, bound = mm(x:tolist(), w:t():tolist())
    local bl = bias:tolist()
    for i = 1, 40 do
      for j = 1, 50 do want[i][j], bound[i][j] = want[i][j] + bl[j], bound[i][j] + math.abs(bl[j]) end
    end
    assert_mm(F.linear(x, w, bias):tolist(), want, bound, 1101, U64, "linear k blocks")
  end)
end)

describe("matmul on strided inputs", function()
  it("transposed views (strides (1, 3) and (1, 4)) multiply by their logical values", function()
    local a = randn(20, {4, 3}):t()            -- (3, 4), strides (1, 3)
    local b = randn(21, {5, 4}):t()            -- (4, 5), strides (1, 4)
    assert.is_false(a:is_contiguous())
    local want, bound = mm(a:tolist(), b:tolist())
    assert_mm(a:matmul(b):tolist(), want, bound, 4, U64, "transposed")
  end)

  it("a matrix with no unit stride (a slice of a 3-D tensor) is read correctly", function()
    local base = randn(22, {3, 4, 5})
    local a = base:select(2, 1)                -- (3, 4), strides (20, 5)
    local b = randn(23, {4, 2})
    local want, bound = mm(a:tolist(), b:tolist())
    assert_mm(a:matmul(b):tolist(), want, bound, 4, U64, "no unit stride")
  end)

  it("a narrowed (offset) operand", function()
    local a = randn(24, {5, 6}):narrow(0, 1, 3):narrow(1, 2, 4)    -- (3, 4) at offset 8
    local b = randn(25, {4, 3})
    local want, bound = mm(a:tolist(), b:tolist())
    assert_mm(a:matmul(b):tolist(), want, bound, 4, U64, "narrowed")
  end)

  it("a broadcast (expanded, stride 0) batch operand", function()
    local a = randn(26, {1, 3, 4}):expand(2, 3, 4)
    local b = randn(27, {2, 4, 2})
    local la, lb, lr = a:tolist(), b:tolist(), a:matmul(b):tolist()
    for i = 1, 2 do
      local want, bound = mm(la[i], lb[i])
      assert_mm(lr[i], want, bound, 4, U64, "expanded " .. i)
    end
  end)

  it("a batched left operand whose batch and row dims do not merge, times a shared matrix", function()
    local a = randn(29, {3, 2, 4}):transpose(0, 1)       -- (2, 3, 4), strides (4, 8, 1)
    local b = randn(30, {4, 5})
    local la, lr = a:tolist(), a:matmul(b):tolist()
    for i = 1, 2 do
      local want, bound = mm(la[i], b:tolist())
      assert_mm(lr[i], want, bound, 4, U64, "unmergeable batch " .. i)
    end
  end)

  it("a permuted batch (B, T, H, d) -> (B, H, T, d) times its transpose", function()
    local x = randn(28, {2, 3, 2, 4}):permute(0, 2, 1, 3)   -- (2, 2, 3, 4), non-contiguous
    local r = x:matmul(x:transpose(-2, -1))                 -- (2, 2, 3, 3)
    assert.same({2, 2, 3, 3}, r.shape)
    local lx, lr = x:tolist(), r:tolist()
    for i = 1, 2 do for h = 1, 2 do
      local xt = {}
      for p = 1, 4 do xt[p] = {} for q = 1, 3 do xt[p][q] = lx[i][h][q][p] end end
      local want, bound = mm(lx[i][h], xt)
      assert_mm(lr[i][h], want, bound, 4, U64, "permuted")
    end end
  end)
end)

describe("matmul dtypes", function()
  it("f32 is within the f32 dot-product bound of the exact product", function()
    local a, b = randn(30, {6, 40}, "f32"), randn(31, {40, 7}, "f32")
    local r = a:matmul(b)
    assert.equals("f32", r.dtype)
    local want, bound = mm(a:tolist(), b:tolist())
    assert_mm(r:tolist(), want, bound, 40, U32, "f32")
  end)

  for _, dt in ipairs({"bf16", "f16"}) do
    it(dt .. " equals the f32 product of the same values, rounded once (within 1 " .. dt .. " ulp)", function()
      -- f32 accumulation then one rounding: the result is the f32 matmul of the
      -- widened inputs rounded to the dtype. 1 ulp of the dtype covers an f32
      -- result that differs by an f32 rounding and lands on the other side of a
      -- rounding boundary.
      local a, b = randn(32, {5, 24}, dt), randn(33, {24, 6}, dt)
      local r = a:matmul(b)
      assert.equals(dt, r.dtype)
      local ref = a:float():matmul(b:float()):to(dt)
      local bits = dt == "bf16" and 8 or 11
      local got, want = flat(r), flat(ref)
      for i = 1, #want do
        local w = want[i]
        local ulp = w == 0 and 0 or 2.0 ^ (math.floor(math.log(math.abs(w), 2)) - bits + 1)
        assert.is_true(math.abs(got[i] - w) <= ulp,
          string.format("%s element %d: got %.9g, expected %.9g", dt, i, got[i], w))
      end
    end)

    it(dt .. " accumulates in f32: 1 + n × (half an ulp of 1) sums to 2", function()
      -- a row of ones times the column {1, h, h, ..., h} with n·h = 1 and h half
      -- of the dtype's ulp at 1: each 1 + h is a tie that rounds back to 1, so
      -- an accumulator in the 16-bit dtype would return 1; f32 returns 2 exactly
      local h = dt == "bf16" and 2 ^ -8 or 2 ^ -11
      local n = math.tointeger(1 / h)
      local bcol = {{1}}
      for i = 2, n + 1 do bcol[i] = {h} end
      local a = ember.ones(1, n + 1, {dtype = dt})
      local b = ember.tensor(bcol, {dtype = dt})
      assert.equals(2, a:matmul(b):item())
    end)
  end

  it("bf16 against a Lua double reference: within 1 bf16 ulp plus the f32 bound", function()
    local a, b = randn(34, {4, 16}, "bf16"), randn(35, {16, 3}, "bf16")
    local want, bound = mm(a:tolist(), b:tolist())
    local got = a:matmul(b):tolist()
    for i = 1, 4 do for j = 1, 3 do
      local w = want[i][j]
      local ulp = 2.0 ^ (math.floor(math.log(math.abs(w), 2)) - 7)
      local tol = ulp + 18 * U32 * bound[i][j]
      assert.is_true(math.abs(got[i][j] - w) <= tol, string.format("(%d,%d): %.9g vs %.9g", i, j, got[i][j], w))
    end end
  end)

  it("i64 is exact integer arithmetic", function()
    ember.manual_seed(36)
    local a = ember.randint(-1000, 1000, {3, 8}, {dtype = "i64"})
    local b = ember.randint(-1000, 1000, {8, 4}, {dtype = "i64"})
    local r = a:matmul(b)
    assert.equals("i64", r.dtype)
    local la, lb, lr = a:tolist(), b:tolist(), r:tolist()
    for i = 1, 3 do for j = 1, 4 do
      local s = 0
      for p = 1, 8 do s = s + la[i][p] * lb[p][j] end
      assert.equals(s, lr[i][j])
      assert.equals("integer", math.type(lr[i][j]))
    end end
  end)

  it("i64 stays exact past 2^53 (no detour through double)", function()
    local big = (1 << 31) + 1
    local a = ember.tensor({{big, big}}, {dtype = "i64"})
    local b = ember.tensor({{big}, {1}}, {dtype = "i64"})
    assert.equals(big * big + big, a:matmul(b):item())     -- 2^62 + 3·2^31 + 2
  end)

  it("i32 keeps its dtype", function()
    local a = ember.tensor({{1, 2}, {3, 4}}, {dtype = "i32"})
    local r = a:matmul(a)
    assert.equals("i32", r.dtype)
    assert.same({{7, 10}, {15, 22}}, r:tolist())
  end)
end)

describe("F.linear", function()
  local function linear_ref(x2, w, b)        -- x2 (n, in), w (out, in), b (out) or nil
    local out, bound = {}, {}
    for i = 1, #x2 do
      out[i], bound[i] = {}, {}
      for o = 1, #w do
        local s, sa = b and b[o] or 0.0, b and math.abs(b[o]) or 0.0
        for p = 1, #w[o] do
          s = s + x2[i][p] * w[o][p]
          sa = sa + math.abs(x2[i][p] * w[o][p])
        end
        out[i][o], bound[i][o] = s, sa
      end
    end
    return out, bound
  end

  it("with bias equals x wᵀ + b on a (2, 3, 4) input", function()
    local x, w, b = randn(40, {2, 3, 4}), randn(41, {5, 4}), randn(42, {5})
    local r = F.linear(x, w, b)
    assert.same({2, 3, 5}, r.shape)
    local lx, lr = x:tolist(), r:tolist()
    for i = 1, 2 do
      local want, bound = linear_ref(lx[i], w:tolist(), b:tolist())
      assert_mm(lr[i], want, bound, 5, U64, "linear batch " .. i)
    end
  end)

  it("without bias equals x wᵀ", function()
    local x, w = randn(43, {3, 4}), randn(44, {2, 4})
    local r = F.linear(x, w)
    local want, bound = linear_ref(x:tolist(), w:tolist(), nil)
    assert_mm(r:tolist(), want, bound, 4, U64, "linear no bias")
  end)

  it("equals matmul with the transposed weight plus the bias (f32)", function()
    local x, w, b = randn(45, {4, 8}, "f32"), randn(46, {3, 8}, "f32"), randn(47, {3}, "f32")
    local want, bound = linear_ref(x:tolist(), w:tolist(), b:tolist())
    assert_mm(F.linear(x, w, b):tolist(), want, bound, 9, U32, "linear f32")
    local composed = (x:matmul(w:t()) + b):tolist()
    assert_mm(composed, want, bound, 9, U32, "x @ w^T + b")
  end)

  it("a 1-D input gives a 1-D output", function()
    local x, w, b = randn(48, {4}), randn(49, {3, 4}), randn(50, {3})
    local r = F.linear(x, w, b)
    assert.same({3}, r.shape)
    local want, bound = linear_ref({x:tolist()}, w:tolist(), b:tolist())
    assert_mm(r:tolist(), want[1], bound[1], 5, U64, "linear 1-D")
  end)

  it("bf16 linear rounds the f32 result once", function()
    local x, w, b = randn(51, {3, 16}, "bf16"), randn(52, {4, 16}, "bf16"), randn(53, {4}, "bf16")
    local r = F.linear(x, w, b)
    assert.equals("bf16", r.dtype)
    local want, bound = linear_ref(x:tolist(), w:tolist(), b:tolist())
    local got = r:tolist()
    for i = 1, 3 do for o = 1, 4 do
      local wv = want[i][o]
      local ulp = 2.0 ^ (math.floor(math.log(math.abs(wv), 2)) - 7)
      assert.is_true(math.abs(got[i][o] - wv) <= ulp + 19 * U32 * bound[i][o],
        string.format("(%d,%d): %.9g vs %.9g", i, o, got[i][o], wv))
    end end
  end)
end)
