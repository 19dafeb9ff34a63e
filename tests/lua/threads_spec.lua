-- threads_spec.lua — the CPU's results do not depend on the thread count
-- (engine/parallel.h: ranges write disjoint outputs; reductions combine
-- fixed blocks in order), so the CPU stays the bit-exact reference:
--   * every case of the op registry (op_cases.lua), in f32, f64 and bf16,
--     forward and the gradients of sum(out * w), at 1 thread and at 3 threads
--     with the parallel grain lowered to one element, so even the registry's
--     small shapes are cut into ranges mid-row;
--   * larger shapes that take the blocked paths (reductions longer than one
--     block, column sums over many rows, norm weight gradients over many row
--     blocks, embedding backward with repeated ids, AdamW, long scans), at the
--     default grain too;
--   * one training step of the tiny TransformerLM (loss and every parameter);
--   * ember.set_num_threads / get_num_threads and their errors.
-- The runs at 3 threads write every output with streaming stores, the runs
-- at 1 thread with regular ones (ember.set_stream_min).
-- Comparisons are exact, never within a tolerance: equal values, NaN at the
-- same places and the same sign on every zero (only NaN payloads are not
-- compared).
local ember = require "ember"
local F = ember.nn.functional

local here = debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./"
local cases = dofile(here .. "op_cases.lua")

local MANY = 3   -- more than this machine's 2 cores on purpose: ranges still split

--- fn() run with n threads and the given minimum work per range; settings restored.
-- Above one thread every output is also written with streaming stores
-- (engine/stream.h), so the 1-thread side checks those paths too.
local function with_threads(n, min_work, fn)
  local prev_n = ember.get_num_threads()
  local prev_w = ember.set_parallel_min_work(min_work)
  local prev_s = ember.set_stream_min(n > 1 and 0 or -1)
  ember.set_num_threads(n)
  local ok, r = pcall(fn)
  ember.set_num_threads(prev_n)
  ember.set_parallel_min_work(prev_w)
  ember.set_stream_min(prev_s)
  if not ok then error(r, 0) end
  return r
end

local function is_float(t)
  return t.dtype == "f32" or t.dtype == "f64" or t.dtype == "bf16" or t.dtype == "f16"
end

local function count(mask) return mask:sum():item() end

--- Same values, NaNs at the same places, zeros of the same sign.
local function same(a, b)
  if not is_float(a) then return count(ember.ne(a, b)) == 0 end
  local x, y = a:to("f64"), b:to("f64")
  local nx, ny = x:ne(x), y:ne(y)
  if count(ember.ne(nx, ny)) > 0 then return false end
  x, y = x:masked_fill(nx, 0), y:masked_fill(ny, 0)
  return count(ember.ne(x, y)) == 0 and count(ember.ne(x:reciprocal(), y:reciprocal())) == 0   -- 1/-0 = -inf
end

--- a and b hold the same bits (dtype, shape, every element); a failure names the first element that differs.
local function assert_same_bits(a, b, what)
  assert.are.equal(a.dtype, b.dtype, what .. ": dtype")
  assert.are.same(a.shape, b.shape, what .. ": shape")
  a, b = a:detach(), b:detach()
  if same(a, b) then return end
  local x, y = a:reshape({-1}):tolist(), b:reshape({-1}):tolist()
  local function key(v)   -- one element's bits (any NaN alike)
    if v ~= v then return "nan" end
    return type(v) == "number" and string.pack(math.type(v) == "integer" and "<j" or "<d", v) or tostring(v)
  end
  local function show(v) return math.type(v) == "float" and ("%.17g"):format(v) or tostring(v) end
  for i = 1, #x do
    if key(x[i]) ~= key(y[i]) then
      error(("%s: element %d differs: %s at 1 thread, %s at %d threads"):format(what, i - 1, show(x[i]),
        show(y[i]), MANY), 2)
    end
  end
  error(what .. ": differs", 2)
end

