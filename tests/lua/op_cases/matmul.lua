-- op_cases/matmul.lua — matmul in every rank combination.
-- Loaded by tests/lua/op_cases.lua, which says what case() and perf() take.
return function(case, perf, ember, F)
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
  -- perf: square and LM-shaped GEMMs (2 M N K FLOPs)
  ---------------------------------------------------------------------------

  local function mm_flops(inputs)
    local a, b = inputs[1], inputs[2]
    local batch = 1
    for i = 1, #a.shape - 2 do batch = batch * a.shape[i] end
    return 2 * batch * a.shape[#a.shape - 1] * a.shape[#a.shape] * b.shape[#b.shape]
  end
  perf("matmul", "matmul (4096,4096) @ (4096,4096)", function(a, b) return a:matmul(b) end,
    function(T) return {T.randn({4096, 4096}), T.randn({4096, 4096})} end,
    {flops = mm_flops, backward = true, torch = "a @ b"})
  perf("matmul", "matmul batched (16,1024,128) @ (16,128,1024)", function(a, b) return a:matmul(b) end,
    function(T) return {T.randn({16, 1024, 128}), T.randn({16, 128, 1024})} end,
    {flops = mm_flops, backward = true, torch = "a @ b"})
end
