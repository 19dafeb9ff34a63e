-- random_fill_spec.lua (GPU) — the vector paths of the CUDA random kernels
-- against the CPU's stream, bit for bit (raw bytes): the contiguous fills of
-- kernels/rng.cu (B = 2 or 4 Philox blocks a thread, 16-byte stores, bf16/f16
-- rounded in pairs by cvt.rn.{bf16x2,f16x2}.f32), dropout (kernels/dropout.cu:
-- 8 elements a thread, the keep test in integers) and bernoulli
-- (kernels/random.cu: 16 bytes of output a thread, probabilities read as
-- vectors in their own dtype and compared in f32).
--
-- Sizes sit around each kernel's per-thread edges (4, 8, 16 elements; a
-- full 256-thread block), odd tails, views that start off the 16-byte
-- alignment (the per-element and scalar-tail paths) or on it (a vector path
-- from an offset pointer), and a generator offset that is not a multiple of
-- the per-thread block count (the first counter of a thread is then odd).
local ember = require "ember"
local F = ember.nn.functional
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../lua/helpers.lua")

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local SIZES = {1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 2048 + 5, 8 * 256 * 3 + 11}

local function assert_same_bits(got, want, what)
  assert.are.same(want.shape, got.shape, what .. ": shape")
  assert.are.equal(want.dtype, got.dtype, what .. ": dtype")
  local a, b = H.raw_bytes(got), H.raw_bytes(want)
  if a ~= b then
    local es = #b // math.max(1, want:numel())
    for i = 1, #b do
      if a:byte(i) ~= b:byte(i) then
        error(("%s: element %d of %d differs (bytes %q, expected %q)"):format(what, (i - 1) // es, want:numel(),
          a:sub(i - (i - 1) % es, i - (i - 1) % es + es - 1), b:sub(i - (i - 1) % es, i - (i - 1) % es + es - 1)), 2)
      end
    end
  end
end