--- Forward and input gradients of out = fn(inputs()): {out, grad_1, ...}.
local function evaluate(fn, inputs)
  local xs = inputs()
  local out = fn(table.unpack(xs))
  local res = {out = out}
  if is_float(out) and out.requires_grad then
    ember.manual_seed(20261125)
    local w = ember.randn(out.shape, {dtype = "f64"}):to(out.dtype)
    ;(out * w):sum():backward()
    for i, x in ipairs(xs) do
      if ember.is_tensor(x) and x.requires_grad then res[i] = x.grad end
    end
  end
  return res
end

--- The same results at 1 thread and at MANY threads (with min_work per range).
local function check(fn, inputs, min_work)
  local one = with_threads(1, 32768, function() return evaluate(fn, inputs) end)
  local many = with_threads(MANY, min_work, function() return evaluate(fn, inputs) end)
  assert_same_bits(one.out, many.out, "forward")
  for i, g in pairs(one) do
    if i ~= "out" then
      assert.is_not_nil(many[i], ("input %d has a gradient at 1 thread only"):format(i))
      assert_same_bits(g, many[i], ("gradient of input %d"):format(i))
    end
  end
end

describe("ember.set_num_threads", function()
  local before
  before_each(function() before = ember.get_num_threads() end)
  after_each(function() ember.set_num_threads(before) end)

  it("sets the count get_num_threads reports, and runinfo and threads_info carry it", function()
    ember.set_num_threads(3)
    assert.are.equal(3, ember.get_num_threads())
    assert.are.equal(3, require("ember.runinfo").collect("cpu").threads)
    local info = ember.threads_info()
    assert.are.equal(3, info.threads)
    assert.are.equal("set_num_threads", info.source)
    assert.is_true(info.default >= 1)
    ember.set_num_threads(1)
    assert.are.equal(1, ember.get_num_threads())
  end)

  it("rejects zero, negatives, fractions, non-numbers and absurd counts, keeping the count", function()
    ember.set_num_threads(2)
    for _, bad in ipairs({{0, "got 0"}, {-3, "got -3"}, {2.5, "got 2.5"}, {"4", "got string"}, {nil, "got nil"}}) do
      assert.error_matches(function() ember.set_num_threads(bad[1]) end,
        "ember.set_num_threads: expected a positive integer number of threads, " .. bad[2], 1, true)
    end
    assert.error_matches(function() ember.set_num_threads(5000) end,
      "ember.set_num_threads: expected an integer from 1 to 1024, got 5000", 1, true)
    assert.are.equal(2, ember.get_num_threads())
  end)

  it("reads EMBER_NUM_THREADS at start, and says so when it is not a count", function()
    local H = dofile(here .. "helpers.lua")
    local script = H.temp(".lua")
    H.spit(script, "local e = require 'ember' io.write(e.get_num_threads(), ' ', e.threads_info().source)")
    local out, err = H.ember({"run", script}, {env = {EMBER_NUM_THREADS = "5"}})
    assert.are.equal("5 EMBER_NUM_THREADS", out, err)
    out, err = H.ember({"run", script}, {env = {EMBER_NUM_THREADS = "lots"}})
    assert.matches("^ember: EMBER_NUM_THREADS must be an integer from 1 to 1024, got 'lots'; using %d+ threads", err)
    assert.matches("^%d+ cores$", out)
    H.remove_temps()
  end)

  -- the CPU's load-time switches (em_env_pick): a value they do not take is said on stderr, naming the choices,
  -- and the default runs (a library must not fail to load)
  it("says so when EMBER_CPU_SCHED or EMBER_CPU_SIMD is not one of its choices, and runs the default", function()
    local H = dofile(here .. "helpers.lua")
    local script = H.temp(".lua")
    H.spit(script, "local e = require 'ember' io.write(e.arange(10):to('bf16'):sum():item())")
    local out, err = H.ember({"run", script}, {env = {EMBER_CPU_SCHED = "greedy"}})
    assert.are.equal("45", out, err)
    assert.matches("ember: EMBER_CPU_SCHED must be 'steal' or 'static', got 'greedy'; using steal", err, 1, true)
    out, err = H.ember({"run", script}, {env = {EMBER_CPU_SIMD = "sse"}})
    assert.are.equal("45", out, err)
    assert.matches("ember: EMBER_CPU_SIMD must be 'bf16', 'clones', 'avx2' or 'avx512', got 'sse'; using bf16", err,
      1, true)
    for _, v in ipairs({"static", "steal"}) do
      out, err = H.ember({"run", script}, {env = {EMBER_CPU_SCHED = v}})
      assert.are.equal("45", out, v)
      assert.are.equal("", err or "", v)
    end
    H.remove_temps()
  end)
end)

