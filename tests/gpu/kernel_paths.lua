-- kernel_paths.lua — touches every launch shape of kernels/elementwise.cu and
-- kernels/reduce.cu once, on small odd sizes, so that a memory checker sees
-- each kernel (it is not a spec: the specs check values).
--   compute-sanitizer --tool memcheck --error-exitcode 1 build/ember run tests/gpu/kernel_paths.lua
local ember = require "ember"
assert(ember.cuda.is_available(), "needs a CUDA device")

local function r(shape, dt) return ember.randn(shape):to({device = "cuda", dtype = dt or "f32"}) end
local n = 1029
for _, dt in ipairs({"f32", "bf16", "f16", "f64"}) do
  local a, b = r({n}, dt), r({n}, dt)
  local _ = a + b, a:narrow(0, 1, n - 1) * 2, a:gelu(), a:lt(b), a + r({}, dt)          -- contig, unaligned, bool out, scalar
  local m = r({7, 40}, dt)
  _ = m + r({40}, dt), m * r({7, 1}, dt), m:t():exp(), ember.where(m:gt(0), m, 0.5)      -- rows, per-row, strided, where
  local w = r({301, 64}, dt)                                                                -- bf16/f16: rows2d
  _ = w + r({64}, dt), w:narrow(1, 8, 48) * 2, ember.where(w:gt(0), w, w * 2), w:masked_fill(w:lt(0), 1)
  _ = -a, a:lerp(b, 0.3), a:addcdiv(b, a, {value = 0.5}), w * r({301, 1}, dt), ember.outer(r({301}, dt), r({64}, dt))
  _ = m:triu(1), m:t():tril(-1)
  _ = m:sum(-1), m:sum(0), m:sum(), m:mean({0, 1}), m:var(1), m:logsumexp(0)             -- rows, cols, all
  _ = m:max(-1), m:argmin(0), r({3, 5000}, dt):sum(-1), r({200001}, dt):max()             -- block rows, splits
  for _, len in ipairs({1, 7, 40, 1000, 5000, 20000}) do
    local s = r({3, len}, dt)
    _ = s:softmax(-1), s:log_softmax(-1)
  end
  _ = m:softmax(0), r({2, 9, 3}, dt):log_softmax(1)
  for _, len in ipairs({7, 40, 3000}) do
    local x = r({4, len}, dt); x.requires_grad = true
    local y = x:softmax(-1)
    y:sum():backward()
    local z = x:log_softmax(-1)
    z:sum():backward()
  end
  local x = r({5, 6}, dt); x.requires_grad = true
  local v = x:max(1)
  v:sum():backward()
end
local i = ember.randint(-5, 5, {n}):to("cuda")
local _ = i + i, i:sum(), i:max(), i:clamp(-1.5, 2), i:to("u8"):sum(0)
ember.cuda.synchronize()
print("kernel_paths: ok")
