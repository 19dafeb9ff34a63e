-- ew_stream_spec.lua — the CPU elementwise loop's streamed outputs (issue 17,
-- engine/ops/ew_nt.c, ew_half.c, elementwise.c): f32 and bf16 add/sub/mul/div
-- computed and written line by line with non-temporal stores, where and
-- masked_fill into f32 as a raw 32-bit select, and the EMBER_CPU_PIECE_OUT
-- switch (0: CHUNK a call, 1: a stream piece a call, 2: the fused loops).
-- Every path must give the bits the 1-thread, regular-store run gives, NaN
-- payloads included (bits are compared, not values): a NaN with a NaN goes
-- back to the generic loop, and a select copies a float's bits untouched.
--
-- Run: EMBER_BUILD=build-cpu build-cpu/ember run $(command -v busted) tests/lua/ew_stream_spec.lua

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local bits, from_bits = H.bits, H.from_bits

local function assert_same_bits(got, want, what)
  assert.are.equal(want.dtype, got.dtype, what .. ": dtype")
  assert.are.same(want.shape, got.shape, what .. ": shape")
  local g, w = bits(got), bits(want)
  for i = 1, #w do
    if g[i] ~= w[i] then
      error(("%s: element %d is 0x%x, expected 0x%x (%d elements)"):format(what, i - 1, g[i], w[i], #w), 2)
    end
  end
end

--- fn() with n threads, streaming stores for every output (stream 0) or none (-1).
local function with(n, stream, fn)
  local pn, pw, ps = ember.get_num_threads(), ember.set_parallel_min_work(1), ember.set_stream_min(stream)
  ember.set_num_threads(n)
  local ok, r = pcall(fn)
  ember.set_num_threads(pn); ember.set_parallel_min_work(pw); ember.set_stream_min(ps)
  if not ok then error(r, 0) end
  return r
end

--- Random patterns with NaNs (quiet and signalling, both signs, payloads) at
-- about one element in `every`; the rest ordinary values of the dtype.
local function patterns(dtype, n, seed, every)
  local R = H.seeded(seed)
  local vals = bits(R.randn({n}, dtype))
  local nans = dtype == "f32" and {0x7fc00001, 0xffc00002, 0x7f800003, 0xff812345, 0x7fffffff}
                               or {0x7fc1, 0xffc2, 0x7f81, 0xff83, 0x7fff}
  local x = seed
  for i = 1, n do
    x = (x * 1103515245 + 12345) % 2147483648
    if x % every == 0 then vals[i] = nans[x // every % #nans + 1] end
  end
  return vals
end

-- (rows, cols): 3 rows of 4103 values put each row at a different alignment
-- (a line is 16 f32 or 32 bf16 values), and a row spans several stream pieces.
local ROWS, COLS = 3, 4103

describe("streamed add/sub/mul/div (fused line-by-line loops)", function()
  for _, dt in ipairs({"f32", "bf16"}) do
    for _, every in ipairs({1000000007, 97}) do   -- no NaN at all; NaN pairs in some pieces
      it(("give the 1-thread regular-store bits, %s, %s"):format(dt, every > 1000 and "no NaN" or "with NaN pairs"), function()
        local n = ROWS * COLS
        local a = from_bits(dt, {ROWS, COLS}, patterns(dt, n, 11, every))
        local b = from_bits(dt, {ROWS, COLS}, patterns(dt, n, 23, every))
        local row = from_bits(dt, {COLS}, patterns(dt, COLS, 37, every // 3 + 1))
        local cases = {
          {"plain", function(op) return a[op](a, b) end},
          {"broadcast row", function(op) return a[op](a, row) end},
          {"row first", function(op) return row[op](row, a) end},
          {"offset views", function(op) return a:narrow(1, 1, COLS - 2)[op](a:narrow(1, 1, COLS - 2), b:narrow(1, 2, COLS - 2)) end},
          {"a number", function(op) return a[op](a, 0.75) end},
        }
        for _, op in ipairs({"add", "sub", "mul", "div"}) do
          for _, c in ipairs(cases) do
            local one = with(1, -1, function() return c[2](op) end)
            local streamed = with(3, 0, function() return c[2](op) end)
            assert_same_bits(streamed, one, ("%s %s %s, 3 threads streamed"):format(dt, op, c[1]))
          end
        end
      end)
    end
  end
end)

describe("a bf16 row broadcast over many rows (widened once a call)", function()
  -- 4096 columns: every row's output starts on a line, so every row takes the
  -- fused loop with the widened row; 3-d too, the row broadcast over two dims
  for _, every in ipairs({1000000007, 97}) do
    it(("gives the 1-thread regular-store bits, %s"):format(every > 1000 and "no NaN" or "with NaN pairs"), function()
      local R, C = 9, 4096
      local a = from_bits("bf16", {R, C}, patterns("bf16", R * C, 41, every))
      local row = from_bits("bf16", {C}, patterns("bf16", C, 43, every // 3 + 1))
      local a3 = a:reshape({3, 3, C})
      for _, op in ipairs({"add", "sub", "mul", "div"}) do
        for _, c in ipairs({{"row second", function() return a[op](a, row) end},
                            {"row first", function() return row[op](row, a) end},
                            {"3-d", function() return a3[op](a3, row) end}}) do
          local one = with(1, -1, c[2])
          for _, n in ipairs({1, 2, 3}) do
            assert_same_bits(with(n, 0, c[2]), one, ("bf16 %s %s, %d threads streamed"):format(op, c[1], n))
          end
        end
      end
    end)
  end

  it("EMBER_CPU_ROW_WIDEN=0 gives the same bits and other values are refused", function()
    local script = H.temp(".lua")
    H.spit(script, [[
      local e = require 'ember'
      e.set_stream_min(0)
      e.manual_seed(7)
      local a, r = e.randn({8, 4096}):to('bf16'), e.randn({4096}):to('bf16')
      local h = {}
      for _, t in ipairs({a + r, r - a, a * r, r / a}) do
        local x = 2166136261   -- FNV-1a over every value's bits
        for _, v in ipairs(t:float():reshape({-1}):tolist()) do
          for k = 1, 8 do x = ((x ~ string.byte(string.pack('<d', v), k)) * 16777619) & 0xffffffff end
        end
        h[#h + 1] = ('%08x'):format(x)
      end
      io.write(table.concat(h, ';'))]])
    H.switch_agrees(script, "EMBER_CPU_ROW_WIDEN", {"0", "1"}, "3", 20)
    H.switch_refuses(script, "EMBER_CPU_ROW_WIDEN", "yes",
      "EMBER_CPU_ROW_WIDEN must be 0 or 1, got 'yes'; using 1")
    H.remove_temps()
  end)

  it("EMBER_CPU_NT_SPAN=0 (a stream piece a call) gives the same bits and other values are refused", function()
    -- rows of 4096 (aligned: a whole task a call), of 4100 (rows off the 64-byte
    -- line: pieces) and NaNs in both operands (the generic loop's payload)
    local script = H.temp(".lua")
    H.spit(script, [[
      local e = require 'ember'
      e.set_stream_min(0)
      e.manual_seed(9)
      local h = {}
      for _, c in ipairs({4096, 4100}) do
        local a = e.randn({6, c}):masked_fill(e.rand({6, c}):lt(0.001), 0/0):to('bf16')
        local r = e.randn({c}):masked_fill(e.rand({c}):lt(0.01), 0/0):to('bf16')
        local b = e.randn({6, c}):to('bf16')
        for _, t in ipairs({a + r, r - a, a * b, b / a}) do
          local x = 2166136261   -- FNV-1a over every value's bits
          for _, v in ipairs(t:float():reshape({-1}):tolist()) do
            local s = v ~= v and 'nan' or string.pack('<d', v)
            for k = 1, #s do x = ((x ~ string.byte(s, k)) * 16777619) & 0xffffffff end
          end
          h[#h + 1] = ('%08x'):format(x)
        end
      end
      io.write(table.concat(h, ';'))]])
    H.switch_agrees(script, "EMBER_CPU_NT_SPAN", {"0", "1"}, "3", 60)
    H.switch_refuses(script, "EMBER_CPU_NT_SPAN", "2",
      "EMBER_CPU_NT_SPAN must be 0 or 1, got '2'; using 1")
    H.remove_temps()
  end)
end)

describe("where and masked_fill into f32 (raw 32-bit select)", function()
  local n = ROWS * COLS
  local pa, pb = patterns("f32", n, 5, 13), patterns("f32", n, 7, 17)
  local a, b = from_bits("f32", {ROWS, COLS}, pa), from_bits("f32", {ROWS, COLS}, pb)
  local flags = {}
  for i = 1, n do flags[i] = (i * 7) % 3 ~= 0 and 1 or 0 end
  local c = ember.tensor(flags):reshape({ROWS, COLS}):ne(0)
  local crow = c:select(0, 1)

  for _, m in ipairs({{1, -1, "1 thread, regular stores"}, {3, 0, "3 threads, streamed"}}) do
    it(("copies every pattern, signalling NaNs included (%s)"):format(m[3]), function()
      local want_w, want_m = {}, {}
      for i = 1, n do
        want_w[i] = flags[i] == 1 and pa[i] or pb[i]
        want_m[i] = flags[i] == 1 and 0xc0400000 or pa[i]   -- -3.0
      end
      with(m[1], m[2], function()
        assert_same_bits(ember.where(c, a, b), from_bits("f32", {ROWS, COLS}, want_w), "where")
        assert_same_bits(a:masked_fill(c, -3), from_bits("f32", {ROWS, COLS}, want_m), "masked_fill")
      end)
    end)

    it(("broadcasts a row mask, takes numbers, strided values and f32 constants as before (%s)"):format(m[3]), function()
      with(m[1], m[2], function()
        local wr = ember.where(crow, a, b)
        local x = wr:float()   -- the same tensor: where keeps f32
        assert.are.equal("f32", x.dtype)
        local bw, aw, bb = bits(wr), pa, pb
        for i = 1, n do
          local col = (i - 1) % COLS + 1
          local want = flags[COLS + col] == 1 and aw[i] or bb[i]
          if bw[i] ~= want then error(("row-mask where: element %d"):format(i - 1)) end
        end
        -- 0.1 is not a float: the value is rounded once, as the generic loop rounded it
        local mf = a:masked_fill(c, 0.1)
        local want = bits(ember.tensor({0.1}, {dtype = "f32"}))[1]
        local bm = bits(mf)
        for i = 1, n do
          if bm[i] ~= (flags[i] == 1 and want or pa[i]) then error(("masked_fill 0.1: element %d"):format(i - 1)) end
        end
        local at = a:t()   -- values and output of another layout
        assert_same_bits(ember.where(c:t(), at, b:t()):contiguous(), ember.where(c, a, b):t():contiguous(), "transposed")
      end)
    end)
  end
end)

describe("EMBER_CPU_PIECE_OUT", function()
  it("gives the same bits in every mode and refuses other values", function()
    local script = H.temp(".lua")
    H.spit(script, [[
      local e = require 'ember'
      e.set_stream_min(0)
      e.manual_seed(5)
      local a, b = e.randn({4, 3001}), e.randn({3001})
      local h, a16 = {}, a:to('bf16')
      for _, t in ipairs({a + b, a * 3, a - a:flip(1), a16 + b:to('bf16'), a:masked_fill(a:gt(0), 2)}) do
        local x = 2166136261   -- FNV-1a over every value's bits
        for _, v in ipairs(t:float():reshape({-1}):tolist()) do
          for k = 1, 8 do x = ((x ~ string.byte(string.pack('<d', v), k)) * 16777619) & 0xffffffff end
        end
        h[#h + 1] = ('%08x'):format(x)
      end
      io.write(table.concat(h, ';'))]])
    H.switch_agrees(script, "EMBER_CPU_PIECE_OUT", {"0", "1", "2"}, "3", 20)
    H.switch_refuses(script, "EMBER_CPU_PIECE_OUT", "fast",
      "EMBER_CPU_PIECE_OUT must be 0, 1 or 2, got 'fast'; using 2")
    H.remove_temps()
  end)
end)

describe("EMBER_CPU_SUM16 (the AVX-512 bf16 sum's widening)", function()
  it("gives the same bits with 'shift' and 'unpack' and refuses other values", function()
    local script = H.temp(".lua")
    H.spit(script, [[
      local e = require 'ember'
      e.manual_seed(9)
      -- exponents from 2^-40 to 2^40: the order of the additions shows in the bits
      local a = (e.randn({37, 4133}) * e.exp(e.randn({37, 4133}) * 9)):to('bf16')
      local out = {}
      for _, t in ipairs({a:sum(), a:sum(1), a:mean(1), a:narrow(1, 3, 4000):sum(1)}) do
        for _, v in ipairs(t:to('f64'):reshape({-1}):tolist()) do out[#out + 1] = ('%a'):format(v) end
      end
      io.write(table.concat(out, ';'))]])
    H.switch_agrees(script, "EMBER_CPU_SUM16", {"shift", "unpack"}, "2", 1000)
    H.switch_refuses(script, "EMBER_CPU_SUM16", "fast",
      "EMBER_CPU_SUM16 must be 'shift' or 'unpack', got 'fast'; using shift")
    H.remove_temps()
  end)
end)
