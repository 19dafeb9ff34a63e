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

end
