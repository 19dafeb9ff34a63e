-- flash_wg_bwd_spec.lua (GPU, sm_90) — the Hopper wgmma/TMA backwards
-- (kernels/flash_bwd_wg.cu, docs/flash.md "Step 4"; kernels/flash_bwd_wg2.cu,
-- "Step 4b"), each forced with core.flash_bwd_kernel("wg") / ("wg2"), against
-- the f64 CPU reference and against the
-- mma.sync backward (flash_bwd.cu, forced with "mma") on the same inputs and
-- the same forward: head dims 64 and 128, and 80 and 96 (the D 128 kernels over
-- zero-filled columns, docs/flash.md "Step 7"), bf16 and f16, causal top-left /
-- bottom-right / none, GQA (the group's sum in a fixed order), Tq ≠ Tk both
-- ways (keys no query sees: zero dk/dv), odd lengths (partial 64-row tiles
-- and 128-row blocks at the ends: 1, 63, 65, 129, 257, 1000), the (B, T, H, D)
-- layout, a view whose row stride is not D, long sequences through the stage
-- rings, bit-identical repeats.
--
-- Bounds as tests/gpu/flash_spec.lua: ‖got − ref‖ / ‖ref‖ of dq, dk and dv no
-- more than twice the error of the naive composition's backward run on the GPU
-- in the same half dtype, plus 1e-4, and never above 1e-2 (bf16) / 2e-3 (f16);
-- the wg gradients within the same cap of the mma ones. wg2 is held to the same
-- bounds and, as it runs the same wgmmas on the same fragments in the same tile
-- order, to wg's bits. Every case prints its errors (wg's, wg2's, mma's,
-- naive's, wg vs mma), so a failing run says where.
local ember = require "ember"
local core = ember.core

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local C, helpers = dofile(here .. "compare.lua")
local rel = C.rel_error

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local CAP = {bf16 = 1e-2, f16 = 2e-3}
local randn = helpers.seeded(11300).randn   -- seeds 11300 + 1, + 2, ...: f64 draws cast to the dtype
local bthd, wide = C.bthd, C.wide

local ref64, flash, naive, max_abs = C.attn_ref64, C.flash_grads, C.naive_grads, C.max_abs

local NAMES = {"dq", "dk", "dv"}

-- one case: wg's gradients vs the reference and vs mma's, on the same inputs
local function check(sq, sk, dt, causal, opts)
  opts = opts or {}
  local q, k, v, g = randn(sq, dt), randn(sk, dt), randn(sk, dt), randn(sq, dt)
  q, k, v, g = q:cuda(), k:cuda(), v:cuda(), g:cuda()
  local lay = opts.layout   -- applied to the kernels' inputs on the GPU (a copy to the GPU is contiguous)
  local ref = ref64(q, k, v, g, causal)
  -- every result stays referenced to the end of the case, so the caching
  -- allocator cannot hand wg's dq the memory of mma's (nearly the same values)
  -- and hide rows the kernel never wrote
  local mm = flash("mma", q, k, v, g, causal, lay)
  local nv = naive(q, k, v, g, causal)
  local wg = flash("wg", q, k, v, g, causal, lay)
  local wg2 = flash("wg2", q, k, v, g, causal, lay)
  local shape = string.format("%s q%s k%s causal=%s", dt, table.concat(sq, "x"), table.concat(sk, "x"),
    tostring(causal))
  for _, name in ipairs(NAMES) do
    local em, en = rel(mm[name], ref[name]), rel(nv[name], ref[name])
    for _, run in ipairs({{"wg", wg}, {"wg2", wg2}}) do
      local kname, got = run[1], run[2][name]
      local what = kname .. " " .. shape
      local ew, ewm = rel(got, ref[name]), rel(got, mm[name])
      print(string.format("  %-48s %s: %s %.3g mma %.3g naive %.3g vs-mma %.3g max|err| %.3g", what, name, kname,
        ew, em, en, ewm, max_abs(got, ref[name])))
      assert.are.equal(dt, got.dtype, what .. " " .. name .. " dtype")
      if ref[name]:abs():max():item() == 0 then
        -- an exactly zero gradient (one key: the softmax has no slope, so dq = dk = 0): the
        -- relative error is undefined; the kernel's rounding residue must be tiny next to the
        -- O(1) inputs (1e-7 seen on the H100, 2026-11-27; a wrong tile would give O(1))
        local m = got:cpu():to("f64"):abs():max():item()
        assert.is_true(m <= 1e-5, string.format("%s %s: reference 0, got max |%s| %.3g", what, name, name, m))
      else
        local bound = math.min(2 * en + 1e-4, CAP[dt])
        assert.is_true(ew <= bound, string.format("%s %s: error %.3g > %.3g (naive %.3g, mma %.3g)", what, name, ew,
          bound, en, em))
        assert.is_true(ewm <= CAP[dt], string.format("%s %s: vs mma %.3g > %.3g", what, name, ewm, CAP[dt]))
      end
    end
    -- wg2 reorders when the wgmmas are issued, not what they sum: wg's bits
    local d = max_abs(wg2[name], wg[name])
    assert.are.equal(0, d, string.format("wg2 %s %s: expected wg's bits, max |wg2 - wg| %.3g", shape, name, d))
  end
  return wg, mm
end

describe("flash attention's wgmma backward (sm_90)", function()
  -- nil when the wg backward runs here, else why not (not an sm_90 GPU)
  local why = C.sm90_unavailable(function()
    local x = ember.randn({1, 1, 32, 64}, {dtype = "bf16"}):cuda()
    flash("wg", x, x, x, x, true)
  end)
  if why then
    it("needs an sm_90 GPU", function() pending(why) end)   -- reported skipped, with the reason
    return
  end

  it("chooses kernels by name, and forced, names what it lacks", function()
    local prev = core.flash_bwd_kernel("mma")
    assert.are.equal("mma", core.flash_bwd_kernel("wg"))
    assert.are.equal("wg", core.flash_bwd_kernel(prev))
    local ok, err = pcall(core.flash_bwd_kernel, "tma")
    assert.is_false(ok)
    assert.matches('expected "auto", "mma", "wg", "wg2", "fused" or "fused_nd", got "tma"', tostring(err), 1, true)
    assert.are.equal(prev, core.flash_bwd_kernel("wg2"))
    assert.are.equal("wg2", core.flash_bwd_kernel(prev))
    -- a head dim or a dtype it does not have: an error naming the setting, not a silent fallback
    local x = ember.randn({1, 1, 40, 32}, {dtype = "bf16"}):cuda()
    local ok1, err1 = pcall(flash, "wg", x, x, x, x, true)
    assert.is_false(ok1, "head dim 32 ran")
    assert.matches("(EMBER_FLASH_BWD=wg) expect head dim 64 or 128 (80 and 96 run as 128 unless EMBER_FLASH_WG_PAD=0), "
      .. "got 32", tostring(err1), 1, true)
    local x32 = ember.randn({1, 1, 40, 64}):cuda()
    local tf = ember.backends.tf32(true)   -- f32 flash on CUDA (the TF32 kernels) is then allowed
    local ok2, err2 = pcall(flash, "wg", x32, x32, x32, x32, true)
    ember.backends.tf32(tf)
    assert.is_false(ok2, "f32 ran")
    assert.matches("(EMBER_FLASH_BWD=wg) expect bf16 or f16, got f32", tostring(err2), 1, true)
    -- wg2 names itself in the same errors
    local ok3, err3 = pcall(flash, "wg2", x, x, x, x, true)
    assert.is_false(ok3, "wg2 at head dim 32 ran")
    assert.matches("(EMBER_FLASH_BWD=wg2) expect head dim 64 or 128 (80 and 96 run as 128 unless "
      .. "EMBER_FLASH_WG_PAD=0), got 32", tostring(err3), 1, true)
    tf = ember.backends.tf32(true)
    local ok4, err4 = pcall(flash, "wg2", x32, x32, x32, x32, true)
    ember.backends.tf32(tf)
    assert.is_false(ok4, "wg2 in f32 ran")
    assert.matches("(EMBER_FLASH_BWD=wg2) expect bf16 or f16, got f32", tostring(err4), 1, true)
  end)

  for _, d in ipairs({64, 80, 96, 128}) do
    for _, dt in ipairs({"bf16", "f16"}) do
      it(string.format("matches the reference and the mma backward: D %d, %s, odd lengths, all masks", d, dt),
        function()
          for _, T in ipairs({1, 63, 65, 129, 257, 1000}) do
            for _, causal in ipairs({true, "bottom_right", false}) do
              check({1, 2, T, d}, {1, 2, T, d}, dt, causal)
            end
          end
        end)
    end

    it(string.format("runs Tq ≠ Tk and GQA: D %d", d), function()
      check({1, 4, 100, d}, {1, 2, 300, d}, "bf16", "bottom_right")
      check({1, 4, 100, d}, {1, 2, 300, d}, "f16", true)            -- top-left: keys past 100 get zero dk, dv
      check({1, 4, 300, d}, {1, 2, 100, d}, "bf16", true)           -- top-left, Tq > Tk
      check({2, 6, 200, d}, {2, 2, 517, d}, "f16", false)
      check({1, 8, 129, d}, {1, 1, 129, d}, "bf16", true)           -- multi-query: 8 q heads summed
      check({1, 2, 17, d}, {1, 2, 1000, d}, "bf16", "bottom_right") -- few queries, many key blocks
      check({1, 6, 1000, d}, {1, 2, 257, d}, "f16", false)          -- GQA 3, Tq > Tk, no mask
      -- the second consumer of key block 0 sees no query of each head's first tile (an empty
      -- turn between two seen tiles, wg2 holding the last one's dv/dk over it), then none at all
      -- (8 empty turns, more than the stages)
      check({1, 8, 70, d}, {1, 1, 300, d}, "bf16", true)
      check({1, 8, 40, d}, {1, 1, 300, d}, "f16", true)
    end)

    it(string.format("runs long sequences through the stage rings, and the (B, T, H, D) layout: D %d", d), function()
      check({1, 1, 4097, d}, {1, 1, 4097, d}, "bf16", true)
      check({1, 2, 1500, d}, {1, 1, 4097, d}, "f16", "bottom_right")
      check({2, 4, 130, d}, {2, 2, 130, d}, "bf16", true, {layout = bthd})
      check({1, 4, 200, d}, {1, 2, 333, d}, "f16", "bottom_right", {layout = wide})   -- row stride D + 48
    end)
  end

  -- which backward kernels ran, by name, from the profiler (the wgmma and mma.sync backwards give the
  -- same bits: P and dS are the same f32 formula, rounded alike, and both sum their tiles in one order;
  -- seen on the H100, 2026-11-27 — so bits cannot tell them apart)
  local function bwd_kernels(kernel, q, k, v, g)
    return C.kernel_names(function() flash(kernel, q, k, v, g, true) end)
  end

  it("gives the mma backward's bits under auto at D 64/128", function()
    local q, k, v, g = randn({1, 2, 300, 128}, "bf16"):cuda(), randn({1, 2, 300, 128}, "bf16"):cuda(),
      randn({1, 2, 300, 128}, "bf16"):cuda(), randn({1, 2, 300, 128}, "bf16"):cuda()
    local a, m = flash("auto", q, k, v, g, true), flash("mma", q, k, v, g, true)
    for _, name in ipairs(NAMES) do assert.are.equal(0, max_abs(a[name], m[name]), name) end
  end)

  it("runs wg2's kernels under auto at D 64/128, mma's at D 32, wg's when asked (by their names)", function()
    C.need_cupti(pending)
    local q, k, v, g = randn({1, 2, 300, 128}, "bf16"):cuda(), randn({1, 2, 300, 128}, "bf16"):cuda(),
      randn({1, 2, 300, 128}, "bf16"):cuda(), randn({1, 2, 300, 128}, "bf16"):cuda()
    local ka, km = bwd_kernels("auto", q, k, v, g), bwd_kernels("mma", q, k, v, g)
    assert.truthy(ka:find("flash_dkdv_wg2_kernel", 1, true), ka)
    assert.truthy(ka:find("flash_dq_wg2_kernel", 1, true), ka)
    assert.falsy(ka:find("flash_dkdv_kernel", 1, true), ka)
    assert.truthy(km:find("flash_dkdv_kernel", 1, true), km)
    assert.falsy(km:find("_wg_kernel", 1, true), km)
    -- D 32: no wgmma backward; auto runs mma (no error, unlike forced wg)
    local q32, g32 = randn({1, 2, 300, 32}, "bf16"):cuda(), randn({1, 2, 300, 32}, "bf16"):cuda()
    local k32 = bwd_kernels("auto", q32, q32, q32, g32)
    assert.truthy(k32:find("flash_dkdv_kernel", 1, true), k32)
    assert.falsy(k32:find("_wg_kernel", 1, true), k32)
    -- wg: its own kernels (no overlap), not wg2's
    local k1 = bwd_kernels("wg", q, k, v, g)
    assert.truthy(k1:find("flash_dkdv_wg_kernel", 1, true), k1)
    assert.truthy(k1:find("flash_dq_wg_kernel", 1, true), k1)
    assert.falsy(k1:find("flash_dkdv_wg2_kernel", 1, true), k1)   -- (the forward is flash_fwd_wg2_kernel)
    assert.falsy(k1:find("flash_dq_wg2_kernel", 1, true), k1)
    assert.falsy(k1:find("flash_dkdv_kernel", 1, true), k1)
    assert.falsy(ka:find("flash_dkdv_wg_kernel", 1, true), ka)
    -- D 80 and 96: wg2's D 128 kernels (EMBER_FLASH_WG_PAD=1, the default), not mma's
    for _, d in ipairs({80, 96}) do
      local qd, kd, vd, gd = randn({1, 2, 300, d}, "bf16"):cuda(), randn({1, 2, 300, d}, "bf16"):cuda(),
        randn({1, 2, 300, d}, "bf16"):cuda(), randn({1, 2, 300, d}, "bf16"):cuda()
      local kp = bwd_kernels("auto", qd, kd, vd, gd)
      assert.truthy(kp:find("flash_dkdv_wg2_kernel<[^,>]*, 128,"), kp)
      assert.truthy(kp:find("flash_dq_wg2_kernel<[^,>]*, 128", 1), kp)
      assert.falsy(kp:find("flash_dkdv_kernel", 1, true), kp)
    end
  end)

  it("gives bit-identical gradients on repeat (a race would move them): GQA, many tiles, every mask", function()
    local q, k, v, g = randn({1, 8, 2100, 128}, "f16"):cuda(), randn({1, 2, 2100, 128}, "f16"):cuda(),
      randn({1, 2, 2100, 128}, "f16"):cuda(), randn({1, 8, 2100, 128}, "f16"):cuda()
    for _, kernel in ipairs({"wg", "wg2"}) do
      for _, causal in ipairs({true, "bottom_right", false}) do
        local a = flash(kernel, q, k, v, g, causal)
        for _ = 1, 2 do
          local b = flash(kernel, q, k, v, g, causal)
          for _, name in ipairs(NAMES) do
            assert.are.equal(0, max_abs(a[name], b[name]), kernel .. " " .. name .. " moved: causal=" ..
              tostring(causal))
          end
        end
      end
      for _, d in ipairs({64, 80}) do
        local q6, k6, v6, g6 = randn({2, 4, 777, d}, "bf16"):cuda(), randn({2, 2, 777, d}, "bf16"):cuda(),
          randn({2, 2, 777, d}, "bf16"):cuda(), randn({2, 4, 777, d}, "bf16"):cuda()
        local a, b = flash(kernel, q6, k6, v6, g6, true), flash(kernel, q6, k6, v6, g6, true)
        for _, name in ipairs(NAMES) do
          assert.are.equal(0, max_abs(a[name], b[name]), kernel .. " " .. name .. " moved (D " .. d .. ")")
        end
      end
    end
  end)

  -- The short-sequence schedule (EMBER_FLASH_STEP9, read once a process: children; docs/flash.md "Step 9"):
  -- the wg2/wg3 forward's and the wg2 backward's blocks heaviest first over the whole grid, and Δ = rowsum(dO ∘ o)
  -- computed inside the wg2 kernels instead of by its own kernel. The same tiles with the same arithmetic (Δ by
  -- the delta kernel's own loop), so o, lse, dq, dk and dv keep their bits. The training shapes' heads at T 512
  -- (H 12 at D 64 with B 4, the small model's; H 25 with B 2; H 32 at D 80 with B 1) and the edges: GQA, Tq < Tk and Tq > Tk, odd lengths (partial 64-row
  -- tiles and 128-row blocks), D 96 and 128 in f16, every mask.
  local step9_script = [[
local ember = require "ember"
local F = ember.nn.functional
local out = {}
local cases = {{"bf16", {4, 12, 512, 64}, {4, 12, 512, 64}}, {"bf16", {2, 25, 512, 64}, {2, 25, 512, 64}},
  {"bf16", {1, 32, 512, 80}, {1, 32, 512, 80}}, {"f16", {2, 4, 777, 128}, {2, 2, 777, 128}},
  {"bf16", {1, 8, 300, 64}, {1, 2, 1000, 64}}, {"bf16", {1, 2, 1000, 64}, {1, 2, 17, 64}},
  {"f16", {1, 3, 65, 96}, {1, 3, 65, 96}}}
for i, c in ipairs(cases) do
  for j, causal in ipairs({true, "bottom_right", false}) do
    if causal == "bottom_right" and c[2][3] > c[3][3] then goto next end   -- needs Tq <= Tk
    ember.manual_seed(100 * i + j)
    local function leaf(shape) return ember.randn(shape, {dtype = c[1]}):cuda():requires_grad_() end
    local q, k, v = leaf(c[2]), leaf(c[3]), leaf(c[3])
    local g = ember.randn(c[2], {dtype = c[1]}):cuda()
    local o, lse = F.flash_attention(q, k, v, causal)
    o:backward(g)
    local key = i .. "_" .. tostring(causal)
    out["o_" .. key], out["lse_" .. key] = o:detach():cpu(), lse:cpu()
    out["dq_" .. key], out["dk_" .. key], out["dv_" .. key] = q.grad:cpu(), k.grad:cpu(), v.grad:cpu()
    ::next::
  end
end
ember.save(os.getenv("SCAN_SPEC_OUT"), out)
]]
  -- With EMBER_FLASH_PDL=1 too (the dk/dv kernel a programmatic dependent of dq: its blocks start during dq's
  -- tail and wait for Δ), the same bits: a dk/dv block that read Δ before dq stored it would move them.
  it("gives the same bits with EMBER_FLASH_STEP9=1 (and EMBER_FLASH_PDL=1) as with 0 (in children)", function()
    local script = helpers.temp_file(step9_script, ".lua")
    local got = {}
    for _, mode in ipairs({{"0", "0"}, {"1", "0"}, {"1", "1"}}) do
      local path = helpers.temp(".safetensors")
      local _, err, code = helpers.ember({"run", script},
        {env = {EMBER_FLASH_STEP9 = mode[1], EMBER_FLASH_PDL = mode[2], SCAN_SPEC_OUT = path}})
      assert.are.equal(0, code, "EMBER_FLASH_STEP9=" .. mode[1] .. " EMBER_FLASH_PDL=" .. mode[2] .. ": " .. tostring(err))
      got[mode[1] .. mode[2]] = ember.load(path)
    end
    -- case 6 (Tq > Tk): no bottom_right
    assert.are.equal((7 * 3 - 1) * 5, C.assert_modes_agree(got, "00", {"10", "11"}))
    for var, msg in pairs({EMBER_FLASH_STEP9 = "expected EMBER_FLASH_STEP9 to be 1 or 0, got '2'",
                           EMBER_FLASH_PDL = "expected EMBER_FLASH_PDL to be 0 or 1, got '2'"}) do
      local env = {EMBER_FLASH_STEP9 = "1"}
      env[var] = "2"
      local _, err, code = helpers.ember({"run", script}, {env = env})
      assert.are_not.equal(0, code, var .. "=2 should fail")
      assert.matches(msg, err, 1, true)
    end
    helpers.remove_temps()
  end)

  -- The kernels a backward at T 512 (D 64 and 80: the D 64 and D 128 instances) runs, by name (CUPTI), printed
  -- by a child.
  local names_script = [[
local ember = require "ember"
local names = {}
for _, d in ipairs({64, 80}) do
  local x = ember.randn({4, 12, 512, d}, {dtype = "bf16"}):cuda():requires_grad_()
  local P = ember.profiler.profile(function()
    ember.nn.functional.flash_attention(x, x, x, true):sum():backward()
    ember.cuda.synchronize()
  end, {print = false})
  for _, r in ipairs(P:kernels()) do names[#names + 1] = r.key end
  P:close()
end
print(table.concat(names, " | "))
]]

  -- ... and runs what it says: the kernels' HF template argument (the grid's order; dq's S9, before its D9) true,
  -- no delta kernel; with 0 the kernels as before (HF false) and the delta kernel. D 64 (wg3 forward, the dk/dv
  -- kernel's PIPE true) and D 80 (the D 128 kernels). (dq's and dk/dv's last argument, RP, false: no rope option.)
  it("runs the heaviest-first kernels and no delta kernel with EMBER_FLASH_STEP9=1 (by their names, in children)", function()
    C.need_cupti(pending)
    local script = helpers.temp_file(names_script, ".lua")
    for _, mode in ipairs({"0", "1"}) do
      -- (Step 9b's Δ off, its own case below: dq's D9 argument false)
      local out, err, code = helpers.ember({"run", script}, {env = {EMBER_FLASH_STEP9 = mode, EMBER_FLASH_DELTA9 = "0"}})
      assert.are.equal(0, code, "EMBER_FLASH_STEP9=" .. mode .. ": " .. tostring(err))
      local hf = mode == "1" and "true" or "false"
      assert.truthy(out:find("flash_fwd_wg2_kernel<[^>]*, 64, 3, true, " .. hf .. ">"), out)
      assert.truthy(out:find("flash_fwd_wg2_kernel<[^>]*, 128, 2, true, " .. hf .. ">"), out)
      assert.truthy(out:find("flash_dkdv_wg2_kernel<[^>]*, 64, 4, true, " .. hf .. ", false>"), out)
      assert.truthy(out:find("flash_dkdv_wg2_kernel<[^>]*, 128, 3, false, " .. hf .. ", false>"), out)
      assert.truthy(out:find("flash_dq_wg2_kernel<[^>]*, 64, 4, " .. hf .. ", false, false>"), out)
      assert.truthy(out:find("flash_dq_wg2_kernel<[^>]*, 128, 3, " .. hf .. ", false, false>"), out)
      if mode == "1" then assert.falsy(out:find("flash_delta_kernel", 1, true), out)
      else assert.truthy(out:find("flash_delta_kernel", 1, true), out) end
    end
    helpers.remove_temps()
  end)

  -- Step 9b (EMBER_FLASH_DELTA9, read once: children; docs/flash.md "Step 9b"): with Step 9's schedule the dq
  -- kernel sums Δ from shared tiles of o (one more TMA tile) and dO instead of from global memory, by the same
  -- chunks in the same order, so every case of Step 9's script keeps its bits (also with EMBER_FLASH_PDL=1, where
  -- dk/dv's blocks read the Δ dq stored).
  it("gives the same bits with EMBER_FLASH_DELTA9=1 as with 0 (in children)", function()
    local script = helpers.temp_file(step9_script, ".lua")
    local got = {}
    for _, mode in ipairs({{"1", "0", "0"}, {"1", "1", "0"}, {"1", "1", "1"}}) do
      local path = helpers.temp(".safetensors")
      local tag = "EMBER_FLASH_STEP9=" .. mode[1] .. " EMBER_FLASH_DELTA9=" .. mode[2] .. " EMBER_FLASH_PDL=" .. mode[3]
      local _, err, code = helpers.ember({"run", script}, {env = {EMBER_FLASH_STEP9 = mode[1],
        EMBER_FLASH_DELTA9 = mode[2], EMBER_FLASH_PDL = mode[3], SCAN_SPEC_OUT = path}})
      assert.are.equal(0, code, tag .. ": " .. tostring(err))
      got[table.concat(mode)] = ember.load(path)
    end
    -- case 6 (Tq > Tk): no bottom_right
    assert.are.equal((7 * 3 - 1) * 5, C.assert_modes_agree(got, "100", {"110", "111"}))
    local _, err, code = helpers.ember({"run", script}, {env = {EMBER_FLASH_STEP9 = "1", EMBER_FLASH_DELTA9 = "2"}})
    assert.are_not.equal(0, code, "EMBER_FLASH_DELTA9=2 should fail")
    assert.matches("expected EMBER_FLASH_DELTA9 to be 1 or 0, got '2'", err, 1, true)
    helpers.remove_temps()
  end)

  -- ... and runs it: dq's D9 template argument (before RP, false here) true with the switch 1 or unset (the
  -- default), false with 0; no delta kernel either way.
  it("runs the dq kernel that sums Δ from shared memory with EMBER_FLASH_DELTA9=1 and by default (by its name, in children)", function()
    C.need_cupti(pending)
    local script = helpers.temp_file(names_script, ".lua")
    for _, mode in ipairs({"0", "1", ""}) do
      local out, err, code = helpers.ember({"run", script}, {env = {EMBER_FLASH_STEP9 = "1", EMBER_FLASH_DELTA9 = mode}})
      assert.are.equal(0, code, "EMBER_FLASH_DELTA9=" .. mode .. ": " .. tostring(err))
      local d9 = mode == "0" and "false" or "true"
      assert.truthy(out:find("flash_dq_wg2_kernel<[^>]*, 64, 4, true, " .. d9 .. ", false>"), out)
      assert.truthy(out:find("flash_dq_wg2_kernel<[^>]*, 128, 3, true, " .. d9 .. ", false>"), out)
      assert.falsy(out:find("flash_delta_kernel", 1, true), out)
    end
    helpers.remove_temps()
  end)
end)
