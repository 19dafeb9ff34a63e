-- device_spec.lua (GPU) — the CUDA runtime: transfers and dtype conversions
-- (kernels/copy.cu), the caching allocator and its statistics and OOM path
-- (kernels/alloc.cu), streams and events (kernels/stream.cu), pinned memory
-- and non_blocking copies, the device RNG against the CPU stream
-- (kernels/rng.cu) and CUDA graph capture (kernels/graph.cu).
--
-- Copies and conversions are compared with the CPU bit for bit (raw bytes):
-- the device converts exactly as engine/dtype.c does. The RNG is compared bit
-- for bit in f32/bf16/f16/integers (the shared double-precision code of
-- kernels/rng.h, rounded once); f64 within 1e-13 relative (CUDA's and glibc's
-- double log/sin/cos/erf may differ by an ulp or two, see ember/rng.h).
local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../lua/helpers.lua")
local cuda = ember.cuda

assert(cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local MiB = 1024 * 1024
local DTYPES = {"f32", "f64", "bf16", "f16", "i32", "i64", "u16", "u8", "bool"}

-- The raw bytes of a tensor's elements (row-major), through a safetensors file.
local raw_bytes = H.raw_bytes

local function assert_same_bits(got, want, what)
  assert.are.same(want.shape, got.shape, what .. ": shape")
  assert.are.equal(want.dtype, got.dtype, what .. ": dtype")
  local a, b = raw_bytes(got), raw_bytes(want)
  if a ~= b then
    local es = #b // math.max(1, want:numel())
    for i = 1, #b do
      if a:byte(i) ~= b:byte(i) then
        error(("%s: element %d differs (bytes %q vs %q)"):format(what, (i - 1) // es,
          a:sub(i - (i - 1) % es, i - (i - 1) % es + es - 1), b:sub(i - (i - 1) % es, i - (i - 1) % es + es - 1)), 2)
      end
    end
  end
end

-- Values that exercise every conversion rule: fractions (truncation toward
-- zero), ties to even in bf16/f16, negatives (wrap-around in unsigned ints),
-- values beyond i32/u16/u8 and f16's range, +-0, +-inf and NaN.
local SPECIAL = {0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1, -1, 255, 256, 257, -129, 65535, 65536, 70000, -70000,
                 2^31 + 0.5, -2^31 - 3, 1e10, -1e10, 3.14159, 1 + 2^-8, 1 + 3 * 2^-9, 1e-6, 6e-8, 1e300,
                 math.huge, -math.huge, 0 / 0}
local function special_values(dt)
  local f64 = ember.tensor(SPECIAL, {dtype = "f64"})
  if dt == "f64" then return f64 end
  if dt == "f32" or dt == "bf16" or dt == "f16" then return f64:to(dt) end
  -- integers: the same values without NaN/inf, plus a spread of random ones
  local ints = ember.cat({ember.tensor({0, 1, -1, 255, 256, -129, 65535, 65536, 70000, -70000, 2147483647,
                                        -2147483648, 4294967296, -5}, {dtype = "i64"}),
                          ember.randint(-100000, 100000, {50})}, 0)
  return ints:to(dt)
end

describe("copies between the CPU and CUDA", function()
  it("names the device cuda:0", function()
    local x = ember.zeros(2, {device = "cuda"})
    assert.are.equal("cuda:0", x.device)
    assert.is_true(x.is_cuda)
    assert.are.equal(0, cuda.current_device())
    assert.is_true(#cuda.device_name() > 0)
    assert.are.equal("cuda:0", ember.zeros(2, {device = "cuda:0"}):cuda().device)
  end)

  for _, dt in ipairs(DTYPES) do
    it("round-trips " .. dt .. " to cuda and back bit for bit (contiguous and strided)", function()
      local x = special_values(dt)
      local g = x:to("cuda")
      assert.are.equal(dt, g.dtype)
      assert_same_bits(g:cpu(), x, dt .. " contiguous")
      -- a strided CPU source, and a strided CUDA source
      local m = ember.cat({x, x, x, x}, 0):reshape(4, -1)
      assert_same_bits(m:t():to("cuda"):cpu(), m:t():contiguous(), dt .. " transposed upload")
      assert_same_bits(m:to("cuda"):t():cpu(), m:t():contiguous(), dt .. " transposed download")
      assert_same_bits(m:to("cuda"):narrow(1, 1, 3):cpu(), m:narrow(1, 1, 3):contiguous(), dt .. " narrowed download")
      -- into a strided CPU destination
      local dst = ember.zeros(m.shape[2], 4, {dtype = dt}):t()
      dst:copy_(m:to("cuda"))
      assert_same_bits(dst, m, dt .. " into a transposed CPU tensor")
      -- a broadcast source on the device
      local row = x:narrow(0, 0, 5)
      local b = ember.zeros(3, 5, {dtype = dt, device = "cuda"})
      b:copy_(row:to("cuda"))
      assert_same_bits(b:cpu(), row:expand(3, 5):contiguous(), dt .. " broadcast on the device")
    end)
  end

  it("converts every pair of dtypes on the device exactly as the CPU does", function()
    for _, s in ipairs(DTYPES) do
      local x = special_values(s)
      local gx = x:to("cuda")
      local n = x:numel()
      local big = ember.cat({x, x, x, x, x, x, x, x, x, x, x}, 0)        -- vector body + tail
      local gbig = big:to("cuda")
      -- long enough that the contiguous kernel's threads take two vectors (v and v + grid), odd vector count
      local parts = {}
      for i = 1, 39 do parts[i] = big end
      local long = ember.cat(parts, 0)
      local glong = long:to("cuda")
      for _, d in ipairs(DTYPES) do
        assert_same_bits(gx:to(d):cpu(), x:to(d), s .. " -> " .. d .. " on the device")
        assert_same_bits(gbig:to(d):cpu(), big:to(d), s .. " -> " .. d .. " on the device (longer)")
        assert_same_bits(glong:to(d):cpu(), long:to(d), s .. " -> " .. d .. " on the device (two vectors a thread)")
        -- a source that starts one element in (not 16-byte aligned): the unvectorised path
        assert_same_bits(gx:narrow(0, 1, n - 1):to(d):cpu(), x:narrow(0, 1, n - 1):to(d), s .. " -> " .. d .. " misaligned")
        -- conversion while crossing devices, strided on either side
        assert_same_bits(x:to({device = "cuda", dtype = d}):cpu(), x:to(d), s .. " -> " .. d .. " uploading")
        assert_same_bits(gx:to({device = "cpu", dtype = d}), x:to(d), s .. " -> " .. d .. " downloading")
      end
    end
  end)

  it("widens (bf16 -> f32, u8 -> f64, ...) over many blocks, a partial last chunk and a src 8 bytes in", function()
    -- the widening kernel (convert_wide_kernel, EMBER_CAST_WIDE): 1024 dst vectors a block; 2^20 + 4103
    -- elements leave a partial chunk and a scalar tail; narrow(0, 4, ...) moves a 2-byte src 8 bytes in
    -- (8-byte aligned, not 16: still this kernel for bf16 -> f32, whose src vector is 8 bytes)
    local n = (1 << 20) + 4103
    local base = ember.randn({n}):mul(1000)
    for _, p in ipairs({{"bf16", "f32"}, {"f16", "f32"}, {"f32", "f64"}, {"bf16", "f64"}, {"u8", "f32"},
                        {"u8", "f64"}, {"i32", "i64"}, {"u16", "i32"}, {"bool", "f32"}}) do
      local s, d = p[1], p[2]
      local x = (s == "u8" or s == "u16" or s == "i32") and base:abs():to(s) or s == "bool" and base:gt(0) or base:to(s)
      local gx = x:to("cuda")
      assert_same_bits(gx:to(d):cpu(), x:to(d), s .. " -> " .. d .. " (2^20 + 4103)")
      assert_same_bits(gx:narrow(0, 4, n - 9):to(d):cpu(), x:narrow(0, 4, n - 9):to(d), s .. " -> " .. d .. " (4 in)")
    end
  end)

  it("fills CUDA tensors of any strides with the CPU's conversion of the value", function()
    for _, dt in ipairs(DTYPES) do
      for _, v in ipairs {0, 1.5, -3.7, 300, 1e10, 0 / 0} do
        local c = ember.zeros(6, 8, {dtype = dt})
        local g = ember.zeros(6, 8, {dtype = dt, device = "cuda"})
        c:t():narrow(0, 2, 4):fill_(v)
        g:t():narrow(0, 2, 4):fill_(v)
        assert_same_bits(g:cpu(), c, ("%s fill_(%g) strided"):format(dt, v))
        assert_same_bits(ember.full({7, 3}, v, {dtype = dt, device = "cuda"}):cpu(), ember.full({7, 3}, v, {dtype = dt}),
                         ("%s full(%g)"):format(dt, v))
        local a, b = ember.zeros(1003, {dtype = dt}), ember.zeros(1003, {dtype = dt, device = "cuda"})
        a:narrow(0, 1, 1001):fill_(v)                      -- contiguous but not 16-byte aligned
        b:narrow(0, 1, 1001):fill_(v)
        b:narrow(0, 1002, 1):fill_(v)
        a:narrow(0, 1002, 1):fill_(v)
        assert_same_bits(b:cpu(), a, ("%s fill_(%g) unaligned"):format(dt, v))
      end
    end
  end)

  it("copies a large tensor with a permuted layout", function()
    local x = ember.randn(64, 33, 17)
    assert_same_bits(x:to("cuda"):permute(2, 0, 1):contiguous():cpu(), x:permute(2, 0, 1):contiguous(), "permute")
    assert_same_bits(x:to("cuda"):permute(2, 0, 1):to("bf16"):cpu(), x:permute(2, 0, 1):to("bf16"), "permute + bf16")
  end)
end)

describe("the caching allocator", function()
  before_each(function() collectgarbage(); collectgarbage() end)

  it("counts a 64 MiB tensor in allocated and reserved, and forgets it when collected", function()
    local a0, r0 = cuda.memory_allocated(), cuda.memory_reserved()
    local n0 = cuda.memory_stats().num_allocs
    local x = ember.empty(16 * MiB, {device = "cuda"})            -- 64 MiB of f32
    assert.is_true(cuda.memory_allocated() >= a0 + 64 * MiB)
    assert.is_true(cuda.memory_reserved() >= cuda.memory_allocated())
    assert.is_true(cuda.memory_reserved() >= r0)
    assert.are.equal(n0 + 1, cuda.memory_stats().num_allocs)
    assert.is_true(cuda.max_memory_allocated() >= a0 + 64 * MiB)
    x = nil
    collectgarbage(); collectgarbage()
    assert.are.equal(a0, cuda.memory_allocated())
    assert.is_true(cuda.max_memory_allocated() >= a0 + 64 * MiB)   -- the peak remembers
    cuda.reset_peak_memory_stats()
    assert.are.equal(cuda.memory_allocated(), cuda.max_memory_allocated())
    assert.are.equal(cuda.memory_reserved(), cuda.max_memory_reserved())
  end)

  it("reuses a freed block instead of calling cudaMalloc again", function()
    local x = ember.empty(3 * MiB, {device = "cuda"})
    x = nil
    collectgarbage(); collectgarbage()
    local m0 = cuda.memory_stats().num_cuda_mallocs
    local y = ember.empty(3 * MiB, {device = "cuda"})
    assert.are.equal(m0, cuda.memory_stats().num_cuda_mallocs)
    -- small tensors share a 2 MiB segment
    local smalls = {}
    for i = 1, 100 do smalls[i] = ember.empty(100, {device = "cuda"}) end
    assert.is_true(cuda.memory_stats().num_cuda_mallocs <= m0 + 1)
    assert.is_not_nil(y)
  end)

  it("returns fully free segments to the driver on empty_cache", function()
    local x = ember.empty(32 * MiB, {device = "cuda"})           -- 128 MiB, its own segment
    x = nil
    collectgarbage(); collectgarbage()
    local r0, f0 = cuda.memory_reserved(), cuda.memory_stats().num_cuda_frees
    assert.is_true(r0 >= 128 * MiB)
    cuda.empty_cache()
    assert.is_true(cuda.memory_reserved() <= r0 - 128 * MiB)
    assert.is_true(cuda.memory_stats().num_cuda_frees > f0)
  end)

  it("raises a catchable out-of-memory error and keeps working", function()
    local ooms = cuda.memory_stats().num_ooms
    local ok, err = pcall(ember.empty, 1 << 38, {device = "cuda"})  -- 1 TiB of f32
    assert.is_false(ok)
    assert.matches("^out of memory: tried to allocate 1048576%.00 MiB on cuda:0", err)
    assert.matches("free [%d.]+ MiB of [%d.]+ MiB", err)
    assert.are.equal(ooms + 1, cuda.memory_stats().num_ooms)
    local y = ember.ones(1000, {device = "cuda"})
    assert.are.equal(1000, y:cpu():sum():item())
  end)

  it("collects unreachable tensors (a full Lua GC) before giving up", function()
    local chunk = 1024 * MiB                                       -- 4 GiB of f32 each
    local hold, ok = {}, true
    while ok do
      local t
      ok, t = pcall(ember.empty, chunk, {device = "cuda"})
      if ok then hold[#hold + 1] = t end
    end
    assert.is_true(#hold >= 2)
    hold = nil                                                     -- garbage, but not yet collected
    collectgarbage("stop")
    local ok2, t2 = pcall(ember.empty, chunk, {device = "cuda"})
    collectgarbage("restart")
    assert.is_true(ok2, tostring(t2))
    t2 = nil
    collectgarbage(); collectgarbage()
    cuda.empty_cache()
  end)
end)

describe("streams and events", function()
  it("times a large fill with events on a side stream", function()
    local x = ember.empty(64 * MiB, {device = "cuda"})           -- 256 MiB
    local s = cuda.Stream()
    local t0, t1 = cuda.Event{enable_timing = true}, cuda.Event{enable_timing = true}
    local default = cuda.current_stream()
    cuda.stream(s, function()
      assert.are.equal(s, cuda.current_stream())
      t0:record()
      for i = 1, 5 do x:fill_(i) end
      t1:record()
    end)
    assert.are.equal(default, cuda.current_stream())
    t1:synchronize()
    assert.is_true(t1:query())
    local ms = t0:elapsed_time(t1)
    assert.is_true(ms > 0, "elapsed_time " .. ms)
    s:synchronize()
    assert.are.equal(5, x:narrow(0, 64 * MiB - 1, 1):item())
  end)

  it("orders two streams with wait_event", function()
    local x = ember.zeros(16 * MiB, {device = "cuda"})
    local a, b = cuda.Stream(), cuda.Stream()
    local e = cuda.Event()
    cuda.stream(a, function() for i = 1, 20 do x:fill_(i) end; e:record(a) end)
    b:wait_event(e)
    local y
    cuda.stream(b, function() y = x:to("f64") end)
    b:synchronize()
    assert.are.equal(20, y:narrow(0, 16 * MiB - 1, 1):item())
  end)

  it("restores the current stream when the function fails", function()
    local s, default = cuda.Stream(), cuda.current_stream()
    local ok, err = pcall(cuda.stream, s, function() error("boom") end)
    assert.is_false(ok)
    assert.matches("boom", err)
    assert.are.equal(default, cuda.current_stream())
  end)

  it("rejects elapsed_time on events without timing", function()
    local a, b = cuda.Event(), cuda.Event()
    a:record(); b:record(); b:synchronize()
    assert.has_error(function() a:elapsed_time(b) end,
      "ember.Event.elapsed_time: both events must be created with enable_timing=true")
  end)
end)

describe("pinned memory", function()
  it("pins a CPU tensor and copies it with non_blocking", function()
    local x = ember.randn(1000, 37)
    assert.is_false(x:is_pinned())
    local p = x:pin_memory()
    assert.is_true(p:is_pinned())
    assert_same_bits(p, x, "pinned copy")
    local g = p:to({device = "cuda", non_blocking = true})
    local h = ember.empty(1000, 37):pin_memory()
    cuda.synchronize()
    h:copy_(g)
    assert_same_bits(h, x, "pinned round trip")
    local gb = p:to({device = "cuda", dtype = "bf16", non_blocking = true})
    cuda.synchronize()
    assert_same_bits(gb:cpu(), x:to("bf16"), "non_blocking with conversion")
    -- copy_ with non_blocking: into an existing device tensor, with a dtype change on the device
    local ids = ember.randint(0, 60000, {64, 129}):to("u16"):pin_memory()
    local dst = ember.empty({64, 129}, {dtype = "i64", device = "cuda"})
    dst:copy_(ids, {non_blocking = true})
    cuda.synchronize()
    assert.same(ids:to("i64"):tolist(), dst:cpu():tolist())
    -- downloads into a pinned tensor without waiting, then after synchronize
    local back = g:to({device = "cpu", dtype = "f64", non_blocking = true})
    cuda.synchronize()
    assert_same_bits(back, x:to("f64"), "download")
  end)
end)

describe("the device RNG", function()
  local N = 4099    -- not a multiple of 4: the last Philox block is partial

  local function both(seed, make)
    ember.manual_seed(seed)
    local g = make("cuda")
    local after_g = ember.get_rng_state().offset
    ember.manual_seed(seed)
    local c = make("cpu")
    assert.are.equal(ember.get_rng_state().offset, after_g)
    return g, c
  end

  for _, dt in ipairs {"f32", "bf16", "f16"} do
    it("draws rand, randn, normal_, uniform_ and trunc_normal_ in " .. dt .. " bit for bit as the CPU", function()
      for _, case in ipairs {
        {"rand", function(dev) return ember.rand({N}, {dtype = dt, device = dev}) end},
        {"randn", function(dev) return ember.randn({7, N}, {dtype = dt, device = dev}) end},
        {"normal_", function(dev) return ember.empty(N, {dtype = dt, device = dev}):normal_(1.5, 3) end},
        {"uniform_", function(dev) return ember.empty(N, {dtype = dt, device = dev}):uniform_(-2, 5) end},
        {"trunc_normal_", function(dev) return ember.empty(N, {dtype = dt, device = dev}):trunc_normal_(0, 0.02, -0.04, 0.04) end},
        {"trunc_normal_ wide", function(dev) return ember.empty(N, {dtype = dt, device = dev}):trunc_normal_(1, 2, -5, 7) end},
        {"uniform_ into a view one element off 16-byte alignment (the per-element path)", function(dev)
          local t = ember.zeros(N + 1, {dtype = dt, device = dev})
          t:narrow(0, 1, N):uniform_(-1, 1)
          return t
        end},
        {"normal_ on a transposed view", function(dev)
          local t = ember.zeros(33, 65, {dtype = dt, device = dev})
          t:t():narrow(0, 3, 60):normal_(0, 1)
          return t
        end},
      } do
        for seed = 0, 2 do
          local g, c = both(seed * 7919 + 1, case[2])
          assert_same_bits(g:cpu(), c, ("%s %s seed %d"):format(case[1], dt, seed))
        end
      end
    end)
  end

  it("draws normal_ and randn over 2^20 + 3 values bit for bit as the CPU (f32 Box-Muller, no libm)", function()
    -- the f32 path's log/sincos are + - * / sqrt only, kept unfused on the
    -- device (__fmul_rn/__fadd_rn): any contraction would show here
    local n = (1 << 20) + 3
    for _, case in ipairs {
      {"normal_(1, 2) f32", function(dev) return ember.empty(n, {device = dev}):normal_(1, 2) end},
      {"randn bf16", function(dev) return ember.randn({n}, {dtype = "bf16", device = dev}) end},
      {"normal_ f16 into a view off alignment", function(dev)
        local t = ember.zeros(n + 1, {dtype = "f16", device = dev})
        t:narrow(0, 1, n):normal_(0, 0.5)
        return t
      end},
    } do
      local g, c = both(2026, case[2])
      assert_same_bits(g:cpu(), c, case[1])
    end
  end)

  it("draws randn and trunc_normal_ in f64 within an ulp or two of the CPU", function()
    for _, make in ipairs {
      function(dev) return ember.randn({N}, {dtype = "f64", device = dev}) end,
      function(dev) return ember.empty(N, {dtype = "f64", device = dev}):trunc_normal_(0, 1, -2, 2) end,
      function(dev) return ember.rand({N}, {dtype = "f64", device = dev}) end,
    } do
      local g, c = both(123, make)
      local rel = (g:cpu() - c):abs():max():item() / c:abs():max():item()
      assert.is_true(rel <= 1e-13, "relative difference " .. rel)
    end
  end)

  it("draws randint bit for bit, narrow and wide spans, every integer dtype", function()
    for _, case in ipairs {
      {0, 10, "i64"}, {-5, 5, "i32"}, {0, 256, "u8"}, {0, 65536, "u16"}, {0, 2, "bool"},
      {-(1 << 40), 1 << 41, "i64"}, {0, 1000, "f32"},
    } do
      local g, c = both(99, function(dev)
        return ember.randint(case[1], case[2], {3, 1001}, {dtype = case[3], device = dev})
      end)
      assert_same_bits(g:cpu(), c, ("randint [%d, %d) %s"):format(case[1], case[2], case[3]))
    end
  end)
end)

describe("CUDA graphs", function()
  local has_mul = pcall(function() return ember.ones(2, {device = "cuda"}):mul(2):add(1) end)

  it("replays copies and conversions with new data in the static input", function()
    local x = ember.zeros(1000, 3, {device = "cuda"})
    local g, y, z = cuda.graph(function()
      local y = x:t():contiguous()                     -- allocated in the graph's private pool
      local z = x:to("bf16")
      return y, z
    end, {warmup = 1})
    assert.is_not_nil(g)
    local new
    for step = 1, 3 do
      new = ember.randn(1000, 3)
      x:copy_(new)
      local before = cuda.memory_stats().num_allocs
      g:replay()
      assert.are.equal(before, cuda.memory_stats().num_allocs)
      cuda.synchronize()
      assert_same_bits(y:cpu(), new:t():contiguous(), "y after replay " .. step)
      assert_same_bits(z:cpu(), new:to("bf16"), "z after replay " .. step)
    end
    g:close()
    assert_same_bits(y:cpu(), new:t():contiguous(), "outputs stay readable after close")
  end)

  if has_mul then
    it("replays a few elementwise ops", function()
      local x = ember.zeros(4096, {device = "cuda"})
      local g, out = cuda.graph(function() return x:mul(2):add(1):mul(x) end)
      for _ = 1, 2 do
        local new = ember.randn(4096)
        x:copy_(new)
        g:replay()
        cuda.synchronize()
        assert_same_bits(out:cpu(), new:mul(2):add(1):mul(new), "elementwise replay")
      end
      g:close()
    end)
  end

  it("fails loudly on a host sync inside the capture, naming the op and the line, and recovers", function()
    local s1 = ember.zeros(1, {device = "cuda"})
    local line
    local ok, err = pcall(cuda.graph, function()
      s1:fill_(3)
      line = debug.getinfo(1, "l").currentline + 1
      local v = s1:item()
      return v
    end, {warmup = 1})                                   -- the warm-up runs eagerly and succeeds
    assert.is_false(ok)
    assert.matches("graph capture", err)
    assert.matches("item", err)
    assert.matches("device_spec%.lua:" .. line, err)
    -- everything works afterwards: no capture left open, the default stream is current again
    cuda.synchronize()
    assert.are.equal(3, s1:item())
    local g, y = cuda.graph(function() return s1:to("f64") end, {warmup = 0})
    g:replay()
    cuda.synchronize()
    assert.are.equal(3, y:item())
    g:close()
  end)

  it("rejects an allocation from another stream during capture", function()
    local s = cuda.Stream()
    local ok, err = pcall(cuda.graph, function()
      cuda.stream(s, function() return ember.empty(10, {device = "cuda"}) end)
    end, {warmup = 0})
    assert.is_false(ok)
    assert.matches("stream other than the capturing one", err)
    cuda.synchronize()
  end)

  it("rejects synchronize inside the capture", function()
    local ok, err = pcall(cuda.graph, function() cuda.synchronize() end, {warmup = 0})
    assert.is_false(ok)
    assert.matches("synchronize: cannot run during CUDA graph capture", err)
  end)

  it("gives the private pool's memory back once the graph and its outputs are gone", function()
    collectgarbage(); collectgarbage()
    local x = ember.zeros(8 * MiB, {device = "cuda"})            -- 32 MiB
    local a0 = cuda.memory_allocated()
    local g, y = cuda.graph(function() return x:to("f64") end, {warmup = 0})
    assert.is_true(cuda.memory_allocated() >= a0 + 64 * MiB)
    local r_with = cuda.memory_reserved()
    g:close()
    y = nil
    g = nil
    collectgarbage(); collectgarbage()
    assert.are.equal(a0, cuda.memory_allocated())
    assert.is_true(cuda.memory_reserved() <= r_with - 64 * MiB)
  end)
end)
