-- flash_spec.lua (GPU) — the FlashAttention-2 kernels (kernels/flash_fwd.cu,
-- kernels/flash_bwd.cu) against the naive composition.
--
-- Reference: the naive attention in f64 on the CPU, from the same bf16/f16
-- inputs (so input rounding is not counted), with autograd for the
-- gradients. Error measure: ‖got − ref‖ / ‖ref‖ (compare.lua). Bound, the
-- usual one for flash kernels: no more than twice the error of the naive
-- composition run on the GPU in the same half dtype, plus 1e-4 — and never
-- above an absolute cap (1e-2 bf16, 2e-3 f16), so a broken naive path cannot
-- loosen it. The log-sum-exp is checked against the f64 one within 1e-4
-- relative (it is accumulated in f32).
local ember = require "ember"
local F = ember.nn.functional

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local C = dofile(here .. "compare.lua")
local rel = C.rel_error

local CAP = {bf16 = 1e-2, f16 = 2e-3}
local seed = 9100
local function randn(shape, dtype, scale)
  seed = seed + 1
  ember.manual_seed(seed)
  return (ember.randn(shape, {dtype = "f64"}) * (scale or 1)):to(dtype)
end

local function leaf(t) local c = t:detach():clone(); c.requires_grad = true; return c end

-- (B, H, T, D) view of (B, T, H, D) memory, as the model's head split makes it
local function bthd(t) return t:transpose(1, 2):contiguous():transpose(1, 2) end

local function naive64(q, k, v, g, causal, scale)
  local q6, k6, v6 = leaf(q:cpu():to("f64")), leaf(k:cpu():to("f64")), leaf(v:cpu():to("f64"))
  local o = F.scaled_dot_product_attention(q6, k6, v6, {causal = causal, scale = scale, impl = "naive"})
  o:backward(g:cpu():to("f64"))
  local d = q.shape[4]
  local s = q6:detach():matmul(k6:detach():transpose(-2, -1)) * (scale or 1 / math.sqrt(d))
  if causal then
    local tq, tk = q.shape[3], k.shape[3]
    s = s:masked_fill(ember.ones(tq, tk):triu(1):eq(1), -math.huge)
  end
  return o:detach(), q6.grad, k6.grad, v6.grad, s:logsumexp(-1)
end

local function run(fn, q, k, v, g)
  local qq, kk, vv = leaf(q), leaf(k), leaf(v)
  local o, lse = fn(qq, kk, vv)
  o:backward(g)
  return o:detach(), qq.grad, kk.grad, vv.grad, lse
end

-- flash vs the f64 reference, held to twice the naive half error
local function check(shape_q, shape_k, dt, causal, opts)
  opts = opts or {}
  local q, k, v = randn(shape_q, dt), randn(shape_k, dt), randn(shape_k, dt)
  local g = randn(shape_q, dt)
  if opts.layout then q, k, v, g = opts.layout(q), opts.layout(k), opts.layout(v), opts.layout(g) end
  q, k, v, g = q:cuda(), k:cuda(), v:cuda(), g:cuda()
  local ref = {naive64(q, k, v, g, causal, opts.scale)}
  local fl = {run(function(a, b, c) return F.flash_attention(a, b, c, causal, opts.scale) end, q, k, v, g)}
  local nv = {run(function(a, b, c)
    return F.scaled_dot_product_attention(a, b, c, {causal = causal, scale = opts.scale, impl = "naive"})
  end, q, k, v, g)}
  local what = string.format("%s q%s k%s causal=%s", dt, table.concat(shape_q, "x"), table.concat(shape_k, "x"),
    tostring(causal))
  for i, name in ipairs({"o", "dq", "dk", "dv"}) do
    assert.are.equal(dt, fl[i].dtype, what .. " " .. name .. " dtype")
    local ef, en = rel(fl[i], ref[i]), rel(nv[i], ref[i])
    local bound = math.min(2 * en + 1e-4, CAP[dt])
    assert.is_true(ef <= bound, string.format("%s %s: flash error %.3g > %.3g (naive %s error %.3g)", what, name,
      ef, bound, dt, en))
  end
  assert.are.equal("f32", fl[5].dtype)
  local el = rel(fl[5], ref[5])
  assert.is_true(el <= 1e-4, string.format("%s lse: relative error %.3g", what, el))
  return fl
end