-- from_state(start, make): start() sets the generator before each device's
-- make(dev); the two results (CUDA's copied back) after checking that both
-- end at the same offset.
local function from_state(start, make)
  local out = {}
  for _, dev in ipairs {"cuda", "cpu"} do
    start()
    out[dev] = make(dev)
    out[dev .. "_offset"] = ember.get_rng_state().offset
  end
  assert.are.equal(out.cpu_offset, out.cuda_offset, "generator offset after the op")
  return out.cuda:cpu(), out.cpu
end

-- make(dev) on both devices from the same generator state, the state first
-- advanced by `skip` blocks (draws of skip * 4 elements), so the op's first
-- counter is ctr0 = skip; the generator must end at the same offset.
local function both(seed, skip, make)
  return from_state(function()
    ember.manual_seed(seed)
    if skip > 0 then ember.rand(skip * 4) end
  end, make)
end

describe("contiguous random fills on CUDA (kernels/rng.cu)", function()
  for _, dt in ipairs {"f32", "bf16", "f16", "f64"} do
    it(dt .. ": uniform_, rand, normal_, trunc_normal_ at every per-thread edge, bit for bit as the CPU", function()
      local fills = {
        {"uniform_(-2, 3)", function(t) return t:uniform_(-2, 3) end},
        {"uniform_(0, 1)", function(t) return t:uniform_(0, 1) end},
        {"normal_(1, 2)", function(t) return t:normal_(1, 2) end},
        {"trunc_normal_", function(t) return t:trunc_normal_(0, 1, -2, 2) end},
      }
      for _, n in ipairs(SIZES) do
        for _, f in ipairs(fills) do
          for _, skip in ipairs {0, 1, 3} do
            local g, c = both(n * 31 + skip, skip, function(dev) return f[2](ember.empty(n, {dtype = dt, device = dev})) end)
            local what = ("%s %s n=%d skip=%d"):format(f[1], dt, n, skip)
            if dt == "f64" and f[1] ~= "uniform_(-2, 3)" and f[1] ~= "uniform_(0, 1)" then
              -- normal_/trunc_normal_ in double go through the libraries' log/sin/cos/erf (ember/rng.h)
              local rel = (g - c):abs():max():item() / math.max(c:abs():max():item(), 1e-300)
              assert.is_true(rel <= 1e-13, what .. ": relative difference " .. rel)
            else
              assert_same_bits(g, c, what)
            end
          end
        end
      end
    end)

    it(dt .. ": fills into views on and off the 16-byte alignment", function()
      local es = ({f32 = 4, bf16 = 2, f16 = 2, f64 = 8})[dt]
      local aligned = 16 // es                      -- an element offset that keeps 16-byte alignment
      for _, off in ipairs {1, 2, 3, aligned, aligned + 1} do
        for _, n in ipairs {7, 8, 33, 1000} do
          local g, c = both(off * 1000 + n, 1, function(dev)
            local t = ember.zeros(n + off + 5, {dtype = dt, device = dev})
            t:narrow(0, off, n):uniform_(-1, 1)
            -- a second fill over the first: the next op's counters (f64 normal_ goes through libm: bits
            -- may differ by an ulp, so f64 draws a second uniform_ instead)
            if dt == "f64" then t:narrow(0, off, n):uniform_(0, 1) else t:narrow(0, off, n):normal_(0.5, 3) end
            return t
          end)
          assert_same_bits(g, c, ("%s view at %d, n=%d"):format(dt, off, n))
        end
      end
    end)
  end

  it("bf16/f16 uniform_(0, 1) and uniform_(-1, 1) over 2^20 + 5 draws: values rounded to hi become lo on both", function()
    -- in bf16 about 2^-9 of the uniform_(0, 1) draws round to 1 and must be replaced by 0
    for _, dt in ipairs {"bf16", "f16"} do
      for _, lohi in ipairs {{0, 1}, {-1, 1}, {2, 2.5}} do
        local g, c = both(7, 2, function(dev)
          return ember.empty((1 << 20) + 5, {dtype = dt, device = dev}):uniform_(lohi[1], lohi[2])
        end)
        assert_same_bits(g, c, ("uniform_(%g, %g) %s"):format(lohi[1], lohi[2], dt))
        assert.is_true(g:to("f32"):max():item() < lohi[2], "every value below hi")
      end
    end
  end)

  it("bf16/f16 fills whose f32 values overflow or are NaN: the CPU's bits (the NaN-checked packing)", function()
    -- std 1e39 is infinite in f32: inf * 0 (a zero r cos) is NaN; uniform_ over +-1e300 overflows f32 to +-inf
    -- without NaN, and over +-1.7e308 its hi - lo is infinite in double
    for _, dt in ipairs {"bf16", "f16"} do
      for _, f in ipairs {
        {"normal_(0, 1e39)", function(t) return t:normal_(0, 1e39) end},
        {"normal_(3e38, 1)", function(t) return t:normal_(3e38, 1) end},
        {"uniform_(-1e300, 1e300)", function(t) return t:uniform_(-1e300, 1e300) end},
        {"uniform_(-1.7e308, 1.7e308)", function(t) return t:uniform_(-1.7e308, 1.7e308) end},
      } do
        for _, n in ipairs {33, 4099} do
          local g, c = both(n + 5, 1, function(dev) return f[2](ember.empty(n, {dtype = dt, device = dev})) end)
          assert_same_bits(g, c, ("%s %s n=%d"):format(f[1], dt, n))
        end
      end
    end
  end)

  it("uniform_ with lo == hi fills the constant; f32 uniform_ with a hi not exact in f32", function()
    local g, c = both(3, 0, function(dev) return ember.empty(1001, {dtype = "bf16", device = dev}):uniform_(2, 2) end)
    assert_same_bits(g, c, "uniform_(2, 2)")
    assert.are.equal(2, g:to("f32"):min():item())
    g, c = both(4, 0, function(dev) return ember.empty(4099, {device = dev}):uniform_(0, 0.1) end)
    assert_same_bits(g, c, "uniform_(0, 0.1) f32")
  end)

  it("uniform_ in one FFMA where lo and hi - lo are exact in f32 and the double sum is exact, else in double", function()
    -- one FFMA (kernels/rng.cu, uniform_f32_exact): (-2, 3), (-0, 0), (1.5, 1.75)
    -- (hi exact in bf16: the [lo, hi) rule), 2^-100 and 2^100 scales, (1, 2^24); in double: hi - lo or lo
    -- not exact in f32 (0.1, 1e-7), or a sum of more than 53 bits (2^40 + 1.5 u, 2^-120 + 2^-120 u: span 2^-24
    -- below f32's normals)
    local cases = {{-2, 3}, {-0.0, 0}, {1.5, 1.75}, {-2 ^ -100, 2 ^ -100}, {2 ^ 100, 2 ^ 101}, {1, 2 ^ 24},
                   {0.1, 0.2}, {-7, 1e-7}, {2 ^ 40, 2 ^ 40 + 1.5}, {2 ^ -120, 2 ^ -119}, {-65504, 65504}}
    for _, dt in ipairs {"f32", "bf16", "f16"} do
      for _, lohi in ipairs(cases) do
        for _, n in ipairs {33, 4099 * 4} do
          local g, c = both(n + 11, 3, function(dev)
            return ember.empty(n, {dtype = dt, device = dev}):uniform_(lohi[1], lohi[2])
          end)
          assert_same_bits(g, c, ("uniform_(%a, %a) %s n=%d"):format(lohi[1], lohi[2], dt, n))
        end
      end
    end
  end)
end)

describe("dropout on CUDA at the per-thread edges (kernels/dropout.cu)", function()
  for _, dt in ipairs {"f32", "bf16", "f16", "f64"} do
    it(dt .. ": p in {0, 0.1, 0.5, 1}, every size edge and unaligned inputs, the CPU's mask and values", function()
      for _, n in ipairs(SIZES) do
        for _, p in ipairs {0, 0.1, 0.5, 1} do
          local x = ember.randn(n + 3):to(dt)
          for _, off in ipairs {0, 1} do
            local g, c = both(n + off, off * 3, function(dev)
              return F.dropout(x:to(dev):narrow(0, off, n), p)
            end)
            assert_same_bits(g, c, ("dropout %s n=%d p=%g offset %d"):format(dt, n, p, off))
          end
        end
      end
    end)
  end

  it("p just beside a multiple of 2^-24 keeps exactly the CPU's elements", function()
    -- the keep threshold is ceil((1 - p) 2^24): (1 - p) at, just above and just below a grid point
    local x = ember.ones(1 << 16)
    for _, p in ipairs {0.25, 0.25 + 2^-40, 0.25 - 2^-40, 1 - 2^-24, 2^-24, 1e-300} do
      local g, c = both(11, 1, function(dev) return F.dropout(x:to(dev), p) end)
      assert_same_bits(g, c, ("dropout p=%.17g"):format(p))
    end
  end)
end)

describe("bernoulli on CUDA at the per-thread edges (kernels/random.cu)", function()
  it("probabilities of every float dtype into outputs of every width, every size edge, bit for bit", function()
    for _, n in ipairs(SIZES) do
      local p = ember.rand(n)
      for _, pdt in ipairs {"f32", "bf16", "f16", "f64"} do
        for _, odt in ipairs {"f32", "bf16", "u8", "bool", "i64"} do
          local g, c = both(n, 1, function(dev)
            return ember.zeros(n, {dtype = odt, device = dev}):bernoulli_(p:to(pdt):to(dev))
          end)
          assert_same_bits(g, c, ("bernoulli_ p %s into %s, n=%d"):format(pdt, odt, n))
        end
        local g, c = both(n + 1, 0, function(dev) return ember.bernoulli(p:to(pdt):to(dev)) end)
        assert_same_bits(g, c, ("bernoulli(p) %s, n=%d"):format(pdt, n))
      end
    end
  end)

  it("probabilities on and off the grid of u (m 2^-24), 0, 1, and exactly at u's values", function()
    -- p_j = k 2^-24 compares u < p strictly: an f32 compare of exact values must give the CPU's f64 answer
    local n = 4096
    local vals = {}
    for i = 1, n do vals[i] = ((i * 2654435761) % (1 << 24)) * 2^-24 end
    vals[1], vals[2], vals[3] = 0, 1, 1 - 2^-24
    local p = ember.tensor(vals, {dtype = "f64"})
    for _, pdt in ipairs {"f32", "f64"} do
      local g, c = both(5, 0, function(dev) return ember.bernoulli(p:to(pdt):to(dev)) end)
      assert_same_bits(g, c, "bernoulli on the grid, p " .. pdt)
    end
  end)

  it("a constant p (0, 0.3, 1, beside a grid point) into views and unaligned outputs", function()
    for _, pc in ipairs {0, 0.3, 1, 0.5 + 2^-40} do
      for _, odt in ipairs {"f32", "bf16", "u8"} do
        for _, off in ipairs {0, 1, 16} do
          local g, c = both(off + 2, 1, function(dev)
            local t = ember.zeros(1000 + off, {dtype = odt, device = dev})
            t:narrow(0, off, 1000):bernoulli_(pc)
            return t
          end)
          assert_same_bits(g, c, ("bernoulli_(%.17g) %s offset %d"):format(pc, odt, off))
        end
        local g, c = both(9, 0, function(dev) return ember.zeros(37, 29, {dtype = odt, device = dev}):t():bernoulli_(pc) end)
        assert_same_bits(g, c, ("bernoulli_(%.17g) %s transposed"):format(pc, odt))
      end
    end
  end)

  it("probabilities from an unaligned view (the scalar loads) and broadcast", function()
    local base = ember.rand(1030)
    for _, pdt in ipairs {"f32", "bf16"} do
      local g, c = both(13, 0, function(dev) return ember.bernoulli(base:to(pdt):to(dev):narrow(0, 3, 1027)) end)
      assert_same_bits(g, c, "bernoulli of a narrowed " .. pdt .. " view")
    end
    local row = ember.rand(33)
    local g, c = both(14, 0, function(dev) return ember.zeros(17, 33, {device = dev}):bernoulli_(row:to(dev)) end)
    assert_same_bits(g, c, "bernoulli_ with a broadcast row of p")
  end)
end)

describe("Philox runs across a multiple of 2^32 counters (rng_math.h em_philox_run)", function()
  -- A thread's B consecutive blocks share their first rounds' products only while the counters' high word is
  -- the same; a run that crosses 2^32 (the generator offset set just below it) takes the plain blocks. Both,
  -- in every kernel that draws B blocks a thread, against the CPU.
  local function at(offset, make)
    return from_state(function() ember.set_rng_state({seed = 91, offset = offset}) end, make)
  end
  local x = ember.randn(4099)
  local p = ember.rand(4099)
  local ops = {
    {"uniform_(-2, 3) bf16", function(dev) return ember.empty(4099, {dtype = "bf16", device = dev}):uniform_(-2, 3) end},
    {"uniform_(-2, 3) f32", function(dev) return ember.empty(4099, {device = dev}):uniform_(-2, 3) end},
    {"uniform_(0, 0.1) f32", function(dev) return ember.empty(4099, {device = dev}):uniform_(0, 0.1) end},
    {"normal_(1, 2) f32", function(dev) return ember.empty(4099, {device = dev}):normal_(1, 2) end},
    {"normal_(1, 2) bf16", function(dev) return ember.empty(4099, {dtype = "bf16", device = dev}):normal_(1, 2) end},
    {"bernoulli_(0.3) bf16", function(dev) return ember.zeros(4099, {dtype = "bf16", device = dev}):bernoulli_(0.3) end},
    {"bernoulli_(0.3) u8", function(dev) return ember.zeros(4099, {dtype = "u8", device = dev}):bernoulli_(0.3) end},
    {"bernoulli(p) f32", function(dev) return ember.bernoulli(p:to(dev)) end},
    {"dropout bf16", function(dev) return F.dropout(x:to("bf16"):to(dev), 0.3) end},
    {"dropout f32", function(dev) return F.dropout(x:to(dev), 0.3) end},
  }
  for _, off in ipairs {(1 << 32) - 1, (1 << 32) - 2, (1 << 32) - 3, (1 << 32) - 6, (1 << 33) - 4} do
    it(("offset 0x%x"):format(off), function()
      for _, op in ipairs(ops) do
        local g, c = at(off, op[2])
        assert_same_bits(g, c, ("%s at offset %d"):format(op[1], off))
      end
    end)
  end
end)