describe("CPU results at 1 and 3 threads", function()
  for _, c in ipairs(cases) do
    for _, dtype in ipairs({"f32", "f64", "bf16"}) do
      it(("%s [%s]"):format(c.name, dtype), function()
        check(c.fn, function() return cases.make_inputs(c, {dtype = dtype, device = "cpu"}) end, 1)
      end)
    end
  end
end)

describe("CPU results at 1 and 3 threads on shapes past one reduction block", function()
  local dtype   -- the dtype the BIG inputs are made in (f64 shows a changed summation order that f32 rounds away)
  local function randn(shape)
    return ember.randn(shape, {dtype = dtype, requires_grad = true})
  end
  local BIG = {
    {"sum of 100003 (4 blocks)", function(x) return x:sum() end, function() return {randn({100003})} end},
    {"mean over dim 0 of (300, 700) (column blocks)", function(x) return x:mean(0) end,
      function() return {randn({300, 700})} end},
    {"integer sum over dim 0 of (1000, 3)", function(x) return x:sum(0) end,
      function() return {ember.randint(-1000, 1000, {1000, 3})} end},
    {"var of 100003", function(x) return x:var() end, function() return {randn({100003})} end},
    {"argmax of 100003 with ties", function(x) return x:argmax() end,
      function() return {ember.randint(0, 50, {100003}):to(dtype)} end},
    {"max over dim 1 of (3, 70000)", function(x) return x:max(1) end, function() return {randn({3, 70000})} end},
    {"logsumexp of 100003", function(x) return x:logsumexp(0) end, function() return {randn({100003})} end},
    {"norm of 100003", function(x) return x:norm() end, function() return {randn({100003})} end},
    {"softmax rows of (64, 2000)", function(x) return x:softmax(1) end, function() return {randn({64, 2000})} end},
    {"log_softmax over dim 0 of (500, 40)", function(x) return x:log_softmax(0) end,
      function() return {randn({500, 40})} end},
    {"cross_entropy over (64, 5000) with label smoothing", function(x, t)
      return F.cross_entropy(x, t, {label_smoothing = 0.1}) end,
      function() return {randn({64, 5000}), ember.randint(0, 5000, {64})} end},
    {"rmsnorm of (1500, 64) with a weight (3 row blocks)", function(x, w) return F.rmsnorm(x, w) end,
      function() return {randn({1500, 64}), randn({64})} end},
    {"layer_norm of (1500, 64) with weight and bias", function(x, w, b) return F.layer_norm(x, {64}, w, b) end,
      function() return {randn({1500, 64}), randn({64}), randn({64})} end},
    {"embedding of 5000 repeated ids into a (50, 96) table", function(ids, w) return F.embedding(ids, w) end,
      function() return {ember.randint(0, 50, {5000}), randn({50, 96})} end},
    {"swiglu of (300, 700)", function(a, b) return F.swiglu(a, b) end,
      function() return {randn({300, 700}), randn({300, 700})} end},
    {"causal attention of (2, 4, 100, 16)", function(q, k, v)
      return F.scaled_dot_product_attention(q, k, v, {causal = true}) end,
      function() return {randn({2, 4, 100, 16}), randn({2, 4, 100, 16}), randn({2, 4, 100, 16})} end},
    {"cumsum over 100003", function(x) return x:cumsum(0) end, function() return {randn({100003})} end},
    {"transposed copy of (300, 700) to bf16", function(x) return x:t():contiguous():to("bf16") end,
      function() return {randn({300, 700})} end},
    {"sort rows of (64, 1000)", function(x) return x:sort(1) end, function() return {randn({64, 1000})} end},
    {"matmul (600, 300) @ (300, 500): tiles", function(a, b) return a:matmul(b) end,
      function() return {randn({600, 300}), randn({300, 500})} end},
    {"matmul (200, 1100)ᵀ-view @ (1100, 150): k blocks", function(a, b) return a:t():matmul(b) end,
      function() return {randn({1100, 200}), randn({1100, 150})} end},
    {"matmul (600, 2100) @ (2100, 40): 2 tiles of 304 x 8 k blocks", function(a, b) return a:matmul(b) end,
      function() return {randn({600, 2100}), randn({2100, 40})} end},
    {"linear backward's (256, 1024)ᵀ @ (1024, 256): tiles and k blocks", function(x, w) return F.linear(x, w) end,
      function() return {randn({1024, 256}), randn({256, 256})} end},
    {"batched matmul (6, 200, 64) @ (64, 300)ᵀ-view", function(a, b) return a:matmul(b:t()) end,
      function() return {randn({6, 200, 64}), randn({300, 64})} end},
    {"linear (2, 300, 256) with bias", function(x, w, b) return F.linear(x, w, b) end,
      function() return {randn({2, 300, 256}), randn({384, 256}), randn({384})} end},
  }
  for _, b in ipairs(BIG) do
    for _, dt in ipairs({"f32", "f64"}) do
      it(("%s [%s]"):format(b[1], dt), function()
        local function inputs() dtype = dt ember.manual_seed(cases.seed_of(b[1])) return b[3]() end
        check(b[2], inputs, 32768)   -- the default grain: the split real sizes get
        check(b[2], inputs, 1)
      end)
    end
  end

  -- bf16 reductions read runs in place (32 double lanes for sums, a max pass
  -- per 4096 values naming the sub-block of its extreme) and column sums take
  -- eight rows at a time, sixteen columns a step: the same bits
  -- at 1, 2, 3 and 16 threads. Values spread over 2^-40 .. 2^40 so that a sum
  -- in double depends on its order (randn's would be exact in any order).
  local function wide_bf16(shape)
    local e = ember.randint(-40, 41, shape):to("f32")
    return (ember.randn(shape) * ember.pow(2, e)):to("bf16")
  end
  local BF16 = {
    {"sum of 100003", function(x) return x:sum() end, {100003}},
    {"sum over the last dim of (5, 70000)", function(x) return x:sum(-1) end, {5, 70000}},
    {"mean over the last dim of (700, 300)", function(x) return x:mean(-1) end, {700, 300}},
    {"sum over dim 0 of (1000, 300) (column blocks)", function(x) return x:sum(0) end, {1000, 300}},
    {"max over dim 1 of (3, 70000)", function(x) return x:max(1) end, {3, 70000}},
    {"min of 100003", function(x) return x:min() end, {100003}},
    {"amax over the last dim of (700, 300)", function(x) return x:amax(-1) end, {700, 300}},
    {"max over the last dim of (40, 8300) (sub-blocks, two passes a row)", function(x) return x:max(-1) end,
      {40, 8300}},
    {"sum over dim 0 of (300, 1030) (16-column steps)", function(x) return x:sum(0) end, {300, 1030}},
    {"sum over the last dim of (64, 4096)", function(x) return x:sum(-1) end, {64, 4096}},
  }
  for _, b in ipairs(BF16) do
    it(("bf16 %s at 1, 2, 3 and 16 threads"):format(b[1]), function()
      ember.manual_seed(cases.seed_of(b[1]))
      local x = wide_bf16(b[3])
      local function run() return ember.no_grad(function() return {b[2](x)} end) end   -- values (and indices)
      local one = with_threads(1, 32768, run)
      for _, n in ipairs({2, 3, 16}) do
        for _, w in ipairs({32768, 1}) do
          local many = with_threads(n, w, run)
          for i = 1, #one do
            assert_same_bits(one[i], many[i], ("output %d at %d threads, min work %d"):format(i, n, w))
          end
        end
      end
    end)
  end

  -- random fills draw a range of Philox blocks a thread (engine/rng.c,
  -- ops/random.c): element j's draw depends on j only, so the same bits at any
  -- thread count; 10001 elements end in a part block, the dtypes cover the
  -- f64, f32 (Box-Muller in f32) and 16-bit stores and randint's wide draws
  local FILLS = {
    {"randn", function(dt) return ember.randn({10001}, {dtype = dt}) end},
    {"rand", function(dt) return ember.rand({10001}, {dtype = dt}) end},
    {"uniform_(-2, 3)", function(dt) return ember.empty({10001}, {dtype = dt}):uniform_(-2, 3) end},
    {"normal_(1, 2) of a transposed view", function(dt) return ember.empty({101, 99}, {dtype = dt}):t():normal_(1, 2) end},
    {"bernoulli_(0.3)", function(dt) return ember.empty({10001}, {dtype = dt}):bernoulli_(0.3) end},
    {"bernoulli of a probability tensor", function(dt)
      return ember.bernoulli(ember.arange(10001):to("f64"):div(10001):to(dt)) end},
  }
  for _, b in ipairs(FILLS) do
    for _, dt in ipairs({"f64", "f32", "bf16"}) do
      it(("%s [%s] at 1, 2, 3 and 16 threads"):format(b[1], dt), function()
        local function run() ember.manual_seed(cases.seed_of(b[1])) return b[2](dt) end
        local one = with_threads(1, 32768, run)
        for _, n in ipairs({2, 3, 16}) do
          for _, w in ipairs({32768, 1}) do
            assert_same_bits(one, with_threads(n, w, run), ("%d threads, min work %d"):format(n, w))
          end
        end
      end)
    end
  end
  for _, wide in ipairs({false, true}) do
    it(("randint%s at 1, 3 and 16 threads"):format(wide and " over a span above 2^32" or ""), function()
      local function run()
        ember.manual_seed(7)
        return wide and ember.randint(-(1 << 40), 1 << 40, {10001}) or ember.randint(0, 1000, {10001})
      end
      local one = with_threads(1, 32768, run)
      for _, n in ipairs({3, 16}) do assert_same_bits(one, with_threads(n, 1, run), n .. " threads") end
    end)
  end

  it("AdamW and clip_grad_norm over a (300, 700) parameter", function()
    local function steps()
      ember.manual_seed(3)
      local p = ember.randn({300, 700}, {requires_grad = true})
      local opt = ember.optim.AdamW({p}, {lr = 1e-2, weight_decay = 0.1})
      for _ = 1, 2 do
        p.grad = ember.randn({300, 700}) * 100
        ember.nn.utils.clip_grad_norm({p}, 1.0)
        opt:step()
      end
      return p:detach()
    end
    assert_same_bits(with_threads(1, 32768, steps), with_threads(MANY, 1, steps), "parameter after two steps")
  end)
end)

describe("a training step of the tiny TransformerLM", function()
  it("gives the same loss and parameters at 1 and 3 threads", function()
    local function step()
      ember.manual_seed(11)
      local m = ember.nn.TransformerLM(ember.nn.configs.tiny{vocab_size = 97, context_length = 16})
      local opt = ember.optim.AdamW(m:parameters(), {lr = 1e-3})
      local ids = ember.randint(0, 97, {3, 16})
      local loss = F.cross_entropy(m(ids:narrow(1, 0, 15)), ids:narrow(1, 1, 15))
      loss:backward()
      opt:step()
      local r = {loss = loss:detach()}
      for _, np in ipairs(m:named_parameters()) do r[np[1]] = np[2]:detach() end
      return r
    end
    local one = with_threads(1, 32768, step)
    local many = with_threads(MANY, 1, step)
    local n = 0
    for name, t in pairs(one) do
      assert_same_bits(t, many[name], name)
      n = n + 1
    end
    assert.is_true(n > 10)
  end)
end)

-- engine/ops/matmul.c, gemm_merge: a thread's range of adjacent tiles runs as
-- one sgemm a rectangle (on OpenBLAS's SkylakeX and Cooperlake kernels; one
-- call a tile elsewhere). The ranges, so the rectangles, move with the thread
-- count; the bits must not: the train step's products (16 tiles of 128 and of
-- 256, 4 tiles x 4 k-blocks, the LM head's 1 x 16 tiles), odd edges and a
-- batched product, each at 1, 2, 3, 4 and 16 threads against 1 thread.
describe("matmul tiles merged into one BLAS call a range", function()
  local function randn(shape) return ember.randn(shape) end
  local PRODUCTS = {
    {"(1024, 256) @ (256, 256)ᵀ-view: 16 tiles of 128", function() return randn({1024, 256}), randn({256, 256}):t() end},
    {"(1024, 256) @ (1024, 256)ᵀ-view: 16 tiles of 256", function() return randn({1024, 256}), randn({1024, 256}):t() end},
    {"(1024, 1024) @ (1024, 256): 4 tiles x 4 k-blocks", function() return randn({1024, 1024}), randn({1024, 256}) end},
    {"(1024, 256)ᵀ-view @ (1024, 1024): a weight gradient", function() return randn({1024, 256}):t(), randn({1024, 1024}) end},
    {"(1024, 256) @ (2000, 256)ᵀ-view: 1 x 16 tiles", function() return randn({1024, 256}), randn({2000, 256}):t() end},
    {"(1001, 1000)ᵀ-view @ (1001, 999): odd edges", function() return randn({1001, 1000}):t(), randn({1001, 999}) end},
    {"(3, 300, 200) @ (200, 300): tiles in each batch", function() return randn({3, 300, 200}), randn({200, 300}) end},
  }
  for _, pr in ipairs(PRODUCTS) do
    it(pr[1] .. " at 1, 2, 3, 4 and 16 threads", function()
      ember.manual_seed(cases.seed_of(pr[1]))
      local a, b = pr[2]()
      local function run() return a:matmul(b) end
      local one = with_threads(1, 32768, run)
      for _, n in ipairs({2, 3, 4, 16}) do
        assert_same_bits(one, with_threads(n, 32768, run), ("%d threads"):format(n))
      end
    end)
  end

  it("EMBER_CPU_GEMM_MERGE=1 (a call a rectangle of tiles) gives the bits of 0 and other values are refused", function()
    local H = dofile(here .. "helpers.lua")
    local script = H.temp(".lua")
    H.spit(script, [[
      local e = require 'ember'
      e.manual_seed(5)
      local x, w, g = e.randn({1024, 256}), e.randn({1024, 256}), e.randn({1024, 1024})
      e.save(arg[1], {y = x:matmul(w:t()), gx = g:matmul(w), gw = g:t():matmul(x), small = x:matmul(x:t():narrow(1, 0, 256))})]])
    local files = {}
    -- merged (opt-in) at 2, 3 and 16 threads: the rectangles move with the thread count, the bits must not
    local runs = {{"0", "3"}, {"1", "2"}, {"1", "3"}, {"1", "16"}}
    for _, r in ipairs(runs) do
      local path = H.temp(".safetensors")
      local _, err = H.ember({"run", script, path}, {env = {EMBER_CPU_GEMM_MERGE = r[1], EMBER_NUM_THREADS = r[2]}})
      assert.are.equal("", err or "", "mode " .. r[1] .. ", " .. r[2] .. " threads")
      files[#files + 1] = H.slurp(path)
    end
    assert.is_true(#files[1] > 4 * 1024 * 1024, "the products were saved")
    for k = 2, #runs do
      assert.is_true(files[1] == files[k], ("EMBER_CPU_GEMM_MERGE=0 at 3 threads and =%s at %s threads saved different bytes")
        :format(runs[k][1], runs[k][2]))
    end
    local _, err = H.ember({"run", script, H.temp(".safetensors")}, {env = {EMBER_CPU_GEMM_MERGE = "yes"}})
    assert.matches("EMBER_CPU_GEMM_MERGE must be 0 or 1, got 'yes'; using 0", err, 1, true)
    H.remove_temps()
  end)
end)
