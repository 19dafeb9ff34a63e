-- nn_spec.lua — ember.nn modules: registration (PyTorch order and dotted
-- names), state_dict, conversions, and each layer's values against the
-- formula written out with plain tensor ops.
--
-- Run from the repository root (after building into build-lua):
--   LUA_PATH="build-lua/lua/?.lua;build-lua/lua/?/init.lua;;" \
--   LUA_CPATH="build-lua/lua/?.so;;" busted tests/lua/nn_spec.lua

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local nn = ember.nn
local F = nn.functional

-- Largest absolute elementwise difference, as a Lua number.
local maxdiff = H.maxdiff

local function names_of(named)
  local out = {}
  for i, np in ipairs(named) do out[i] = np[1] end
  return out
end

-- f32 ops accumulate in different orders than the reference formulas here.
local TOL = 1e-5

-- RoPE written out: rotate adjacent pairs (x[2j], x[2j+1]) by pos·theta^(−2j/d).
local function rope_ref(x, theta)
  local shape = x.shape
  local T, d = shape[#shape - 1], shape[#shape]
  local cos, sin = {}, {}
  for t = 1, T do
    cos[t], sin[t] = {}, {}
    for j = 1, d // 2 do
      local angle = (t - 1) * theta ^ (-2 * (j - 1) / d)
      cos[t][j], sin[t][j] = math.cos(angle), math.sin(angle)
    end
  end
  cos, sin = ember.tensor(cos), ember.tensor(sin)            -- (T, d/2)
  local pairs_shape = table.move(shape, 1, #shape - 1, 1, {})
  pairs_shape[#shape], pairs_shape[#shape + 1] = d // 2, 2
  local xp = x:reshape(table.unpack(pairs_shape))           -- (..., T, d/2, 2)
  local a, b = xp:select(-1, 0), xp:select(-1, 1)
  return ember.stack({a * cos - b * sin, a * sin + b * cos}, -1):reshape(table.unpack(shape))
end

describe("ember.nn.Module", function()
  local Net

  before_each(function()
    ember.manual_seed(0)
    Net = nn.Module:extend("Net")
    function Net:__init(d)
      self.fc1 = nn.Linear(d, 2 * d)
      self.scale = nn.Parameter(ember.ones(d))
      self.blocks = nn.ModuleList({nn.Linear(2 * d, 2 * d, {bias = false}),
        nn.RMSNorm(2 * d)})
      self.fc2 = nn.Linear(2 * d, d)
    end
    function Net:forward(x)
      local h = self.fc1(x * self.scale)
      for _, b in ipairs(self.blocks) do h = b(h) end
      return self.fc2(h)
    end
  end)

  it("registers parameters in PyTorch's order with dotted names", function()
    -- PyTorch walks modules depth-first and lists each module's own
    -- parameters (in assignment order) before its children's
    local m = Net(3)
    assert.are.same({"scale", "fc1.weight", "fc1.bias", "blocks.0.weight", "blocks.1.weight",
      "fc2.weight", "fc2.bias"}, names_of(m:named_parameters()))
    local params = m:parameters()
    assert.are.equal(7, #params)
    assert.are.equal(m.scale, params[1])
    assert.are.equal(m.fc1.weight, params[2])
    assert.are.equal(m.blocks[1].weight, params[4])
    assert.are.equal(m.fc2.bias, params[7])
    assert.are.equal(3 * 6 + 6 + 3 + 36 + 6 + 6 * 3 + 3, m:num_parameters())
  end)

  it("lists children, named children and all modules in pre-order", function()
    local m = Net(2)
    assert.are.same({"fc1", "blocks", "fc2"}, names_of(m:named_children()))
    assert.are.equal(m.blocks, m:children()[2])
    assert.are.same({"", "fc1", "blocks", "blocks.0", "blocks.1", "fc2"},
      names_of(m:named_modules()))
    assert.are.equal(6, #m:modules())
    assert.are.equal(m, m:modules()[1])
  end)

  it("indexes a ModuleList 1-based while naming children from 0", function()
    local m = Net(2)
    assert.are.equal(2, #m.blocks)
    assert.are.equal(m.blocks["0"], m.blocks[1])
    assert.are.equal("RMSNorm", m.blocks[2]:type_name())
    assert.is_nil(m.blocks[3])
    local seen = 0
    for i, b in ipairs(m.blocks) do
      seen = seen + 1
      assert.are.equal(m.blocks:children()[i], b)
    end
    assert.are.equal(2, seen)
  end)

  it("replaces a reassigned parameter in place in the order and removes one set to nil", function()
    local m = Net(2)
    local w = nn.Parameter(ember.zeros(4, 2))
    m.fc1.weight = w
    assert.are.equal(w, m:parameters()[2])
    assert.are.equal("fc1.weight", m:named_parameters()[2][1])
    assert.are.same({"weight", "bias"}, names_of(m.fc1:named_parameters()))
    m.fc1.bias = nil
    assert.are.same({"scale", "fc1.weight", "blocks.0.weight", "blocks.1.weight",
      "fc2.weight", "fc2.bias"}, names_of(m:named_parameters()))
    assert.is_nil(m.fc1.bias)
  end)

  it("does not register a tensor without requires_grad, but does register a buffer", function()
    local m = nn.Module()
    m.cache = ember.zeros(3)
    m:register_buffer("running", ember.ones(2))
    m:register_buffer("scratch", ember.ones(5), false)
    assert.are.equal(0, #m:parameters())
    assert.are.equal(3, m.cache:numel())
    assert.are.same({"running", "scratch"}, names_of(m:named_buffers()))
    local sd = m:state_dict()
    assert.is_not_nil(sd.running)
    assert.is_nil(sd.scratch)
    assert.is_nil(sd.cache)
  end)

  it("refuses to overwrite a registered parameter with a non-tensor", function()
    local m = nn.Linear(2, 2)
    assert.error_matches(function() m.weight = 3 end, "cannot assign a number to 'weight'")
  end)

  it("counts a shared parameter once", function()
    local m = nn.Module()
    m.a = nn.Linear(4, 4, {bias = false})
    m.b = nn.Linear(4, 4, {bias = false})
    m.b.weight = m.a.weight
    assert.are.equal(16, m:num_parameters())
    assert.are.same({"a.weight"}, names_of(m:named_parameters()))
    local keys = {}
    for k in pairs(m:state_dict()) do keys[#keys + 1] = k end
    table.sort(keys)
    assert.are.same({"a.weight", "b.weight"}, keys)
  end)

  it("calls forward through __call", function()
    local m = Net(3)
    local x = ember.randn(2, 3)
    assert.is_true(maxdiff(m(x), m:forward(x)) == 0)
    assert.are.same({2, 3}, m(x).shape)
  end)

  it("sets training recursively with train() and eval()", function()
    local m = Net(2)
    assert.is_true(m.training)
    m:eval()
    for _, sub in ipairs(m:modules()) do assert.is_false(sub.training) end
    m:train()
    for _, sub in ipairs(m:modules()) do assert.is_true(sub.training) end
  end)

  it("applies a function to children before parents", function()
    local m = Net(2)
    local order = {}
    assert.are.equal(m, m:apply(function(sub) order[#order + 1] = sub:type_name() end))
    assert.are.same({"Linear", "Linear", "RMSNorm", "ModuleList", "Linear", "Net"}, order)
  end)

  it("sets gradients to nil with zero_grad", function()
    local m = Net(3)
    m(ember.randn(4, 3)):sum():backward()
    for _, p in ipairs(m:parameters()) do assert.is_not_nil(p.grad) end
    m:zero_grad()
    for _, p in ipairs(m:parameters()) do assert.is_nil(p.grad) end
  end)

  it("zeroes gradients in place with zero_grad(false)", function()
    local m = nn.Linear(3, 2)
    m(ember.randn(4, 3)):sum():backward()
    local g = m.weight.grad
    m:zero_grad(false)
    assert.are.equal(g, m.weight.grad)
    assert.are.equal(0, g:abs():sum():item())
  end)

  -- parameters() and modules() are cached; every change to any registry
  -- below the root must show in the next call
  it("lists a parameter or module added deep in the tree after the lists were read", function()
    local m = Net(2)
    assert.are.equal(7, #m:parameters())
    assert.are.equal(6, #m:modules())
    local extra = nn.Parameter(ember.ones(3))
    m.blocks[2].gain = extra                       -- a grandchild's new parameter
    local params = m:parameters()
    assert.are.equal(8, #params)
    assert.are.equal(extra, params[6])            -- blocks.1.weight, then blocks.1.gain
    assert.are.same({"scale", "fc1.weight", "fc1.bias", "blocks.0.weight", "blocks.1.weight",
      "blocks.1.gain", "fc2.weight", "fc2.bias"}, names_of(m:named_parameters()))
    m.blocks:append(nn.Linear(4, 4))               -- a new child of a child
    assert.are.equal(10, #m:parameters())
    assert.are.equal(7, #m:modules())
    assert.are.equal(m.blocks[3], m:modules()[6])
  end)

  it("drops a removed or replaced parameter or module from the cached lists", function()
    local m = Net(2)
    local old_bias = m.fc2.bias
    assert.are.equal(old_bias, m:parameters()[7])
    m.fc2.bias = nil
    assert.are.equal(6, #m:parameters())
    local w = nn.Parameter(ember.zeros(4, 4))
    m.blocks[1].weight = w
    assert.are.equal(w, m:parameters()[4])
    m.blocks = nil                                 -- a whole subtree
    assert.are.same({"scale", "fc1.weight", "fc1.bias", "fc2.weight"}, names_of(m:named_parameters()))
    assert.are.equal(4, #m:parameters())
    assert.are.equal(3, #m:modules())
    m.fc1 = nn.Linear(2, 5, {bias = false})          -- a module replaced by another
    assert.are.equal(m.fc1.weight, m:parameters()[2])
    assert.are.equal(3, #m:parameters())
  end)

  it("keeps no reference to a removed parameter once the lists were read", function()
    local m = Net(2)
    local held = setmetatable({m.fc2.bias}, {__mode = "v"})
    assert.are.equal(7, #m:parameters())
    m:zero_grad()
    m.fc2.bias = nil
    collectgarbage()
    collectgarbage()
    assert.is_nil(held[1])
  end)

  it("sees a change to a module shared by two trees from both", function()
    local shared = nn.Linear(2, 2)
    local a, b = nn.Module(), nn.Module()
    a.l, b.l = shared, shared
    assert.are.equal(2, #a:parameters())
    assert.are.equal(2, #b:parameters())
    shared.extra = nn.Parameter(ember.ones(1))
    assert.are.equal(3, #a:parameters())
    assert.are.equal(3, #b:parameters())
    assert.are.equal(shared.extra, b:parameters()[3])
  end)

  it("returns a fresh list each time: changing one does not change the module's", function()
    local m = Net(2)
    local params, mods = m:parameters(), m:modules()
    params[1], params[8] = nil, ember.ones(1)
    table.remove(mods, 1)
    assert.are.equal(m.scale, m:parameters()[1])
    assert.are.equal(7, #m:parameters())
    assert.are.equal(m, m:modules()[1])
    assert.are.equal(6, #m:modules())
  end)

  it("zero_grad and train reach what was registered after an earlier call", function()
    local m = Net(2)
    m:zero_grad()
    m:eval()
    m.late = nn.Linear(2, 2)
    m:train()
    assert.is_true(m.late.training)
    m:eval()
    assert.is_false(m.late.training)
    local x = ember.randn(3, 2)
    local loss = m(x):sum() + m.late(x):sum()
    loss:backward()
    assert.is_not_nil(m.late.weight.grad)
    m:zero_grad()
    for _, p in ipairs(m:parameters()) do assert.is_nil(p.grad) end
  end)

  it("converts parameters in place with to(dtype), keeping their identity and values", function()
    local m = Net(3)
    local params = m:parameters()
    local before = {}
    for i, p in ipairs(params) do before[i] = p:clone() end
    m:to("f64")
    for i, p in ipairs(m:parameters()) do
      assert.are.equal(params[i], p)
      assert.are.equal("f64", p.dtype)
      assert.is_true(p.requires_grad)
      assert.is_true(maxdiff(p, before[i]) == 0)
    end
    m:to({dtype = "f32"})
    assert.are.equal("f32", params[1].dtype)
    local y = m(ember.randn(2, 3))
    assert.are.equal("f32", y.dtype)
  end)

  it("keeps gradients flowing into converted parameters", function()
    local m = nn.Linear(3, 2)
    local w = m.weight
    m:to("f64")
    m(ember.randn(4, 3, {dtype = "f64"})):sum():backward()
    assert.are.equal(w, m.weight)
    assert.are.equal("f64", w.grad.dtype)
  end)

  it("rejects an unknown target in to()", function()
    assert.error_matches(function() nn.Linear(2, 2):to("tpu") end,
      "ember.nn.Module.to: expected a dtype")
  end)

  it("prints the module tree like PyTorch", function()
    local m = nn.TransformerLM(nn.configs.tiny{vocab_size = 32, context_length = 8})
    local s = tostring(m)
    assert.truthy(s:find("^TransformerLM%(\n  %(token_embeddings%): Embedding%(32, 64%)\n"))
    assert.truthy(s:find("  (layers): ModuleList(\n    (0-1): 2 x TransformerBlock(", 1, true))
    assert.truthy(s:find("(q_proj): Linear(in_features=64, out_features=64, bias=False)", 1,
      true))
    assert.truthy(s:find("(ln_final): RMSNorm((64,), eps=1e-05)", 1, true))
    assert.truthy(s:find("\n%)$"))
    assert.are.equal("Linear(in_features=2, out_features=3, bias=True)",
      tostring(nn.Linear(2, 3)))
  end)
end)

describe("ember.nn state_dict", function()
  it("holds every parameter by name, sharing storage with the module", function()
    ember.manual_seed(1)
    local m = nn.Linear(3, 2)
    local sd = m:state_dict()
    assert.are.same({2, 3}, sd.weight.shape)
    ember.no_grad(function() m.weight:fill_(2) end)
    assert.are.equal(12, sd.weight:sum():item())
  end)

  it("round-trips: a second model loading the first's state computes the same", function()
    local cfg = nn.configs.tiny{vocab_size = 50, context_length = 8}
    ember.manual_seed(2)
    local a = nn.TransformerLM(cfg)
    ember.manual_seed(3)
    local b = nn.TransformerLM(cfg)
    local ids = ember.randint(0, 50, {2, 8})
    assert.is_true(maxdiff(a(ids), b(ids)) > 1e-3)
    local res = b:load_state_dict(a:state_dict())
    assert.are.same({}, res.missing_keys)
    assert.are.same({}, res.unexpected_keys)
    assert.is_true(maxdiff(a(ids), b(ids)) == 0)
    -- loaded by copy: the two models do not share storage
    ember.no_grad(function() a.lm_head.weight:fill_(0) end)
    assert.is_true(b.lm_head.weight:abs():sum():item() > 0)
  end)

  it("survives a trip through a safetensors file (ember.save / ember.load)", function()
    local cfg = nn.configs.tiny{vocab_size = 40, context_length = 8}
    ember.manual_seed(4)
    local a = nn.TransformerLM(cfg)
    local path = os.tmpname()
    ember.save(path, a:state_dict())
    ember.manual_seed(5)
    local b = nn.TransformerLM(cfg)
    b:load_state_dict(ember.load(path))
    os.remove(path)
    local ids = ember.randint(0, 40, {2, 8})
    assert.is_true(maxdiff(a(ids), b(ids)) == 0)
  end)

  it("names missing keys under strict loading", function()
    local m = nn.Linear(3, 2)
    local sd = m:state_dict()
    sd.bias = nil
    assert.error_matches(function() m:load_state_dict(sd) end,
      "ember.nn.Module.load_state_dict: missing keys: bias", 1, true)
  end)

  it("names unexpected keys under strict loading", function()
    local m = nn.Linear(3, 2)
    local sd = m:state_dict()
    sd["extra.weight"] = ember.zeros(1)
    assert.error_matches(function() m:load_state_dict(sd) end,
      "unexpected keys: extra.weight", 1, true)
  end)

  it("names the parameter and both shapes on a size mismatch, even when not strict", function()
    local m = nn.Linear(3, 2)
    local sd = nn.Linear(4, 2):state_dict()
    assert.error_matches(function() m:load_state_dict(sd, {strict = false}) end,
      "size mismatch for weight: checkpoint has shape [2, 4], model has [2, 3]", 1, true)
  end)

  it("reports missing and unexpected keys instead of failing when not strict", function()
    local m = nn.Linear(3, 2)
    local w = ember.randn(2, 3)
    local res = m:load_state_dict({weight = w, other = ember.zeros(2)}, {strict = false})
    assert.are.same({"bias"}, res.missing_keys)
    assert.are.same({"other"}, res.unexpected_keys)
    assert.is_true(maxdiff(m.weight, w) == 0)
  end)
end)

describe("ember.nn layers", function()
  before_each(function() ember.manual_seed(42) end)

  it("Linear computes x Wᵀ + b", function()
    local m = nn.Linear(5, 3)
    ember.no_grad(function() m.bias:normal_(0, 1) end)
    local x = ember.randn(2, 4, 5)
    local ref = x:matmul(m.weight:transpose(0, 1)) + m.bias
    assert.are.same({2, 4, 3}, m(x).shape)
    assert.is_true(maxdiff(m(x), ref) < TOL)
  end)

  it("Linear gives the exact values of a hand-written example", function()
    local m = nn.Linear(2, 2)
    m:load_state_dict({weight = ember.tensor({{1, 2}, {3, 4}}), bias = ember.tensor({10, 20})})
    assert.are.same({{15, 31}}, m(ember.tensor({{1, 2}})):tolist())
  end)

  it("Linear without bias has only a weight (out, in)", function()
    local m = nn.Linear(4, 6, {bias = false})
    assert.are.same({"weight"}, names_of(m:named_parameters()))
    assert.are.same({6, 4}, m.weight.shape)
  end)

  it("Linear initialises truncated normal with std sqrt(2/(in+out)) cut at 3 std", function()
    local m = nn.Linear(300, 500)
    local std = math.sqrt(2 / 800)
    local w = m.weight
    -- 150k samples: the sample std is within 1% of the truncated law's
    -- (0.9866 std for a cut at 3 std)
    local s = w:var():sqrt():item()
    assert.is_true(math.abs(s - 0.9866 * std) < 0.01 * std, "std " .. s)
    assert.is_true(w:abs():max():item() <= 3 * std * (1 + 1e-6))
    assert.is_true(math.abs(w:mean():item()) < 0.01 * std)
  end)

  it("Embedding picks rows and initialises std 1 cut at 3", function()
    local m = nn.Embedding(1000, 64)
    local ids = ember.tensor({{3, 7}, {999, 0}}, {dtype = "i64"})
    local y = m(ids)
    assert.are.same({2, 2, 64}, y.shape)
    assert.is_true(maxdiff(y:select(0, 1):select(0, 0), m.weight:select(0, 999)) == 0)
    assert.is_true(math.abs(m.weight:var():sqrt():item() - 0.9866) < 0.01)
    assert.is_true(m.weight:abs():max():item() <= 3 + 1e-6)
  end)

  it("RMSNorm computes x / sqrt(mean(x²) + eps) * weight", function()
    local m = nn.RMSNorm(8, {eps = 1e-5})
    assert.are.equal(8, m.weight:sum():item())
    ember.no_grad(function() m.weight:normal_(1, 0.5) end)
    local x = ember.randn(3, 5, 8) * 3
    local ref = x / ((x * x):mean(-1, {keepdim = true}) + 1e-5):sqrt() * m.weight
    assert.is_true(maxdiff(m(x), ref) < TOL)
  end)

  it("RotaryEmbedding rotates adjacent pairs by pos·theta^(−2j/d)", function()
    local m = nn.RotaryEmbedding(8, {theta = 10000})
    local x = ember.randn(2, 3, 6, 8)
    assert.is_true(maxdiff(m(x), rope_ref(x, 10000)) < TOL)
    -- position 0 is left as it is
    assert.is_true(maxdiff(m(x):narrow(2, 0, 1), x:narrow(2, 0, 1)) < 1e-7)
  end)

  it("SwiGLU computes w2(silu(w1 x) ⊙ w3 x)", function()
    local m = nn.SwiGLU(6, 10)
    assert.are.same({"w1.weight", "w2.weight", "w3.weight"}, names_of(m:named_parameters()))
    local x = ember.randn(2, 3, 6)
    local a = x:matmul(m.w1.weight:transpose(0, 1))
    local b = x:matmul(m.w3.weight:transpose(0, 1))
    local ref = (a * a:sigmoid() * b):matmul(m.w2.weight:transpose(0, 1))
    assert.is_true(maxdiff(m(x), ref) < TOL)
  end)

  it("CausalSelfAttention matches heads as contiguous slices, RoPE and a causal softmax", function()
    local B, T, D, H = 2, 5, 12, 3
    local dh = D // H
    local m = nn.CausalSelfAttention(D, H)
    local x = ember.randn(B, T, D)
    local function proj(lin, t) return t:matmul(lin.weight:transpose(0, 1)) end
    local q, k, v = proj(m.q_proj, x), proj(m.k_proj, x), proj(m.v_proj, x)
    local mask = ember.ones(T, T):triu(1):eq(1)      -- true above the diagonal
    local heads = {}
    for h = 0, H - 1 do
      local qh = rope_ref(q:narrow(-1, h * dh, dh), 10000)
      local kh = rope_ref(k:narrow(-1, h * dh, dh), 10000)
      local vh = v:narrow(-1, h * dh, dh)
      local s = qh:matmul(kh:transpose(-2, -1)) / math.sqrt(dh)
      heads[#heads + 1] = s:masked_fill(mask, -math.huge):softmax(-1):matmul(vh)
    end
    local ref = proj(m.output_proj, ember.cat(heads, -1))
    assert.are.same({B, T, D}, m(x).shape)
    assert.is_true(maxdiff(m(x), ref) < TOL)
  end)

  it("CausalSelfAttention calls a pluggable attn_fn with (B, H, T, d_head) tensors", function()
    local calls, seen = 0, nil
    local m = nn.CausalSelfAttention(8, 2, {attn_fn = function(q, k, v)
      calls = calls + 1
      seen = q.shape
      return v                                   -- "attention" that copies v
    end})
    local x = ember.randn(3, 4, 8)
    local y = m(x)
    assert.are.equal(1, calls)
    assert.are.same({3, 2, 4, 4}, seen)
    -- with attention = identity on v, the block is output_proj(v_proj(x))
    local ref = m.output_proj(m.v_proj(x))
    assert.is_true(maxdiff(y, ref) < TOL)
  end)

  it("CausalSelfAttention rejects d_model not divisible by num_heads", function()
    assert.error_matches(function() nn.CausalSelfAttention(10, 3) end,
      "ember.nn.CausalSelfAttention: expected d_model divisible by num_heads, got 10 and 3",
      1, true)
  end)

  it("TransformerBlock is pre-norm: x + attn(ln1(x)), then + ffn(ln2(x))", function()
    local m = nn.TransformerBlock(8, 2, 16)
    assert.are.same({"ln1", "attn", "ln2", "ffn"}, names_of(m:named_children()))
    local x = ember.randn(2, 3, 8)
    local h = x + m.attn(m.ln1(x))
    local ref = h + m.ffn(m.ln2(h))
    assert.is_true(maxdiff(m(x), ref) < TOL)
  end)

  it("Linear names what it expected and got", function()
    assert.error_matches(function() nn.Linear(0, 3) end,
      "ember.nn.Linear: expected in_features to be a positive integer, got 0", 1, true)
  end)
end)

describe("ember.nn.functional", function()
  before_each(function() ember.manual_seed(7) end)

  it("cross_entropy is the mean of −log softmax at the targets", function()
    local logits = ember.randn(3, 4, 7)
    local targets = ember.randint(0, 7, {3, 4})
    local lsm = logits:log_softmax(-1)
    local ls, tl = lsm:tolist(), targets:tolist()
    local sum = 0
    for i = 1, 3 do for j = 1, 4 do sum = sum - ls[i][j][tl[i][j] + 1] end end
    assert.is_true(math.abs(F.cross_entropy(logits, targets):item() - sum / 12) < TOL)
  end)

  it("scaled_dot_product_attention uses 1/sqrt(d) and an optional causal mask", function()
    local q, k, v = ember.randn(2, 4, 8), ember.randn(2, 4, 8), ember.randn(2, 4, 8)
    local s = q:matmul(k:transpose(-2, -1)) / math.sqrt(8)
    assert.is_true(maxdiff(F.scaled_dot_product_attention(q, k, v), s:softmax(-1):matmul(v)) < TOL)
    local mask = ember.ones(4, 4):triu(1):eq(1)
    local ref = s:masked_fill(mask, -math.huge):softmax(-1):matmul(v)
    assert.is_true(maxdiff(F.scaled_dot_product_attention(q, k, v, {causal = true}), ref) < TOL)
    local ref2 = (q:matmul(k:transpose(-2, -1)) * 0.5):softmax(-1):matmul(v)
    assert.is_true(maxdiff(F.scaled_dot_product_attention(q, k, v, {scale = 0.5}), ref2) < TOL)
  end)

  it("impl='flash' on the CPU runs the tiled path: naive attention's values, its log-sum-exp", function()
    for _, causal in ipairs({true, false}) do
      for _, dt in ipairs({"f64", "f32"}) do
        local q = ember.randn(2, 3, 9, 16, {dtype = dt})
        local k, v = ember.randn(2, 3, 13, 16, {dtype = dt}), ember.randn(2, 3, 13, 16, {dtype = dt})
        local flash = F.scaled_dot_product_attention(q, k, v, {causal = causal, impl = "flash"})
        local naive = F.scaled_dot_product_attention(q, k, v, {causal = causal, impl = "naive"})
        assert.are.equal(dt, flash.dtype)
        assert.is_true(maxdiff(flash, naive) < (dt == "f64" and 1e-12 or 1e-5), dt)
        local s = q:to("f64"):matmul(k:to("f64"):transpose(-2, -1)) / 4
        if causal then s = s:masked_fill(ember.ones(9, 13):triu(1):eq(1), -math.huge) end
        local _, lse = ember.core.flash_attention(q, k, v, causal)
        assert.are.equal(dt == "f64" and "f64" or "f32", lse.dtype)
        assert.is_true(maxdiff(lse:to("f64"), s:logsumexp(-1)) < 1e-5)
      end
    end
    local q = ember.randn(1, 2, 16, 16)
    assert.is_false(ember.core.flash_applies(q, q, q))   -- 'auto' picks naive for short rows on the CPU
    assert.error_matches(function() F.flash_attention(q, q, q:narrow(3, 0, 8)) end,
      "expected q (B, H, Tq, D), k and v (B, Hkv, Tk, D) with H a multiple of Hkv", 1, true)
    assert.error_matches(function() F.flash_attention(ember.randn(1, 1, 4, 24), ember.randn(1, 1, 4, 24),
      ember.randn(1, 1, 4, 24)) end, "no kernel for head dim 24", 1, true)
    local i = ember.ones(1, 1, 4, 16, {dtype = "i32"})
    assert.error_matches(function() F.flash_attention(i, i, i) end, "flash_attention: expected", 1, true)
  end)

  it("rejects an unknown attention impl", function()
    local q = ember.randn(1, 2, 4)
    assert.error_matches(function() F.scaled_dot_product_attention(q, q, q, {impl = "fast"}) end,
      "expected impl 'auto', 'naive' or 'flash', got fast", 1, true)
  end)

  it("swiglu is silu(a) ⊙ b and silu is x·sigmoid(x)", function()
    local a, b = ember.randn(5, 6), ember.randn(5, 6)
    assert.is_true(maxdiff(F.silu(a), a * a:sigmoid()) < TOL)
    assert.is_true(maxdiff(F.swiglu(a, b), a * a:sigmoid() * b) < TOL)
  end)
end)
