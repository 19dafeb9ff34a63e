-- lm_spec.lua — the reference TransformerLM end to end: names and counts as
-- API.md fixes them, causality, gradients to every parameter, the loss at
-- initialisation, and overfitting one fixed batch with AdamW.
--
-- Run from the repository root (after building into build-lua):
--   LUA_PATH="build-lua/lua/?.lua;build-lua/lua/?/init.lua;;" \
--   LUA_CPATH="build-lua/lua/?.so;;" busted tests/lua/lm_spec.lua

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local nn, optim = ember.nn, ember.optim
local F = nn.functional

local maxdiff = H.maxdiff

describe("nn.TransformerLM structure", function()
  it("uses the reference parameter names, shapes and order", function()
    ember.manual_seed(0)
    local m = nn.TransformerLM{vocab_size = 100, context_length = 16, d_model = 32, d_ff = 48,
      num_layers = 2, num_heads = 4}
    local expected = {{"token_embeddings.weight", {100, 32}}}
    for i = 0, 1 do
      local p = "layers." .. i .. "."
      for _, e in ipairs({
        {"ln1.weight", {32}},
        {"attn.q_proj.weight", {32, 32}}, {"attn.k_proj.weight", {32, 32}},
        {"attn.v_proj.weight", {32, 32}}, {"attn.output_proj.weight", {32, 32}},
        {"ln2.weight", {32}},
        {"ffn.w1.weight", {48, 32}}, {"ffn.w2.weight", {32, 48}}, {"ffn.w3.weight", {48, 32}},
      }) do expected[#expected + 1] = {p .. e[1], e[2]} end
    end
    expected[#expected + 1] = {"ln_final.weight", {32}}
    expected[#expected + 1] = {"lm_head.weight", {100, 32}}
    local got = {}
    for i, np in ipairs(m:named_parameters()) do got[i] = {np[1], np[2].shape} end
    assert.are.same(expected, got)
  end)

  it("has the parameter count of its config formula (tiny, allocated)", function()
    local cfg = nn.configs.tiny{vocab_size = 256, context_length = 32}
    local m = nn.TransformerLM(cfg)
    -- 2·V·D + L·(4D² + 3·D·F + 2D) + D with V 256, D 64, F 192, L 2
    assert.are.equal(2 * 256 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 192 + 2 * 64) + 64,
      m:num_parameters())
    assert.are.equal(nn.count_parameters(cfg), m:num_parameters())
  end)

  it("counts 128,625,408 parameters for small at vocab 10000 (from the config)", function()
    assert.are.equal(128625408, nn.count_parameters(nn.configs.small{vocab_size = 10000}))
    assert.are.equal(128625408, nn.count_parameters(nn.configs.small()))
  end)

  it("provides the configs of API.md with vocab 10000 and context 512 by default", function()
    local want = {small = {768, 3072, 12, 12}, medium = {1024, 4096, 24, 16},
      large = {1280, 5120, 36, 20}, xl = {1600, 6400, 48, 25},
      ["2.7b"] = {2560, 10240, 32, 32}}
    for name, w in pairs(want) do
      local c = nn.configs[name]()
      assert.are.same(w, {c.d_model, c.d_ff, c.num_layers, c.num_heads}, name)
      assert.are.same({10000, 512, 10000}, {c.vocab_size, c.context_length, c.rope_theta}, name)
    end
    local c = nn.configs.medium{vocab_size = 32000, context_length = 1024}
    assert.are.same({32000, 1024, 1024}, {c.vocab_size, c.context_length, c.d_model})
  end)

  it("rejects a sequence longer than context_length", function()
    local m = nn.TransformerLM(nn.configs.tiny{vocab_size = 16, context_length = 8})
    assert.error_matches(function() m(ember.randint(0, 16, {1, 9})) end,
      "ember.nn.TransformerLM: expected ids (..., T) with T <= context_length 8, got shape [1, 9]",
      1, true)
  end)

  it("rejects an incomplete config, naming the field", function()
    assert.error_matches(function() nn.TransformerLM{vocab_size = 10, d_model = 8} end,
      "ember.nn.TransformerLM: expected cfg.context_length to be a positive integer, got nil",
      1, true)
  end)
end)

describe("nn.TransformerLM forward and backward", function()
  local V, T = 64, 12
  local m, ids

  before_each(function()
    ember.manual_seed(1)
    m = nn.TransformerLM(nn.configs.tiny{vocab_size = V, context_length = 16})
    ids = ember.randint(0, V, {2, T})
  end)

  it("maps ids (B, T) to logits (B, T, V)", function()
    local logits = m(ids)
    assert.are.same({2, T, V}, logits.shape)
    assert.are.equal("f32", logits.dtype)
  end)

  it("is causal: changing token t changes logits at t and later only", function()
    local before = m(ids)
    local t = 7
    local rows = ids:tolist()
    for _, row in ipairs(rows) do row[t + 1] = (row[t + 1] + 1) % V end
    local after = m(ember.tensor(rows, {dtype = ids.dtype}))
    assert.is_true(maxdiff(before:narrow(1, 0, t), after:narrow(1, 0, t)) < 1e-6)
    assert.is_true(maxdiff(before:narrow(1, t, T - t), after:narrow(1, t, T - t)) > 1e-3)
  end)

  it("gives every parameter a non-zero gradient", function()
    local loss = F.cross_entropy(m(ids:narrow(1, 0, T - 1)), ids:narrow(1, 1, T - 1))
    loss:backward()
    for _, np in ipairs(m:named_parameters()) do
      local g = np[2].grad
      assert.is_not_nil(g, np[1])
      assert.are.same(np[2].shape, g.shape, np[1])
      assert.is_true(g:abs():sum():item() > 0, np[1] .. " has an all-zero gradient")
    end
  end)

  it("swaps the attention of every block with set_attn_fn", function()
    local calls = 0
    m:set_attn_fn(function(q, k, v)
      calls = calls + 1
      return F.scaled_dot_product_attention(q, k, v, {causal = true})
    end)
    local y = m(ids)
    assert.are.equal(2, calls)                         -- one per layer
    m:set_attn_fn("naive")
    assert.is_true(maxdiff(y, m(ids)) == 0)
  end)
end)

describe("nn.TransformerLM training", function()
  -- One fixed batch of B sequences of T+1 tokens drawn from only K of the V
  -- ids, so each token recurs with different successors: predicting the next
  -- token needs the context, not just the current token.
  local V, T, B, K = 256, 32, 4, 16

  -- Empirical H(next | current) of the batch: the lowest mean cross-entropy
  -- any model that sees only the current token (no working attention) can
  -- reach on it.
  local function bigram_entropy(x, y)
    local xs, ys = x:reshape(-1):tolist(), y:reshape(-1):tolist()
    local pair, cur = {}, {}
    for i = 1, #xs do
      local key = xs[i] * V + ys[i]
      pair[key] = (pair[key] or 0) + 1
      cur[xs[i]] = (cur[xs[i]] or 0) + 1
    end
    local h = 0
    for i = 1, #xs do h = h - math.log(pair[xs[i] * V + ys[i]] / cur[xs[i]]) end
    return h / #xs
  end

  it("starts at ln(V) + σ²/2, the loss of random logits of variance σ²", function()
    ember.manual_seed(3)
    local cfg = nn.configs.tiny{vocab_size = V, context_length = T}
    local m = nn.TransformerLM(cfg)
    local data = ember.randint(0, V, {8, T + 1})
    local loss = F.cross_entropy(m(data:narrow(1, 0, T):contiguous()),
      data:narrow(1, 1, T):contiguous()):item()
    -- ln_final leaves rms 1, so a logit is a sum of D terms x_i w_i with
    -- Var(w) = 0.9733·2/(D+V) (truncation at 3 std): σ² = D·Var(w). The
    -- tolerance is ~4 standard errors of a mean over 256 positions.
    local sigma2 = cfg.d_model * 0.9733 * 2 / (cfg.d_model + V)
    local expect = math.log(V) + sigma2 / 2
    assert.is_true(math.abs(loss - expect) < 0.15,
      string.format("initial loss %.4f, expected %.4f (ln V = %.4f)", loss, expect, math.log(V)))
  end)

  it("overfits one batch with AdamW far below what a model without attention can reach", function()
    ember.manual_seed(4)
    local m = nn.TransformerLM(nn.configs.tiny{vocab_size = V, context_length = T})
    local data = ember.randint(0, K, {B, T + 1})
    local x, y = data:narrow(1, 0, T):contiguous(), data:narrow(1, 1, T):contiguous()
    local floor_no_attn = bigram_entropy(x, y)
    local opt = optim.AdamW(m:parameters(), {lr = 1e-2, weight_decay = 0})
    local losses = {}
    local t0 = os.clock()
    for step = 1, 100 do
      opt:zero_grad()
      local loss = F.cross_entropy(m(x), y)
      loss:backward()
      nn.utils.clip_grad_norm(m:parameters(), 1.0)
      opt:step()
      losses[step] = loss:item()
    end
    local final = F.cross_entropy(m(x), y):item()
    local msg = string.format("losses %.3f -> %.3f (step 50: %.3f), final %.4f; " ..
      "H(next|current) = %.3f; %.1f s CPU", losses[1], losses[100], losses[50], final,
      floor_no_attn, os.clock() - t0)
    -- A model that cannot use the context stays >= H(next|current) (1.86
    -- here; measured: attention replaced by `return v` ends at 1.859). The
    -- real model memorises the batch: measured 5.69 -> 0.0002 in ~1 s; the
    -- bound leaves room for other RNG streams (seeds 4-7 all end <= 0.011).
    assert.is_true(floor_no_attn > 1.0, msg)
    assert.is_true(final < 0.1, msg)
  end)
end)
