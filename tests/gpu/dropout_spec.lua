-- dropout_spec.lua (GPU) — dropout and the random ops on CUDA
-- (kernels/dropout.cu, kernels/random.cu, kernels/rng.cu):
--   * the same seed gives the same masks / draws on CUDA as on the CPU
--     (bit for bit: both evaluate the same Philox counters and compare in
--     double);
--   * inside ember.cuda.graph, dropout (and rand) read their Philox counter
--     from the graph's device cell: two replays draw different masks, each
--     replay draws exactly what the eager op would draw at that point of the
--     generator, and a captured forward + backward uses one mask for both.
-- Run on a GPU host: EMBER_TEST_GPU=1 EMBER_BUILD=<build> bash tests/run_all.sh
local ember = require "ember"
local F = ember.nn.functional
local cuda = ember.cuda

assert(cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local function same(a, b, what)
  assert.same(a:cpu():tolist(), b:cpu():tolist(), what)
end

describe("dropout on CUDA", function()
  for _, dt in ipairs({"f32", "bf16", "f16", "f64"}) do
    it(dt .. ": the same seed draws the same mask and values as the CPU (odd length, 4-vector tail)", function()
      local x = ember.randn(1000003):to(dt)
      ember.manual_seed(123)
      local yc = F.dropout(x, 0.3)
      ember.manual_seed(123)
      local yg = F.dropout(x:cuda(), 0.3)
      assert.equals("cuda:0", yg.device)
      same(yc, yg, "dropout " .. dt)
    end)
  end

  it("a non-contiguous input follows the logical order on both devices", function()
    local x = ember.randn(37, 29)
    ember.manual_seed(5); local yc = F.dropout(x:t(), 0.5)
    ember.manual_seed(5); local yg = F.dropout(x:cuda():t(), 0.5)
    same(yc, yg, "transposed")
  end)

  it("backward regenerates the same mask on the device", function()
    local x = ember.randn(4099)
    local xc, xg = x:clone(), x:cuda()
    xc.requires_grad, xg.requires_grad = true, true
    ember.manual_seed(9); local yc = F.dropout(xc, 0.25)
    ember.manual_seed(9); local yg = F.dropout(xg, 0.25)
    local g = ember.randn(4099)
    yc:backward(g); yg:backward(g:cuda())
    same(xc.grad, xg.grad, "grad")
  end)
end)

describe("random ops on CUDA equal the CPU for the same seed", function()
  local function both(fn)
    ember.manual_seed(77); local c = fn("cpu")
    ember.manual_seed(77); local g = fn("cuda")
    assert.equals("cuda:0", g.device)
    same(c, g)
  end
  it("bernoulli", function()
    local p = ember.rand(513)
    both(function(d) return ember.bernoulli(p:to(d)) end)
    -- p read in its own dtype on CUDA (f64 on the CPU): the same draws; outputs of every width
    both(function(d) return ember.bernoulli(p:to("bf16"):to(d)) end)
    both(function(d) return ember.zeros(513, {dtype = "i64", device = d}):bernoulli_(p:to(d)) end)
    both(function(d) return ember.zeros(513, {dtype = "u8", device = d}):bernoulli_(p:to("f16"):to(d)) end)
  end)
  it("bernoulli_ into a strided view, number and tensor p", function()
    both(function(d) return ember.zeros(6, 7, {device = d}):t():bernoulli_(0.3) end)
    local p = ember.rand(7)
    both(function(d) return ember.zeros(5, 7, {device = d}):bernoulli_(p:to(d)) end)
  end)
  it("uniform_ and normal_", function()
    both(function(d) return ember.empty(1001, {device = d}):uniform_(-1, 2) end)
    both(function(d) return ember.empty(1001, {device = d}):normal_(3, 0.5) end)
  end)
  it("randperm (1 and 100003 elements)", function()
    both(function(d) return ember.randperm(1, {device = d}) end)
    both(function(d) return ember.randperm(100003, {device = d}) end)
  end)
  it("multinomial with and without replacement", function()
    local p = ember.rand(7, 300) + 0.01
    both(function(d) return ember.multinomial(p:to(d), 5, {replacement = true}) end)
    both(function(d) return ember.multinomial(p:to(d), 20) end)
  end)
end)

describe("random ops in a CUDA graph", function()
  it("two replays of a captured dropout draw different masks, each the eager mask at that offset", function()
    local x = ember.ones(100000, {device = "cuda"})
    ember.manual_seed(2024)
    local g, y = cuda.graph(function() return F.dropout(x, 0.5) end, {warmup = 0})
    -- the capture consumed nothing: the first replay reserves the stream from offset 0
    local state = ember.get_rng_state()
    assert.equals(0, state.offset)
    g:replay(); cuda.synchronize()
    local m1 = y:cpu()
    local after1 = ember.get_rng_state().offset
    assert.equals((100000 + 3) // 4, after1, "a replay advances the generator by the graph's blocks")
    g:replay(); cuda.synchronize()
    local m2 = y:cpu()
    assert.are_not.same(m1:tolist(), m2:tolist())
    -- each replay equals the eager op run at the same generator position (on the CPU)
    ember.manual_seed(2024)
    same(F.dropout(ember.ones(100000), 0.5), m1, "replay 1")
    same(F.dropout(ember.ones(100000), 0.5), m2, "replay 2")
    g:close()
  end)

  it("a captured forward + backward uses one mask per replay for both", function()
    local x = ember.randn(4096, {device = "cuda"})
    x.requires_grad = true
    local g, y = cuda.graph(function()
      x.grad = nil
      local y = F.dropout(x, 0.4)
      y:sum():backward()
      return y
    end, {warmup = 1})
    for _ = 1, 2 do
      g:replay(); cuda.synchronize()
      local kept = y:cpu():ne(0)
      local gk = x.grad:cpu():ne(0)
      assert.same(kept:tolist(), gk:tolist(), "the gradient's mask is the forward's")
    end
    g:close()
  end)

  it("rand inside a graph draws fresh numbers per replay too", function()
    local g, r = cuda.graph(function() return ember.rand(1000, {device = "cuda"}) end, {warmup = 0})
    g:replay(); cuda.synchronize(); local a = r:cpu():tolist()
    g:replay(); cuda.synchronize(); local b = r:cpu():tolist()
    assert.are_not.same(a, b)
    g:close()
  end)

  it("eager draws after a replay do not reuse the replay's counters", function()
    local x = ember.ones(4096, {device = "cuda"})
    ember.manual_seed(1)
    local g, y = cuda.graph(function() return F.dropout(x, 0.5) end, {warmup = 0})
    g:replay(); cuda.synchronize()
    local eager = F.dropout(x, 0.5)
    assert.are_not.same(y:cpu():tolist(), eager:cpu():tolist())
    g:close()
  end)
end)

describe("cross_entropy options on CUDA", function()
  local function check(opts, dt)
    ember.manual_seed(3)
    local logits = ember.randn(67, 1003):to(dt)
    local tl = ember.randint(0, 1003, {67}):tolist()
    tl[1] = opts.ignore_index or -100             -- one ignored row (the option's, or the default -100)
    local t = ember.tensor(tl, {dtype = "i64"})
    local xc, xg = logits:clone(), logits:cuda()
    xc.requires_grad, xg.requires_grad = true, true
    local lc, lg = F.cross_entropy(xc, t, opts), F.cross_entropy(xg, t:cuda(), opts)
    local w = ember.randn(lc.shape, {dtype = "f64"})
    local sc = (lc:to("f64") * w):sum()
    local sg = (lg:to("f64") * w:cuda()):sum()
    sc:backward(); sg:backward()
    -- f32: both compute in f32 with sums in other orders; bf16: rounded once to bf16 on both sides
    local tol = dt == "f32" and 1e-5 or 1e-2
    local function rel(a, b)
      local a64, b64 = a:cpu():to("f64"), b:cpu():to("f64")
      return (a64 - b64):abs():max():item() / (b64:abs():max():item() + 1e-30)
    end
    assert.is_true(rel(lg, lc) < tol, "loss")
    assert.is_true(rel(xg.grad, xc.grad) < tol, "grad")
  end
  for _, dt in ipairs({"f32", "bf16"}) do
    it(dt .. ": ignore_index + label_smoothing, mean", function() check({label_smoothing = 0.1}, dt) end)
    it(dt .. ": reduction none", function() check({reduction = "none", label_smoothing = 0.2}, dt) end)
    it(dt .. ": reduction sum, ignore_index 5", function() check({reduction = "sum", ignore_index = 5}, dt) end)
  end
  it("a captured cross_entropy with ignore_index replays without host reads", function()
    local x = ember.randn(8, 50, {device = "cuda"})
    local t = ember.tensor({0, 1, -100, 3, 4, -100, 6, 7}, {dtype = "i64"}):cuda()
    local g, l = cuda.graph(function() return F.cross_entropy(x, t, {label_smoothing = 0.1}) end)
    g:replay(); cuda.synchronize()
    local want = F.cross_entropy(x:cpu(), t:cpu(), {label_smoothing = 0.1}):item()
    assert.is_true(math.abs(l:item() - want) < 1e-5 * math.abs(want))
    g:close()
  end)
end)
