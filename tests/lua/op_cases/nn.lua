-- op_cases/nn.lua — neural-net ops: linear, embedding, cross_entropy, norms, rope, swiglu, attention, and one composite.
-- Loaded by tests/lua/op_cases.lua, which says what case() and perf() take.
return function(case, perf, ember, F)
  ---------------------------------------------------------------------------
  -- neural-net ops
  ---------------------------------------------------------------------------

  case("F.linear with bias, (2,3,4) x (5,4) + (5)", "linear",
    function(x, w, b) return F.linear(x, w, b) end,
    function(T) return {T.randn({2, 3, 4}), T.randn({5, 4}), T.randn({5})} end)
  case("F.linear without bias", "linear",
    function(x, w) return F.linear(x, w) end,
    function(T) return {T.randn({3, 4}), T.randn({2, 4})} end)
  case("F.embedding: gradient w.r.t. the weight, repeated ids accumulate", "embedding",
    function(w, ids) return F.embedding(ids, w) end,
    function(T)
      return {T.randn({5, 4}), T.long({{0, 2, 2}, {4, 0, 1}})}
    end)
  case("F.cross_entropy over (2,3,5) logits", "cross_entropy",
    function(logits, targets) return F.cross_entropy(logits, targets) end,
    function(T) return {T.randn({2, 3, 5}), T.ids({2, 3}, 5)} end)
  case("F.cross_entropy over (4,3) logits", "cross_entropy",
    function(logits, targets) return F.cross_entropy(logits, targets) end,
    function(T) return {T.randn({4, 3}), T.ids({4}, 3)} end)
  case("F.rmsnorm with a weight", "rmsnorm",
    function(x, w) return F.rmsnorm(x, w) end,
    function(T) return {T.randn({2, 3, 8}), T.randn({8})} end)
  case("F.rmsnorm without a weight, larger eps", "rmsnorm",
    function(x) return F.rmsnorm(x, nil, 0.1) end,
    function(T) return {T.randn({3, 6})} end)
  -- both outputs weighed differently: s's own gradient and the norm's reach x and r
  case("F.add_rmsnorm with a weight: s = x + r and rmsnorm(s)", "add_rmsnorm",
    function(x, r, w)
      local sum, y = F.add_rmsnorm(x, r, w)
      return y + sum * 0.5
    end,
    function(T) return {T.randn({2, 3, 8}), T.randn({2, 3, 8}), T.randn({8})} end)
  case("F.add_rmsnorm without a weight, only the norm used", "add_rmsnorm",
    function(x, r)
      local _, y = F.add_rmsnorm(x, r, nil, 0.1)
      return y
    end,
    function(T) return {T.randn({3, 6}), T.randn({3, 6})} end)
  case("F.layer_norm with weight and bias", "layer_norm",
    function(x, w, b) return F.layer_norm(x, 8, w, b) end,
    function(T) return {T.randn({2, 3, 8}), T.randn({8}), T.randn({8})} end)
  case("F.layer_norm without weight or bias, larger eps", "layer_norm",
    function(x) return F.layer_norm(x, {6}, nil, nil, 0.1) end,
    function(T) return {T.randn({3, 6})} end)
  case("F.rope over (2,4,6) with positions 0..3", "rope",
    function(x, pos) return F.rope(x, pos) end,
    function(T) return {T.randn({2, 4, 6}), T.positions(4)} end)
  case("F.rope over heads (1,2,4,4) with theta 100", "rope",
    function(x, pos) return F.rope(x, pos, 100) end,
    function(T) return {T.randn({1, 2, 4, 4}), T.positions(4)} end)
  case("F.rope with default positions", "rope",
    function(x) return F.rope(x) end,
    function(T) return {T.randn({3, 4})} end)
  -- both outputs weighed differently, so each input's gradient is checked
  case("F.rope_qk over transposed heads (2,3,4,6) with positions 0..3", "rope_qk",
    function(q, k, pos)
      local a, b = F.rope_qk(q:transpose(1, 2), k:transpose(1, 2), pos, 100)
      return a + b * 2
    end,
    function(T) return {T.randn({2, 4, 3, 6}), T.randn({2, 4, 3, 6}), T.positions(4)} end)
  case("F.swiglu(a, b) = silu(a) * b", "swiglu",
    function(a, b) return F.swiglu(a, b) end,
    function(T) return {T.randn({2, 5}), T.randn({2, 5})} end)
  case("F.silu", "silu",
    function(a) return F.silu(a) end,
    function(T) return {T.randn({2, 5})} end)
  case("scaled_dot_product_attention, not causal, Tq != Tk, dv != d", "scaled_dot_product_attention",
    function(q, k, v) return F.scaled_dot_product_attention(q, k, v) end,
    function(T) return {T.randn({1, 2, 3, 4}), T.randn({1, 2, 5, 4}), T.randn({1, 2, 5, 3})} end)
  case("scaled_dot_product_attention, causal, Tq == Tk", "scaled_dot_product_attention",
    function(q, k, v) return F.scaled_dot_product_attention(q, k, v, {causal = true}) end,
    function(T) return {T.randn({2, 4, 3}), T.randn({2, 4, 3}), T.randn({2, 4, 3})} end)
  case("scaled_dot_product_attention, causal, Tq != Tk (top-left aligned)", "scaled_dot_product_attention",
    function(q, k, v) return F.scaled_dot_product_attention(q, k, v, {causal = true}) end,
    function(T) return {T.randn({1, 3, 4}), T.randn({1, 5, 4}), T.randn({1, 5, 4})} end)
  case("scaled_dot_product_attention with an explicit scale", "scaled_dot_product_attention",
    function(q, k, v) return F.scaled_dot_product_attention(q, k, v, {scale = 0.3}) end,
    function(T) return {T.randn({3, 2}), T.randn({4, 2}), T.randn({4, 2})} end)

  ---------------------------------------------------------------------------
  -- composites (several ops in one graph)
  ---------------------------------------------------------------------------

  case("a small attention block: rmsnorm -> linear -> rope -> attention -> linear", "composite",
    function(x, wn, wq, wo)
      local h = F.rmsnorm(x, wn)
      local q = F.rope(F.linear(h, wq), nil)
      local o = F.scaled_dot_product_attention(q, q, h, {causal = true})
      return F.linear(o, wo)
    end,
    function(T) return {T.randn({3, 4}), T.randn({4}), T.randn({4, 4}), T.randn({2, 4})} end)

  ---------------------------------------------------------------------------
  -- perf: the xl model's shapes (B·T = 2048 rows, d_model 1600, d_ff 6400
  -- rounded to 6400, vocab 10000; heads of 64)
  ---------------------------------------------------------------------------

  perf("linear", "linear (2048,1600) x (6400,1600)ᵀ + bias", function(x, w, b) return F.linear(x, w, b) end,
    function(T) return {T.randn({2048, 1600}), T.randn({6400, 1600}), T.randn({6400})} end,
    {flops = function(i) return 2 * 2048 * 1600 * 6400 end, backward = true, torch = "F.linear(a, b, c)"})
  perf("embedding", "embedding of 2048 ids in (50304,1600)", function(w, ids) return F.embedding(ids, w) end,
    function(T) return {T.randn({50304, 1600}), T.ids({4, 512}, 50304)} end,
    {bytes = function(i, out) return 2 * out:numel() * out:element_size() + i[2]:numel() * 8 end,
     backward = true, torch = "F.embedding(b, a)"})
  perf("cross_entropy", "cross_entropy (2048,50304) logits", function(l, t) return F.cross_entropy(l, t) end,
    function(T) return {T.randn({2048, 50304}), T.ids({2048}, 50304)} end,
    {backward = true, torch = "F.cross_entropy(a, b)"})
  -- rmsnorm backward: x and gy read, gx written, w read and gw written, rstd read
  local function rms_bwd_bytes(i, out)
    local n, d = out:numel(), i[1].shape[#i[1].shape]
    return 3 * n * out:element_size() + 2 * d * i[2]:element_size() + n // d * 4
  end
  perf("rmsnorm", "rmsnorm (8192,1600)", function(x, w) return F.rmsnorm(x, w) end,
    function(T) return {T.randn({8192, 1600}), T.randn({1600})} end,
    {backward = true, bwd_bytes = rms_bwd_bytes, torch = "F.rms_norm(a, (1600,), b)"})
  -- the models' shapes (B4 T512: small d 768, xl d 1600; a 4096-wide model at
  -- 8192 tokens), f32 master weight beside f32 or bf16 activations
  for _, s in ipairs({{2048, 768}, {2048, 1600}, {8192, 4096}}) do
    perf("rmsnorm", ("rmsnorm (%d,%d), f32 weight"):format(s[1], s[2]), function(x, w) return F.rmsnorm(x, w) end,
      function(T) return {T.randn(s), T.randn_f32({s[2]})} end,
      {backward = true, bwd_bytes = rms_bwd_bytes, device = s[1] * s[2] > 2 ^ 24 and "cuda" or nil})
  end
  -- the residual add fused into the next norm: x (f32 stream) and r (the
  -- branch output, bf16 under autocast) read, s (f32) and y written; backward:
  -- rmsnorm's plus gs read and added in place (gr's cast is another op)
  local function add_rms_bytes(i, out) return i[1]:numel() * (2 * i[1]:element_size() + i[2]:element_size() + 4) end
  for _, s in ipairs({{2048, 768}, {8192, 1600}}) do
    perf("add_rmsnorm", ("add_rmsnorm (%d,%d), f32 stream and weight"):format(s[1], s[2]),
      function(x, r, w) local _, y = F.add_rmsnorm(x, r, w); return y end,
      function(T) return {T.randn_f32(s), T.randn(s), T.randn_f32({s[2]})} end,
      {bytes = add_rms_bytes, torch = ("F.rms_norm(a + b, (%d,), c)"):format(s[2])})
  end
  -- out_dtype: the small model's norms under autocast, y written in bf16 from f32 rows (no cast after)
  perf("rmsnorm", "rmsnorm (2048,768) f32 rows, bf16 y (out_dtype)",
    function(x, w) return F.rmsnorm(x, w, 1e-5, {out_dtype = "bf16"}) end,
    function(T) return {T.randn_f32({2048, 768}), T.randn_f32({768})} end,
    {bytes = function(i) return i[1]:numel() * (4 + 2) + 768 * 4 + 2048 * 4 end})
  perf("add_rmsnorm", "add_rmsnorm (2048,768), f32 stream and weight, bf16 y (out_dtype)",
    function(x, r, w) local _, y = F.add_rmsnorm(x, r, w, 1e-5, {out_dtype = "bf16"}); return y end,
    function(T) return {T.randn_f32({2048, 768}), T.randn({2048, 768}), T.randn_f32({768})} end,
    {bytes = function(i) return i[1]:numel() * (4 + i[2]:element_size() + 4 + 2) end})
  perf("layer_norm", "layer_norm (8192,1600)", function(x, w, b) return F.layer_norm(x, 1600, w, b) end,
    function(T) return {T.randn({8192, 1600}), T.randn({1600}), T.randn({1600})} end,
    {backward = true, torch = "F.layer_norm(a, (1600,), b, c)"})
  -- issue 12: 2^26 elements (512 / 256 MiB moved), a 4096-wide model's rows, CUDA only
  perf("layer_norm", "layer_norm (16384,4096)", function(x, w, b) return F.layer_norm(x, 4096, w, b) end,
    function(T) return {T.randn({16384, 4096}), T.randn({4096}), T.randn({4096})} end,
    {backward = true, device = "cuda", torch = "F.layer_norm(a, (4096,), b, c)"})
  -- rope backward: the gradient read, x's gradient written, the positions read
  local function rope_bwd_bytes(i, out) return 2 * out:numel() * out:element_size() + i[2]:numel() * 8 end
  perf("rope", "rope (8,25,1024,64) heads", function(x, pos) return F.rope(x, pos) end,
    function(T) return {T.randn({8, 25, 1024, 64}), T.positions(1024)} end,
    {backward = true, bwd_bytes = rope_bwd_bytes})
  -- the small model's q (or k): (B4, H12, T512, 64) as the head split's
  -- transposed view of (4,512,12,64), as nn attention hands it over
  perf("rope", "rope (4,12,512,64) heads, transposed view",
    function(x, pos) return F.rope(x:transpose(1, 2), pos) end,
    function(T) return {T.randn({4, 512, 12, 64}), T.positions(512)} end,
    {backward = true, bwd_bytes = rope_bwd_bytes})
  perf("rope_qk", "rope_qk (4,12,512,64) q and k, transposed views",
    function(q, k, pos)
      local a, b <close> = F.rope_qk(q:transpose(1, 2), k:transpose(1, 2), pos)
      return a                      -- k's result closed here: bench_ops.lua releases the one it gets
    end,
    function(T) return {T.randn({4, 512, 12, 64}), T.randn({4, 512, 12, 64}), T.positions(512)} end,
    {bytes = function(i) return 2 * (i[1]:numel() * i[1]:element_size() + i[2]:numel() * i[2]:element_size()) +
      i[3]:numel() * 8 end})
  perf("swiglu", "swiglu (8192,6400)", function(a, b) return F.swiglu(a, b) end,
    function(T) return {T.randn({8192, 6400}), T.randn({8192, 6400})} end,
    {backward = true, torch = "F.silu(a) * b"})
  perf("silu", "silu (8192,6400)", function(a) return F.silu(a) end,
    function(T) return {T.randn({8192, 6400})} end, {backward = true, torch = "F.silu(a)"})
  perf("scaled_dot_product_attention", "naive attention causal (4,16,512,64)",
    function(q, k, v) return F.scaled_dot_product_attention(q, k, v, {causal = true, impl = "naive"}) end,
    function(T) return {T.randn({4, 16, 512, 64}), T.randn({4, 16, 512, 64}), T.randn({4, 16, 512, 64})} end,
    {flops = function(i) return 4 * 4 * 16 * 512 * 512 * 64 end, backward = true,
     torch = "F.scaled_dot_product_attention(a, b, c, is_causal=True)"})
end