describe("flash attention on CUDA", function()
  it("matches the f64 reference for every supported head dim (bf16, causal, T not a tile multiple)", function()
    for _, d in ipairs({16, 32, 64, 80, 96, 128}) do
      check({2, 3, 130, d}, {2, 3, 130, d}, "bf16", true)
    end
  end)

  it("handles f16, no mask, and Tq ≠ Tk", function()
    check({2, 2, 70, 64}, {2, 2, 150, 64}, "f16", false)
    check({1, 2, 150, 32}, {1, 2, 70, 32}, "bf16", false)
  end)

  it("aligns the causal mask top-left when Tq ≠ Tk (as PyTorch's is_causal)", function()
    check({1, 2, 100, 64}, {1, 2, 40, 64}, "bf16", true)
    check({1, 2, 40, 64}, {1, 2, 100, 64}, "bf16", true)
  end)

  it("covers single rows, exact tiles, one past a tile and long sequences", function()
    check({3, 1, 1, 64}, {3, 1, 1, 64}, "bf16", true)
    check({1, 2, 64, 64}, {1, 2, 64, 64}, "bf16", true)
    check({1, 2, 65, 128}, {1, 2, 65, 128}, "f16", true)
    check({1, 1, 1024, 64}, {1, 1, 1024, 64}, "bf16", true)
  end)

  it("honours a given scale", function()
    check({1, 2, 96, 64}, {1, 2, 96, 64}, "bf16", true, {scale = 0.3})
  end)

  it("reads the (B, T, H, D) head-split layout in place and writes o, dq, dk, dv in it", function()
    local fl = check({2, 4, 77, 64}, {2, 4, 77, 64}, "bf16", true, {layout = bthd})
    assert.is_true(fl[1]:transpose(1, 2):is_contiguous(), "o is (B, T, H, D) memory")
    -- leaves in (B, T, H, D), split into heads by a transpose as the model does:
    -- their gradients arrive contiguous, with no copy on the way back
    local x = {}
    for i = 1, 3 do x[i] = leaf(randn({2, 77, 4, 64}, "bf16"):cuda()) end
    local o = F.flash_attention(x[1]:transpose(1, 2), x[2]:transpose(1, 2), x[3]:transpose(1, 2), true)
    o:backward(randn({2, 4, 77, 64}, "bf16"):cuda())
    for i = 1, 3 do
      assert.is_true(x[i].grad:is_contiguous(), "gradient " .. i .. " layout")
      assert.is_true(x[i].grad:float():abs():sum():item() > 0, "gradient " .. i .. " is not zero")
    end
  end)

  it("is deterministic: two backward passes give bit-identical gradients", function()
    local q, k, v = randn({2, 2, 200, 64}, "bf16"):cuda(), randn({2, 2, 200, 64}, "bf16"):cuda(),
      randn({2, 2, 200, 64}, "bf16"):cuda()
    local g = randn({2, 2, 200, 64}, "bf16"):cuda()
    local f = function(a, b, c) return F.flash_attention(a, b, c, true) end
    local r1, r2 = {run(f, q, k, v, g)}, {run(f, q, k, v, g)}
    for i = 1, 4 do C.assert_equal(r2[i], r1[i], "run 2 vs run 1, output " .. i) end
  end)

  it("lowers f32 inputs under autocast and sends f32 gradients to f32 leaves", function()
    local q, k, v = leaf(randn({1, 2, 50, 64}, "f32"):cuda()), leaf(randn({1, 2, 50, 64}, "f32"):cuda()),
      leaf(randn({1, 2, 50, 64}, "f32"):cuda())
    assert.is_false(ember.core.flash_applies(q, k, v))
    local o = ember.autocast("bf16", function()
      assert.is_true(ember.core.flash_applies(q, k, v))
      return F.scaled_dot_product_attention(q, k, v, {causal = true})   -- impl auto
    end)
    assert.are.equal("bf16", o.dtype)
    o:float():sum():backward()
    assert.are.equal("f32", q.grad.dtype)
    local ref = F.scaled_dot_product_attention(q:detach(), k:detach(), v:detach(), {causal = true, impl = "naive"})
    assert.is_true(rel(o, ref) < 1e-2)
  end)

  it("is what TransformerLM uses on CUDA under autocast by default", function()
    ember.manual_seed(3)
    local cfg = {vocab_size = 64, context_length = 32, d_model = 64, num_layers = 2, num_heads = 4, d_ff = 128,
      device = "cuda"}
    local m_auto = ember.nn.TransformerLM(cfg)
    cfg.attn_impl = "naive"
    local m_naive = ember.nn.TransformerLM(cfg)
    m_naive:load_state_dict(m_auto:state_dict())
    local x = ember.randint(0, 64, {2, 32}, {device = "cuda"})
    local la = ember.autocast("bf16", function() return m_auto(x):float() end)
    local ln = ember.autocast("bf16", function() return m_naive(x):float() end)
    assert.is_true(rel(la, ln) < 1e-2)
    -- the default (impl "auto") records a flash_attention node for these shapes
    local seen
    cfg.attn_impl, cfg.attn_fn = nil, function(q, k, v)
      local o = F.scaled_dot_product_attention(q, k, v, {causal = true})
      seen = o.grad_fn
      return o
    end
    local m_probe = ember.nn.TransformerLM(cfg)
    ember.autocast("bf16", function() return m_probe(x) end)
    assert.are.equal("flash_attention", seen)
  end)

  it("rejects what the kernels cannot do, naming it", function()
    local q = ember.randn(1, 2, 8, 64, {device = "cuda", dtype = "bf16"})
    assert.error_matches(function() F.flash_attention(q:float(), q:float(), q:float(), true) end,
      "expected bf16 or f16 q, k and v (or f32 inside ember.autocast), got f32", 1, true)
    local q48 = ember.randn(1, 2, 8, 48, {device = "cuda", dtype = "bf16"})
    assert.error_matches(function() F.flash_attention(q48, q48, q48, true) end,
      "no kernel for head dim 48", 1, true)
    local k3 = ember.randn(1, 3, 8, 64, {device = "cuda", dtype = "bf16"})
    assert.error_matches(function() F.flash_attention(q, k3, k3, true) end,
      "expected q (B, H, Tq, D), k and v (B, H, Tk, D)", 1, true)
    assert.error_matches(function() F.flash_attention(q, q:half(), q, true) end,
      "expected q, k and v to have the same dtype", 1, true)
    assert.error_matches(function() F.flash_attention(q, q:cpu(), q, true) end, "device", 1, true)
    local q3 = q:select(0, 0)
    assert.error_matches(function() F.flash_attention(q3, q3, q3, true) end,
      "expected q of shape (B, H, T, D), got [2, 8, 64]", 1, true)
  end)
end)
