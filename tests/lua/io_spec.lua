-- io_spec.lua — safetensors (ember.save / ember.load) and .npy
-- (ember.save_npy / ember.load_npy): exact round trips of every dtype, the
-- bytes other tools expect, atomic replacement, and read-only memory maps.
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/io_spec.lua
-- Files are written as raw bytes, so every comparison here is exact.

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local tmp, tmpdir, slurp, spit = H.temp, H.tmpdir, H.slurp, H.spit

local function list_dir(dir)
  local names = {}
  local p = assert(io.popen("ls -A '" .. dir .. "'"))
  for line in p:lines() do names[#names + 1] = line end
  p:close()
  table.sort(names)
  return names
end

-- A safetensors file as Python's safetensors writes it: compact JSON header,
-- padded with spaces to a multiple of 8, then the data section.
local function safetensors_bytes(header_json, data)
  local pad = (8 - #header_json % 8) % 8
  local h = header_json .. string.rep(" ", pad)
  return string.pack("<I8", #h) .. h .. data
end

-- A .npy file as numpy.save writes it (v1.0 or v2.0 header, 64-byte aligned).
local function npy_bytes(dict, data, version)
  version = version or 1
  local lenbytes = version == 1 and 2 or 4
  local pre = 6 + 2 + lenbytes
  local total = pre + #dict + 1
  local pad = (64 - total % 64) % 64
  local header = dict .. string.rep(" ", pad) .. "\n"
  local len = version == 1 and string.pack("<I2", #header) or string.pack("<I4", #header)
  return "\x93NUMPY" .. string.char(version, 0) .. len .. header .. data
end

after_each(H.remove_temps)

describe("ember.save / ember.load", function()
  local function one_of_each()
    return {
      f32 = ember.tensor({{1.5, -2}, {3.25, 1e-3}}),
      f64 = ember.tensor({1 / 3, -1e300, 5e-324}, {dtype = "f64"}),
      bf16 = ember.tensor({1, -2.5, 1 + 2 ^ -7}, {dtype = "bf16"}),
      f16 = ember.tensor({65504, -(2 ^ -24), 0.1}, {dtype = "f16"}),
      i32 = ember.tensor({-(1 << 31), (1 << 31) - 1, 0}, {dtype = "i32"}),
      i64 = ember.tensor({math.mininteger, math.maxinteger, 1}, {dtype = "i64"}),
      u16 = ember.tensor({0, 65535, 1234}, {dtype = "u16"}),
      u8 = ember.tensor({0, 255, 7}, {dtype = "u8"}),
      bool = ember.tensor({true, false, true}),
    }
  end

  it("round-trips every dtype exactly, keeping names, shapes and dtypes", function()
    local path = tmp(".safetensors")
    local src = one_of_each()
    ember.save(path, src)
    local got = ember.load(path)
    local n = 0
    for name, t in pairs(src) do
      n = n + 1
      assert.is_not_nil(got[name], name)
      assert.equals(t.dtype, got[name].dtype, name)
      assert.same(t.shape, got[name].shape, name)
      assert.same(t:tolist(), got[name]:tolist(), name)
    end
    local m = 0
    for _ in pairs(got) do m = m + 1 end
    assert.equals(n, m)
  end)

  it("returns the metadata as a second value, values as strings", function()
    local path = tmp(".safetensors")
    ember.save(path, {w = ember.zeros(2)}, {metadata = {step = 10, run = "baseline"}})
    local got, meta = ember.load(path)
    assert.same({2}, got.w.shape)
    assert.same({step = "10", run = "baseline"}, meta)
  end)

  it("writes the metadata in key order (the same content, the same bytes)", function()
    local path = tmp(".safetensors")
    local meta = {}
    for _, k in ipairs({"zeta", "step", "config", "alpha", "m1", "m0"}) do meta[k] = k:upper() end
    ember.save(path, {w = ember.zeros(2)}, {metadata = meta})
    local f = assert(io.open(path, "rb"))
    local header = f:read(200)
    f:close()
    assert.truthy(header:find('"__metadata__":{"alpha":"ALPHA","config":"CONFIG","m0":"M0","m1":"M1",' ..
      '"step":"STEP","zeta":"ZETA"}', 1, true), header)
  end)

  it("returns an empty metadata table when the file has none", function()
    local path = tmp(".safetensors")
    ember.save(path, {w = ember.zeros(2)})
    local _, meta = ember.load(path)
    assert.same({}, meta)
  end)

  it("round-trips 0-dim and empty tensors", function()
    local path = tmp(".safetensors")
    ember.save(path, {s = ember.tensor(2.5), e = ember.zeros(0), e2 = ember.zeros(2, 0, {dtype = "i64"})})
    local got = ember.load(path)
    assert.same({}, got.s.shape)
    assert.equals(2.5, got.s:item())
    assert.same({0}, got.e.shape)
    assert.same({2, 0}, got.e2.shape)
    assert.equals("i64", got.e2.dtype)
  end)

  it("saves a transposed (non-contiguous) tensor in logical order", function()
    local path = tmp(".safetensors")
    local t = ember.arange(12):float():view(3, 4):t()
    ember.save(path, {t = t})
    local got = ember.load(path).t
    assert.same({4, 3}, got.shape)
    assert.same(t:tolist(), got:tolist())
    assert.is_true(got:is_contiguous())
  end)

  it("saves a narrowed view (non-zero offset) and an expanded view (stride 0)", function()
    local path = tmp(".safetensors")
    ember.save(path, {n = ember.arange(10):narrow(0, 3, 4), e = ember.tensor({1, 2}):expand(3, 2)})
    local got = ember.load(path)
    assert.same({3, 4, 5, 6}, got.n:tolist())
    assert.same({{1, 2}, {1, 2}, {1, 2}}, got.e:tolist())
  end)

  it("loads tensors that own their memory (not views of one buffer)", function()
    local path = tmp(".safetensors")
    ember.save(path, {a = ember.zeros(2), b = ember.zeros(2)})
    local got = ember.load(path)
    got.a:fill_(1)
    assert.same({0, 0}, got.b:tolist())
  end)

  it("writes what Python's safetensors writes: 8-byte length, JSON padded to 8, raw little-endian data", function()
    local path = tmp(".safetensors")
    ember.save(path, {w = ember.tensor({{1, 2, 3}, {4, 5, 6.5}})}, {metadata = {step = "3"}})
    local bytes = slurp(path)
    local n = string.unpack("<I8", bytes)
    assert.equals(0, n % 8)
    local header = bytes:sub(9, 8 + n)
    assert.matches("^{", header)
    assert.matches("}%s*$", header)
    assert.truthy(header:find('"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}', 1, true))
    assert.truthy(header:find('"__metadata__":{"step":"3"}', 1, true))
    assert.equals(string.pack("<ffffff", 1, 2, 3, 4, 5, 6.5), bytes:sub(9 + n))
  end)

  it("loads a file written by hand the way Python's safetensors writes it", function()
    local header = '{"__metadata__":{"format":"pt"},' ..
      '"weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},' ..
      '"ids":{"dtype":"I64","shape":[2],"data_offsets":[24,40]},' ..
      '"half":{"dtype":"BF16","shape":[2],"data_offsets":[40,44]},' ..
      '"mask":{"dtype":"BOOL","shape":[2,1],"data_offsets":[44,46]},' ..
      '"bytes":{"dtype":"U8","shape":[2],"data_offsets":[46,48]}}'
    local data = string.pack("<ffffff", 1, 2, 3, 4, 5, 6.5) ..
      string.pack("<i8i8", -1, 1 << 40) ..
      string.pack("<I2I2", 0x3FC0, 0xC020) ..     -- bf16 1.5 and -2.5
      "\1\0" .. "\255\7"
    local path = spit(tmp(".safetensors"), safetensors_bytes(header, data))
    local got, meta = ember.load(path)
    assert.same({format = "pt"}, meta)
    assert.equals("f32", got.weight.dtype)
    assert.same({{1, 2, 3}, {4, 5, 6.5}}, got.weight:tolist())
    assert.equals("i64", got.ids.dtype)
    assert.same({-1, 1 << 40}, got.ids:tolist())
    assert.equals("bf16", got.half.dtype)
    assert.same({1.5, -2.5}, got.half:tolist())
    assert.same({{true}, {false}}, got.mask:tolist())
    assert.same({255, 7}, got.bytes:tolist())
  end)

  it("leaves no temporary files behind", function()
    local dir = tmpdir()
    local path = dir .. "/model.safetensors"
    ember.save(path, {w = ember.randn(4, 4)})
    ember.save(path, {w = ember.randn(4, 4)})
    assert.same({"model.safetensors"}, list_dir(dir))
  end)

  it("saving over an existing file replaces it entirely", function()
    local path = tmp(".safetensors")
    ember.save(path, {a = ember.zeros(100)})
    ember.save(path, {b = ember.ones(2)})
    local got = ember.load(path)
    assert.is_nil(got.a)
    assert.same({1, 1}, got.b:tolist())
  end)

  it("a save that fails leaves the existing file untouched and no temporary", function()
    local dir = tmpdir()
    local path = dir .. "/ckpt.safetensors"
    ember.save(path, {a = ember.ones(3)})
    local before = slurp(path)
    assert.has_error(function() ember.save(path, {__metadata__ = ember.zeros(1)}) end)
    assert.equals(before, slurp(path))
    assert.same({"ckpt.safetensors"}, list_dir(dir))
  end)
end)

describe("ember.save_npy / ember.load_npy", function()
  local cases = {
    {"f32", {{1.5, -2, 0.1}, {3, 4, 5}}},
    {"f64", {1 / 3, -1e300}},
    {"f16", {65504, 0.5, -(2 ^ -24)}},
    {"i32", {-(1 << 31), 7}},
    {"i64", {math.mininteger, math.maxinteger}},
    {"u16", {0, 65535, 300}},
    {"u8", {0, 255}},
    {"bool", {true, false}},
  }
  for _, c in ipairs(cases) do
    it("round-trips " .. c[1] .. " exactly", function()
      local path = tmp(".npy")
      local t = ember.tensor(c[2], {dtype = c[1]})
      ember.save_npy(path, t)
      local got = ember.load_npy(path)
      assert.equals(c[1], got.dtype)
      assert.same(t.shape, got.shape)
      assert.same(t:tolist(), got:tolist())
    end)
  end

  it("round-trips a 0-dim tensor", function()
    local path = tmp(".npy")
    ember.save_npy(path, ember.tensor(4.5))
    local got = ember.load_npy(path)
    assert.same({}, got.shape)
    assert.equals(4.5, got:item())
  end)

  it("saves a transposed tensor in logical (C) order", function()
    local path = tmp(".npy")
    local t = ember.arange(6):view(2, 3):t()
    ember.save_npy(path, t)
    assert.same({{0, 3}, {1, 4}, {2, 5}}, ember.load_npy(path):tolist())
  end)

  it("writes numpy.save's v1.0 header: magic, dict, 64-byte aligned data", function()
    local path = tmp(".npy")
    ember.save_npy(path, ember.tensor({{1, 2, 3}, {4, 5, 6}}))
    local bytes = slurp(path)
    assert.equals("\x93NUMPY\x01\x00", bytes:sub(1, 8))
    local hlen = string.unpack("<I2", bytes, 9)
    assert.equals(0, (10 + hlen) % 64)
    local header = bytes:sub(11, 10 + hlen)
    assert.matches("^{'descr': '<f4', 'fortran_order': False, 'shape': %(2, 3%), } *\n$", header)
    assert.equals(string.pack("<ffffff", 1, 2, 3, 4, 5, 6), bytes:sub(11 + hlen))
  end)

  it("writes a 1-dim shape as a Python 1-tuple (5,)", function()
    local path = tmp(".npy")
    ember.save_npy(path, ember.zeros(5, {dtype = "u16"}))
    local bytes = slurp(path)
    assert.truthy(bytes:find("'descr': '<u2'", 1, true))
    assert.truthy(bytes:find("'shape': (5,)", 1, true))
  end)

  it("loads a file written the way numpy.save writes it", function()
    local data = string.pack("<I2I2I2I2I2", 0, 1, 50000, 65535, 42)
    local path = spit(tmp(".npy"), npy_bytes("{'descr': '<u2', 'fortran_order': False, 'shape': (5,), }", data))
    local got = ember.load_npy(path)
    assert.equals("u16", got.dtype)
    assert.same({0, 1, 50000, 65535, 42}, got:tolist())
  end)

  it("loads a version 2.0 header", function()
    local data = string.pack("<dd", 0.25, -8)
    local path = spit(tmp(".npy"),
      npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 1), }", data, 2))
    local got = ember.load_npy(path)
    assert.equals("f64", got.dtype)
    assert.same({{0.25}, {-8}}, got:tolist())
  end)

  it("refuses Fortran-ordered arrays instead of misreading them", function()
    local data = string.pack("<ffff", 1, 2, 3, 4)
    local path = spit(tmp(".npy"), npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", data))
    local ok, err = pcall(ember.load_npy, path)
    assert.is_false(ok)
    assert.matches("fortran", err:lower())
  end)

  describe("with mmap = true", function()
    local function mapped(values, dtype)
      local path = tmp(".npy")
      ember.save_npy(path, ember.tensor(values, {dtype = dtype}))
      return ember.load_npy(path, {mmap = true}), path
    end

    it("reads the same values as a plain load", function()
      local t = mapped({3, 1, 4, 1, 5, 9}, "u16")
      assert.equals("u16", t.dtype)
      assert.same({3, 1, 4, 1, 5, 9}, t:tolist())
    end)

    it("is read-only: fill_ raises", function()
      local t = mapped({1, 2, 3}, "f32")
      local ok, err = pcall(function() t:fill_(0) end)
      assert.is_false(ok)
      assert.matches("read%-only", err)
      assert.same({1, 2, 3}, t:tolist())
    end)

    it("is read-only through views and in-place arithmetic too", function()
      local t = mapped({1, 2, 3, 4}, "f32")
      assert.has_error(function() t:narrow(0, 1, 2):zero_() end)
      assert.has_error(function() t:add_(1) end)
      assert.has_error(function() t:copy_(ember.zeros(4)) end)
      assert.same({1, 2, 3, 4}, t:tolist())
    end)

    it("can be cloned into a writable tensor", function()
      local t = mapped({1, 2}, "f32")
      local c = t:clone()
      c:fill_(7)
      assert.same({7, 7}, c:tolist())
      assert.same({1, 2}, t:tolist())
    end)

    it("feeds out-of-place ops (slices of a token array)", function()
      local tokens = {}
      for i = 1, 1000 do tokens[i] = (i * 37) % 65536 end
      local t = mapped(tokens, "u16")
      assert.same({tokens[101], tokens[102], tokens[103]}, t:narrow(0, 100, 3):tolist())
      assert.same({tokens[1] + 1, tokens[2] + 1}, (t:narrow(0, 0, 2):to("i64") + 1):tolist())
    end)

    it("stays readable after the file is removed (the mapping holds it)", function()
      local t, path = mapped({5, 6, 7}, "i32")
      os.remove(path)
      collectgarbage()
      assert.same({5, 6, 7}, t:tolist())
    end)
  end)
end)
