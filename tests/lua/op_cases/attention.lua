-- op_cases/attention.lua — FlashAttention (F.flash_attention): every head dim
-- the kernels have (16, 32, 64, 80, 96, 128, 256), causal and not, odd
-- lengths, Tq != Tk, both causal alignments, grouped-query attention, 3-D
-- (B, T, d) inputs and one query against many keys (the decode path on
-- CUDA). On the CPU the op runs its tiled path in f64 (engine/ops/
-- flash_cpu.c), which the grad mode checks against finite differences; on
-- CUDA the kernels, in bf16 and f16 only (there is no f32 kernel), against
-- that path on the same values (eval mode).
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
  case("flash_attention d256 causal, T = 5", "flash_attention", flash(true),
    function(T) return {T.randn({1, 1, 5, 256}), T.randn({1, 1, 5, 256}), T.randn({1, 1, 5, 256})} end, nil, HALF)
  case("flash_attention bottom-right causal, Tq 4 < Tk 11", "flash_attention", flash("bottom_right"),
    function(T) return {T.randn({2, 2, 4, 32}), T.randn({2, 2, 11, 32}), T.randn({2, 2, 11, 32})} end, nil, HALF)
  case("flash_attention grouped-query (H 6, Hkv 2), causal", "flash_attention", flash(true),
    function(T) return {T.randn({1, 6, 7, 16}), T.randn({1, 2, 7, 16}), T.randn({1, 2, 7, 16})} end, nil, HALF)
  case("flash_attention grouped-query (H 4, Hkv 1), bottom-right, Tq 3 < Tk 8", "flash_attention",
    flash("bottom_right"),
    function(T) return {T.randn({2, 4, 3, 64}), T.randn({2, 1, 8, 64}), T.randn({2, 1, 8, 64})} end, nil, HALF)
  case("flash_attention 3-D (B, T, d) inputs as one head, causal", "flash_attention", flash(true),
    function(T) return {T.randn({3, 6, 32}), T.randn({3, 6, 32}), T.randn({3, 6, 32})} end, nil, HALF)
  case("flash_attention decode: Tq 1 against Tk 29, grouped-query (H 4, Hkv 2), bottom-right", "flash_attention",
    flash("bottom_right"),
    function(T) return {T.randn({1, 4, 1, 32}), T.randn({1, 2, 29, 32}), T.randn({1, 2, 29, 32})} end, nil, HALF)
  case("flash_attention decode: Tq 3 against Tk 13, 3-D, d 128, not causal", "flash_attention", flash(false),
    function(T) return {T.randn({1, 3, 128}), T.randn({1, 13, 128}), T.randn({1, 13, 128})} end, nil, HALF)
  -- the rope option (q and k un-rotated; positions made on q's device): finite differences through the rotation
  -- on the CPU; on CUDA the one-node path (its backward's rotating epilogues) against the CPU
  local function flash_rope(causal, first, theta)
    return function(q, k, v)
      local T = q.shape[#q.shape - 1]
      local pos = ember.arange(first, first + T, 1, {dtype = "i64", device = q.device})
      return F.flash_attention(q, k, v, causal, {rope = {pos = pos, theta = theta}})
    end
  end
  case("flash_attention rope option d64 causal, positions 5..11", "flash_attention", flash_rope(true, 5, 10000),
    function(T) return {T.randn({2, 2, 7, 64}), T.randn({2, 2, 7, 64}), T.randn({2, 2, 7, 64})} end, nil, HALF)
  case("flash_attention rope option grouped-query (H 4, Hkv 2) d128 not causal, theta 500", "flash_attention",
    flash_rope(false, 0, 500),
    function(T) return {T.randn({1, 4, 9, 128}), T.randn({1, 2, 9, 128}), T.randn({1, 2, 9, 128})} end, nil, HALF)
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
  -- decode: one new token per sequence against a 16k cache, grouped-query
  -- (32 q heads, 8 kv heads, d 128): bytes, not FLOPs, bound it (k and v
  -- read once)
  perf("flash_attention", "flash_attention decode (4,32,1,128) vs cache (4,8,16384,128)", flash("bottom_right"),
    function(T) return {T.randn({4, 32, 1, 128}), T.randn({4, 8, 16384, 128}), T.randn({4, 8, 16384, 128})} end,
    {bytes = function(inputs)
      local k = inputs[2]
      return 2 * k:numel() * k:element_size() + 2 * inputs[1]:numel() * inputs[1]:element_size()
    end, dtypes = {"bf16"}, device = "cuda"})
  perf("flash_attention", "flash_attention causal (1,4,256,64) on the CPU (tiled)", flash(true),
    function(T) return {T.randn({1, 4, 256, 64}), T.randn({1, 4, 256, 64}), T.randn({1, 4, 256, 64})} end,
    {flops = attn_flops, backward = true, dtypes = {"f32"}, device = "cpu"})
end
