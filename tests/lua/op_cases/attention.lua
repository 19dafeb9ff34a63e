-- op_cases/attention.lua — FlashAttention (F.flash_attention): every head dim
-- the kernels have (16, 32, 64, 80, 96, 128), causal and not, odd lengths and
-- Tq != Tk. On the CPU the op runs its f64 reference path (grad mode); on
-- CUDA the kernels, in bf16 and f16 only (there is no f32 kernel), against
-- that reference on the same values (eval mode).
-- Loaded by tests/lua/op_cases.lua, which says what case() and perf() take.
return function(case, perf, ember, F)
  local HALF = {cuda_dtypes = {"bf16", "f16"}}
  local function flash(causal, scale)
    return function(q, k, v) return F.flash_attention(q, k, v, causal, scale) end
  end
  -- (B, H, T, D) shapes: small B·H·T so finite differences stay cheap at D = 128
  for _, d in ipairs({16, 32, 64, 80, 96, 128}) do
    case(("flash_attention d%d causal, odd T = 7"):format(d), "flash_attention", flash(true),
      function(T) return {T.randn({1, 2, 7, d}), T.randn({1, 2, 7, d}), T.randn({1, 2, 7, d})} end, nil, HALF)
    case(("flash_attention d%d not causal, Tq 5 != Tk 9"):format(d), "flash_attention", flash(false),
      function(T) return {T.randn({2, 1, 5, d}), T.randn({2, 1, 9, d}), T.randn({2, 1, 9, d})} end, nil, HALF)
  end
  case("flash_attention causal, Tq 9 > Tk 4 (top-left aligned), explicit scale", "flash_attention", flash(true, 0.2),
    function(T) return {T.randn({1, 1, 9, 16}), T.randn({1, 1, 4, 16}), T.randn({1, 1, 4, 16})} end, nil, HALF)
  case("flash_attention over a (B, T, H, D) head view (strided q, k, v)", "flash_attention",
    function(q, k, v) return F.flash_attention(q:transpose(1, 2), k:transpose(1, 2), v:transpose(1, 2), true) end,
    function(T) return {T.randn({1, 11, 2, 32}), T.randn({1, 11, 2, 32}), T.randn({1, 11, 2, 32})} end, nil, HALF)

  -- perf: the shapes of issue 11's table (B 1, H 16), causal; FLOPs count the
  -- causal half (4 B H T² D / 2 forward, 2.5x that for forward + backward)
  local function attn_flops(inputs)
    local q = inputs[1]
    local B, H, T, D = q.shape[1], q.shape[2], q.shape[3], q.shape[4]
    return 4 * B * H * T * T * D / 2
  end
  for _, d in ipairs({64, 128}) do
    for _, t in ipairs({4096, 16384}) do
      perf("flash_attention", ("flash_attention causal (1,16,%d,%d)"):format(t, d), flash(true),
        function(T) return {T.randn({1, 16, t, d}), T.randn({1, 16, t, d}), T.randn({1, 16, t, d})} end,
        {flops = attn_flops, backward = true, dtypes = {"bf16"}, device = "cuda"})
    end
  end
  perf("flash_attention", "flash_attention causal (1,4,256,64) on the CPU reference", flash(true),
    function(T) return {T.randn({1, 4, 256, 64}), T.randn({1, 4, 256, 64}), T.randn({1, 4, 256, 64})} end,
    {flops = attn_flops, backward = true, dtypes = {"f32"}, device = "cpu"})
end
