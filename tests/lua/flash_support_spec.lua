-- flash_support_spec.lua — the attention support matrix (ember.flash_support,
-- F.flash_support, `ember attention --matrix`) against what the op does: every
-- CPU cell runs on tiny inputs (forward at Tq above and at the decode
-- threshold, backward) or raises the error its row names; impl = "auto"
-- picks what the row says on both sides of the CPU threshold. The CUDA cells
-- are checked the same way in tests/gpu/flash_spec.lua.
local ember = require "ember"
local F = ember.nn.functional
local support = require "ember.flash_support"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local function leaf(t) t.requires_grad = true; return t end

-- q (1, H, tq, d), k and v (1, 2, tk, d) in dtype dt on the CPU
local function inputs(r, tq, tk, dt)
  ember.manual_seed(r.d + tq)
  local Hq = r.gqa and 4 or 2
  return leaf(ember.randn({1, Hq, tq, r.d}, {dtype = dt})), leaf(ember.randn({1, 2, tk, r.d}, {dtype = dt})),
    leaf(ember.randn({1, 2, tk, r.d}, {dtype = dt}))
end

local function in_autocast(r, f)
  if r.dtype == "f32+autocast" then return ember.autocast("bf16", f) end
  return f()
end

describe("the attention support matrix", function()
  it("has a row per device x dtype x head dim (and one unsupported) x causal x GQA", function()
    local rows = F.flash_support()
    assert.are.equal(#support.DEVICES * #support.DTYPES * (#support.DIMS + 1) * #support.CAUSAL * #support.GQA,
      #rows)
    local seen = {}
    for _, r in ipairs(rows) do
      local key = table.concat({r.device, r.dtype, r.d, r.causal, tostring(r.gqa)}, " ")
      assert.is_nil(seen[key], "duplicate row " .. key)
      seen[key] = true
      for _, col in ipairs({"forward", "decode", "backward", "auto"}) do
        assert.are.equal("string", type(r[col]), key .. " " .. col)
      end
      assert.are.equal(r.error ~= nil, r.forward == "error", key .. ": an error row says so")
    end
    assert.is_true(seen["cuda f32 64 top_left true"] ~= nil)
  end)

  it("agrees with what the op does on the CPU, cell by cell (errors name the case)", function()
    local n = 0
    for _, r in ipairs(support.rows()) do
      if r.device == "cpu" then
        local dt = r.dtype == "f32+autocast" and "f32" or r.dtype
        local causal = r.causal ~= "none" and r.causal or false
        for _, tq in ipairs({20, support.DECODE_MAX_TQ}) do
          local what = ("cpu %s d %d causal %s gqa %s tq %d"):format(r.dtype, r.d, r.causal, tostring(r.gqa), tq)
          local q, k, v = inputs(r, tq, 24, dt)
          if r.error then
            assert.error_matches(function() F.flash_attention(q, k, v, causal) end, r.error, 1, true)
            assert.is_false(ember.core.flash_applies(q, k, v), what .. ": auto")
          else
            local o = in_autocast(r, function() return F.flash_attention(q, k, v, causal) end)
            o:float():sum():backward()
            assert.are.equal(r.dtype == "f32+autocast" and "f32" or dt, q.grad.dtype, what)
            assert.is_true(q.grad:float():abs():sum():item() > 0, what .. ": backward ran")
            -- auto: naive below the threshold, the tiled path from it (r.auto says so)
            assert.truthy(r.auto:find("cpu tiled from Tk >= " .. support.CPU_MIN_TK, 1, true), what)
            in_autocast(r, function()
              assert.is_false(ember.core.flash_applies(q, k, v), what .. ": auto at Tk 24")
              local q2, k2, v2 = inputs(r, 2, support.CPU_MIN_TK, dt)
              assert.is_true(ember.core.flash_applies(q2, k2, v2), what .. ": auto at Tk " .. support.CPU_MIN_TK)
            end)
          end
          n = n + 1
        end
      end
    end
    assert.is_true(n > 0)
  end)

  it("refuses f64 and other head dims on CUDA with the op's message, and says what auto runs for f32", function()
    local f64 = support.cell("cuda", "f64", 64, "none", false)
    assert.are.equal("error", f64.forward)
    assert.truthy(f64.error:find("got f64", 1, true))
    local d48 = support.cell("cuda", "bf16", 48, "none", false)
    assert.truthy(d48.error:find("no kernel for head dim 48", 1, true))
    assert.are.equal("flash", support.cell("cuda", "f32", 64, "top_left", true, {tf32 = true}).auto)
    assert.truthy(support.cell("cuda", "f32", 64, "top_left", true, {tf32 = false}).auto:find("^naive"))
    assert.are.equal("flash_fwd (tf32)", support.cell("cuda", "f32", 128, "none", false).forward)
    assert.are.equal("flash_decode (f32)", support.cell("cuda", "f32", 128, "none", false).decode)
  end)

  it("names the D 128 wgmma kernels at D 80 and 96 (EMBER_FLASH_WG_PAD unset or 1), the mma ones with 0", function()
    local pad = os.getenv("EMBER_FLASH_WG_PAD") ~= "0"
    for _, d in ipairs({80, 96}) do
      for _, dt in ipairs({"bf16", "f16", "f32+autocast"}) do
        local r = support.cell("cuda", dt, d, "top_left", true)
        local mma = dt == "f16" and "f16" or "bf16"
        if pad then
          assert.are.equal("flash_fwd_wg2 (as d 128) on sm_90, else flash_fwd (" .. mma .. ")", r.forward)
          assert.are.equal("flash_bwd_wg (as d 128) on sm_90, else flash_bwd (" .. mma .. ")", r.backward)
        else
          assert.are.equal("flash_fwd (" .. mma .. ")", r.forward)
          assert.are.equal("flash_bwd (" .. mma .. ")", r.backward)
        end
        assert.are.equal("flash_decode (" .. mma .. ")", r.decode)
      end
      assert.are.equal("flash_fwd (tf32)", support.cell("cuda", "f32", d, "none", false).forward)
    end
    assert.are.equal("flash_fwd (bf16)", support.cell("cuda", "bf16", 32, "none", false).forward)
  end)

  it("merges cases where causal and GQA change nothing", function()
    local c = support.compact(support.rows())
    assert.are.equal(#support.DEVICES * #support.DTYPES * (#support.DIMS + 1), #c)
    assert.are.equal("any", c[1].causal)
    local text = support.format(c)
    assert.truthy(text:find("flash_fwd (tf32)", 1, true))
    assert.truthy(text:find("other", 1, true))
  end)
end)

describe("ember attention", function()
  local have_exe = io.open(H.EMBER, "rb")
  if have_exe then have_exe:close() end

  it("--matrix prints every device, dtype and head dim, with the errors", function()
    if not have_exe then pending("no executable at " .. H.EMBER) return end
    local out, err, status = H.ember({"attention", "--matrix"})
    assert.are.equal(0, status, err)
    for _, word in ipairs({"cpu", "cuda", "bf16", "f16", "f32", "f64", "256", "other", "flash_fwd (tf32)",
      "flash_decode", "flash_bwd", "cpu tiled", "no kernel for head dim 48", "got f64"}) do
      assert.truthy(out:find(word, 1, true), "matrix lacks " .. word)
    end
    local full = H.ember({"attention", "--matrix", "--full", "--device", "cuda", "--dtype", "f32", "--tf32", "on"})
    assert.truthy(full:find("bottom_right", 1, true))
    assert.falsy(full:find("cpu tiled", 1, true))
  end)

  it("--help describes it; bad options exit 2 naming them", function()
    if not have_exe then pending("no executable at " .. H.EMBER) return end
    local out, _, status = H.ember({"attention", "--help"})
    assert.are.equal(0, status)
    assert.truthy(out:find("--matrix", 1, true))
    local _, err, st2 = H.ember({"attention", "--matrix", "--device", "tpu"})
    assert.are.equal(2, st2)
    assert.truthy(err:find("'tpu'", 1, true))
    local help = H.ember({"--help"})
    assert.truthy(help:find("attention", 1, true))
  end)
end)
