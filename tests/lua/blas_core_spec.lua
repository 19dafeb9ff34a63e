-- OpenBLAS's kernel choice (engine/blas_core.c, bindings/cli/ember_main.c):
-- a misdetected CPU (old OpenBLAS takes Prescott's SSE3 kernels for Intel
-- models it does not know) makes `ember` run itself again with
-- OPENBLAS_CORETYPE set. EMBER_BLAS_ASSUME_CORE makes the check see a given
-- core, so the re-execution is tested on any x86 machine with AVX2.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local ember = require "ember"

local SHOW = 'local b = require("ember").blas_info(); ' ..
  'print(b.core, b.replaced or "-", b.better or "-", os.getenv("OPENBLAS_CORETYPE") or "-")'

local function run(env)
  local out, err, status = H.ember({"-e", SHOW}, {unset = {"OPENBLAS_CORETYPE", "EMBER_BLAS_REEXEC"}, env = env})
  assert.are.equal(0, status, err)
  local core, replaced, better, coretype = out:match("^(%S+)\t(%S+)\t(%S+)\t(%S+)")
  assert.is_truthy(core, out)
  return {core = core, replaced = replaced, better = better, coretype = coretype}
end

local function has_avx2_fma()
  local f = io.open("/proc/cpuinfo")
  if not f then return false end
  local flags = f:read("a"):match("\nflags%s*:([^\n]*)") or ""
  f:close()
  return flags:find(" avx2") ~= nil and flags:find(" fma") ~= nil
end

describe("OpenBLAS kernel choice", function()
  it("ember.blas_info names the core and OpenBLAS's build line", function()
    local b = ember.blas_info()
    assert.is_string(b.core)
    assert.is_true(#b.core > 0)
    assert.is_truthy(b.config:match("OpenBLAS"), b.config)
  end)

  it("leaves a good choice alone", function()
    local r = run({})
    assert.are.equal("-", r.replaced)
    assert.are.equal("-", r.coretype)
  end)

  if has_avx2_fma() then
    it("runs again with OPENBLAS_CORETYPE set when OpenBLAS chose pre-AVX2 kernels on an AVX2 CPU", function()
      local r = run({EMBER_BLAS_ASSUME_CORE = "Prescott"})
      assert.are.equal("Prescott", r.replaced)
      assert.is_truthy(r.coretype == "Haswell" or r.coretype == "SkylakeX", r.coretype)
      assert.are.equal("-", r.better)             -- the second run is satisfied
      assert.are_not.equal("Prescott", r.core)
    end)

    it("EMBER_BLAS_FIX=0 turns the re-execution off, and blas_info says what would be better", function()
      local r = run({EMBER_BLAS_ASSUME_CORE = "Nehalem", EMBER_BLAS_FIX = "0"})
      assert.are.equal("-", r.replaced)
      assert.are.equal("-", r.coretype)
      assert.is_truthy(r.better == "Haswell" or r.better == "SkylakeX", r.better)
    end)

    it("a user's own OPENBLAS_CORETYPE wins", function()
      local out, err, status = H.ember({"-e", SHOW}, {unset = {"EMBER_BLAS_REEXEC"},
        env = {OPENBLAS_CORETYPE = "Haswell", EMBER_BLAS_ASSUME_CORE = "Prescott"}})
      assert.are.equal(0, status, err)
      assert.is_truthy(out:match("^Haswell\t%-\t%-\tHaswell"), out)
    end)
  end
end)
