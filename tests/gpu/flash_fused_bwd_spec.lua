-- flash_fused_bwd_spec.lua (GPU, sm_90) — the fused wgmma backward
-- (kernels/flash_bwd_fused.cu, docs/flash.md "Step 5"): one kernel for dk, dv
-- and dq, dq added in f32 into a buffer (fused: the adds in a fixed order;
-- fused_nd: in arrival order), forced with core.flash_bwd_kernel("fused") /
-- ("fused_nd"), on every case of flash_wg_bwd_spec.lua: head dims 64 and 128, 80 and 96 (the D 128 kernel over
-- zero-filled columns, its dq_accum 128 wide, converted to the first 80 / 96: docs/flash.md "Step 7"),
-- bf16 and f16, causal top-left / bottom-right / none, GQA, Tq ≠ Tk both ways,
-- odd lengths, the (B, T, H, D) layout, a row stride that is not D, long sequences.
--
-- Bounds: flash_wg_bwd_spec.lua's — ‖got − ref‖ / ‖ref‖ of dq, dk, dv against
-- the f64 CPU reference no more than twice the naive composition's error in the
-- same half dtype plus 1e-4 (capped at 1e-2 bf16 / 2e-3 f16), and within the cap
-- of the mma.sync backward. Then against wg2 (auto's backward below T 4096) on the same
-- inputs: dk and dv are wg2's bits (the same wgmmas on the same 16-bit Pᵀ and
-- dSᵀ, in the same tile order; the tiles wg2 skips add exact zeros); dq sums
-- the same 16-bit dS·k products in another f32 order, so it is within one
-- rounding of the dtype of wg2's: ‖fused − wg2‖ / ‖wg2‖ ≤ 2^-7 (bf16) / 2^-10
-- (f16), the largest relative spacing of the dtype (a wrong tile is O(1) off).
-- fused gives the same bits on repeat; fused_nd need not, but stays within
-- that rounding of fused. Every case prints its errors.
local ember = require "ember"
local core = ember.core

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local C, helpers = dofile(here .. "compare.lua")
local rel = C.rel_error

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local CAP = {bf16 = 1e-2, f16 = 2e-3}
local ULP = {bf16 = 2 ^ -7, f16 = 2 ^ -10}   -- a 16-bit rounding, relative, at its largest
local randn = helpers.seeded(11500).randn
local bthd, wide = C.bthd, C.wide

local ref64, flash, naive, max_abs = C.attn_ref64, C.flash_grads, C.naive_grads, C.max_abs

local NAMES = {"dq", "dk", "dv"}
local KERNELS = {"fused", "fused_nd"}

-- dq against wg2's (or fused's): within one rounding of the dtype; both exactly 0 passes
local function near(got, want, dt, what)
  if want:abs():max():item() == 0 then
    local m = got:cpu():to("f64"):abs():max():item()
    assert.is_true(m <= 1e-5, string.format("%s: expected 0, got max |dq| %.3g", what, m))
    return
  end
  local e = rel(got, want)
  assert.is_true(e <= ULP[got.dtype], string.format("%s: ‖dq − wg2's‖ / ‖wg2's‖ %.3g > %.3g", what, e, ULP[got.dtype]))
end

local function check(sq, sk, dt, causal, opts)
  opts = opts or {}
  local q, k, v, g = randn(sq, dt), randn(sk, dt), randn(sk, dt), randn(sq, dt)
  q, k, v, g = q:cuda(), k:cuda(), v:cuda(), g:cuda()
  local lay = opts.layout   -- applied to the kernels' inputs on the GPU (a copy to the GPU is contiguous)
  local ref = ref64(q, k, v, g, causal)
  -- every result stays referenced to the end of the case (no reuse of another's memory hides unwritten rows)
  local mm = flash("mma", q, k, v, g, causal, lay)
  local nv = naive(q, k, v, g, causal)
  local w2 = flash("wg2", q, k, v, g, causal, lay)
  local got = {fused = flash("fused", q, k, v, g, causal, lay), fused_nd = flash("fused_nd", q, k, v, g, causal, lay)}
  local shape = string.format("%s q%s k%s causal=%s", dt, table.concat(sq, "x"), table.concat(sk, "x"),
    tostring(causal))
  for _, name in ipairs(NAMES) do
    local em, en = rel(mm[name], ref[name]), rel(nv[name], ref[name])
    for _, kname in ipairs(KERNELS) do
      local x = got[kname][name]
      local what = kname .. " " .. shape .. " " .. name
      local ew, ewm, e2 = rel(x, ref[name]), rel(x, mm[name]), rel(x, w2[name])
      print(string.format("  %-56s: %s %.3g mma %.3g naive %.3g vs-mma %.3g vs-wg2 %.3g max|err| %.3g", what, kname, ew,
        em, en, ewm, e2, max_abs(x, ref[name])))
      assert.are.equal(dt, x.dtype, what .. " dtype")
      if ref[name]:abs():max():item() == 0 then
        -- one key: no slope, dq = dk = 0 exactly; rounding residue only (as flash_wg_bwd_spec)
        local m = x:cpu():to("f64"):abs():max():item()
        assert.is_true(m <= 1e-5, string.format("%s: reference 0, got max |%s| %.3g", what, name, m))
      else
        local bound = math.min(2 * en + 1e-4, CAP[dt])
        assert.is_true(ew <= bound, string.format("%s: error %.3g > %.3g (naive %.3g, mma %.3g)", what, ew, bound, en,
          em))
        assert.is_true(ewm <= CAP[dt], string.format("%s: vs mma %.3g > %.3g", what, ewm, CAP[dt]))
      end
      if name == "dq" then
        -- (an exactly zero reference was held to its residue above: two kernels' residues need not agree)
        if ref.dq:abs():max():item() ~= 0 then near(x, w2.dq, dt, what) end
      else
        local d = max_abs(x, w2[name])
        assert.are.equal(0, d, string.format("%s: expected wg2's bits, max |%s − wg2| %.3g", what, name, d))
      end
    end
  end
end

-- how dq leaves the fused kernel (EMBER_FLASH_DQ, read once by the engine): bulk (Step 5b, the default) or red
-- (Step 5's per-thread adds); every case below runs on whichever is set, so one run per setting A/Bs them
print("  EMBER_FLASH_DQ=" .. (os.getenv("EMBER_FLASH_DQ") or "(unset: bulk)"))
-- fused's dq order (Step 5d): EMBER_FLASH_DET_CHAINS copies of dq_accum (1: Step 5's one chain), the writer's
-- counter bump a tile late (EMBER_FLASH_DET_LAZY, default on); also read once: one run per setting A/Bs them
print("  EMBER_FLASH_DET_CHAINS=" .. (os.getenv("EMBER_FLASH_DET_CHAINS") or "(unset: 2)") ..
  "  EMBER_FLASH_DET_LAZY=" .. (os.getenv("EMBER_FLASH_DET_LAZY") or "(unset: 1)") ..
  "  EMBER_FLASH_DET_WRITERS=" .. (os.getenv("EMBER_FLASH_DET_WRITERS") or "(unset: 3)") ..
  "  EMBER_FLASH_DET_STORE_FIRST=" .. (os.getenv("EMBER_FLASH_DET_STORE_FIRST") or "(unset: 1 with three writers)") ..
  "  EMBER_FLASH_DET_GROUPS=" .. (os.getenv("EMBER_FLASH_DET_GROUPS") or "(unset: 2 with three writers)") ..
  "  EMBER_FLASH_BWD_DQ_FIRST=" ..
  (os.getenv("EMBER_FLASH_BWD_DQ_FIRST") or "(unset: 2 at D 64 with three writers, else 0)"))

describe("flash attention's fused wgmma backward (sm_90)", function()
  local why = C.sm90_unavailable(function()
    local x = ember.randn({1, 1, 32, 64}, {dtype = "bf16"}):cuda()
    flash("fused", x, x, x, x, true)
  end)
  if why then
    it("needs an sm_90 GPU", function() pending(why) end)   -- reported skipped, with the reason
    return
  end

  it("is chosen by name, and forced, names what it lacks", function()
    local prev = core.flash_bwd_kernel("fused")
    assert.are.equal("fused", core.flash_bwd_kernel("fused_nd"))
    assert.are.equal("fused_nd", core.flash_bwd_kernel(prev))
    local x = ember.randn({1, 1, 40, 32}, {dtype = "bf16"}):cuda()
    local x32 = ember.randn({1, 1, 40, 64}):cuda()
    for _, kname in ipairs(KERNELS) do
      local ok1, err1 = pcall(flash, kname, x, x, x, x, true)
      assert.is_false(ok1, kname .. " at head dim 32 ran")
      assert.matches("(EMBER_FLASH_BWD=" .. kname .. ") expect head dim 64 or 128 (80 and 96 run as 128 unless "
        .. "EMBER_FLASH_WG_PAD=0), got 32", tostring(err1), 1, true)
      local tf = ember.backends.tf32(true)
      local ok2, err2 = pcall(flash, kname, x32, x32, x32, x32, true)
      ember.backends.tf32(tf)
      assert.is_false(ok2, kname .. " in f32 ran")
      assert.matches("(EMBER_FLASH_BWD=" .. kname .. ") expect bf16 or f16, got f32", tostring(err2), 1, true)
    end
  end)

  for _, d in ipairs({64, 80, 96, 128}) do
    for _, dt in ipairs({"bf16", "f16"}) do
      it(string.format("matches the reference, mma and wg2: D %d, %s, odd lengths, all masks", d, dt), function()
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
      check({1, 8, 129, d}, {1, 1, 129, d}, "bf16", true)           -- multi-query: 8 q heads into one block's dk, dv
      check({1, 2, 17, d}, {1, 2, 1000, d}, "bf16", "bottom_right") -- few queries, many key blocks add to one dq tile
      check({1, 6, 1000, d}, {1, 2, 257, d}, "f16", false)          -- GQA 3, Tq > Tk, no mask
      -- tiles the second consumer's keys are not seen by (computed, P = 0: zeros into dk, dv, dq)
      check({1, 8, 70, d}, {1, 1, 300, d}, "bf16", true)
      check({1, 8, 40, d}, {1, 1, 300, d}, "f16", true)
    end)

    it(string.format("runs long sequences through the stage ring and the dSᵀ buffers, and the (B, T, H, D) layout: D %d",
      d), function()
      check({1, 1, 4097, d}, {1, 1, 4097, d}, "bf16", true)
      check({1, 2, 1500, d}, {1, 1, 4097, d}, "f16", "bottom_right")
      check({2, 4, 130, d}, {2, 2, 130, d}, "bf16", true, {layout = bthd})
      check({1, 4, 200, d}, {1, 2, 333, d}, "f16", "bottom_right", {layout = wide})   -- row stride D + 48
    end)
  end

  local function bwd_kernels(kernel, q, k, v, g)
    return C.kernel_names(function() flash(kernel, q, k, v, g, true) end)
  end

  it("runs one kernel for dk, dv and dq (and dq's conversion), not wg2's two; auto runs wg2 below T 4096, fused from it",
    function()
    C.need_cupti(pending)
    local q, k, v, g = randn({1, 2, 300, 128}, "bf16"):cuda(), randn({1, 2, 300, 128}, "bf16"):cuda(),
      randn({1, 2, 300, 128}, "bf16"):cuda(), randn({1, 2, 300, 128}, "bf16"):cuda()
    for _, kname in ipairs(KERNELS) do
      local ks = bwd_kernels(kname, q, k, v, g)
      assert.truthy(ks:find("flash_bwd_fused_kernel", 1, true), ks)
      assert.truthy(ks:find("flash_dq_convert_kernel", 1, true), ks)
      assert.falsy(ks:find("flash_dkdv_wg2_kernel", 1, true), ks)   -- (the forward is flash_fwd_wg2_kernel)
      assert.falsy(ks:find("flash_dq_wg2_kernel", 1, true), ks)
      assert.falsy(ks:find("flash_dkdv_kernel", 1, true), ks)
    end
    local ka = bwd_kernels("auto", q, k, v, g)
    assert.truthy(ka:find("flash_dkdv_wg2_kernel", 1, true), ka)
    assert.falsy(ka:find("fused", 1, true), ka)
    -- kAutoFusedMinT (flash_bwd_wg.cu): Tq and Tk both 4096 or more; 4095 keys stay on wg2
    local function long(tq, tk)
      return randn({1, 1, tq, 64}, "bf16"):cuda(), randn({1, 1, tk, 64}, "bf16"):cuda(),
        randn({1, 1, tk, 64}, "bf16"):cuda(), randn({1, 1, tq, 64}, "bf16"):cuda()
    end
    local kl = bwd_kernels("auto", long(4096, 4096))
    assert.truthy(kl:find("flash_bwd_fused_kernel", 1, true), kl)
    assert.falsy(kl:find("flash_dkdv_wg2_kernel", 1, true), kl)
    local ks = bwd_kernels("auto", long(4096, 4095))
    assert.truthy(ks:find("flash_dkdv_wg2_kernel", 1, true), ks)
    assert.falsy(ks:find("fused", 1, true), ks)
    -- D 80 from T 4096: the D 128 fused kernel (EMBER_FLASH_WG_PAD=1, the default)
    local q8, k8, v8, g8 = randn({1, 1, 4096, 80}, "bf16"):cuda(), randn({1, 1, 4096, 80}, "bf16"):cuda(),
      randn({1, 1, 4096, 80}, "bf16"):cuda(), randn({1, 1, 4096, 80}, "bf16"):cuda()
    local k80 = bwd_kernels("auto", q8, k8, v8, g8)
    assert.truthy(k80:find("flash_bwd_fused_kernel<[^,>]*, 128,"), k80)
    assert.falsy(k80:find("flash_dkdv_kernel", 1, true), k80)
  end)

  it("rejects a bad EMBER_FLASH_DET_CHAINS, naming the expected range (in a child)", function()
    local script = helpers.temp_file([[
local ember = require "ember"
local core = ember.core
core.flash_bwd_kernel("fused")
local x = ember.randn({1, 1, 256, 64}, {dtype = "bf16"}):cuda():requires_grad_()
ember.nn.functional.flash_attention(x, x, x, true):sum():backward()
print(x.grad:to("f32"):abs():sum():item())
]], ".lua")
    for _, bad in ipairs({"0", "9", "two"}) do
      local _, err, code = helpers.ember({"run", script}, {env = {EMBER_FLASH_DET_CHAINS = bad}})
      assert.are_not.equal(0, code, "EMBER_FLASH_DET_CHAINS=" .. bad .. " should fail")
      assert.matches("expected EMBER_FLASH_DET_CHAINS to be an integer from 1 to 8, got '" .. bad .. "'", err, 1, true)
    end
    for _, good in ipairs({"1", "3", "8"}) do
      local out, err, code = helpers.ember({"run", script}, {env = {EMBER_FLASH_DET_CHAINS = good}})
      assert.are.equal(0, code, "EMBER_FLASH_DET_CHAINS=" .. good .. ": " .. tostring(err))
      assert.is_truthy(tonumber(out:match("[%d.e+-]+")), "EMBER_FLASH_DET_CHAINS=" .. good .. " printed " .. out)
    end
  end)

  -- A child script (run under a switch by C.mode_results): for each backward kernel of kernels, each case
  -- {dtype, q shape, k/v shape} of the Lua table source cases and each mask, one seeded backward's dq, dk, dv
  -- saved under "d?_<kernel>_<case>_<mask>".
  local function grads_script(cases, kernels)
    return helpers.temp_file(([[
local ember = require "ember"
local out = {}
local cases = %s
for _, kname in ipairs({"%s"}) do
  ember.core.flash_bwd_kernel(kname)
  for i, c in ipairs(cases) do
    -- (bottom-right with Tq > Tk is refused by the API: those cases run top-left and unmasked only)
    for j, causal in ipairs({true, "bottom_right", false}) do
      if causal == "bottom_right" and c[2][3] > c[3][3] then goto next_mask end
      ember.manual_seed(100 * i + j)
      local function leaf(shape) return ember.randn(shape, {dtype = c[1]}):cuda():requires_grad_() end
      local q, k, v = leaf(c[2]), leaf(c[3]), leaf(c[3])
      local g = ember.randn(c[2], {dtype = c[1]}):cuda()
      ember.nn.functional.flash_attention(q, k, v, causal):backward(g)
      local key = kname .. "_" .. i .. "_" .. tostring(causal)
      out["dq_" .. key], out["dk_" .. key], out["dv_" .. key] = q.grad:cpu(), k.grad:cpu(), v.grad:cpu()
      ::next_mask::
    end
  end
end
ember.save(os.getenv("SCAN_SPEC_OUT"), out)
]]):format(cases, table.concat(kernels, '", "')), ".lua")
  end

  -- fused's dq writers (EMBER_FLASH_DET_WRITERS, read once: children; docs/flash.md "Step 5e", "Step 10"): two
  -- warps taking the even and the odd tiles (default), Step 5d's one, or three taking tiles jt % 3 (warp 0 then
  -- stages lse/Δ beside its copies; one named barrier per consumer and writer for both dq full and empty); the
  -- counters fix the order of dq's adds in every setting, so the bits must be the same. The cases: many key blocks
  -- and q tiles (every writer busy, GQA), one tile a block (the other writers have none), two tiles (the third
  -- has none), a 4100-long head (65 q tiles: the counters' waits and the writers' three-tile cycle in steady
  -- state), both head dims and all masks.
  it("gives the same bits with one, two or three dq writers (EMBER_FLASH_DET_WRITERS, in children)", function()
    local script = grads_script([[{{"bf16", {2, 4, 777, 64}, {2, 2, 777, 64}}, {"f16", {1, 8, 2100, 128}, {1, 2, 2100, 128}},
  {"bf16", {1, 2, 17, 64}, {1, 2, 1000, 64}}, {"bf16", {1, 2, 1000, 128}, {1, 2, 1000, 128}},
  {"f16", {1, 2, 100, 64}, {1, 2, 1000, 64}}, {"bf16", {1, 4, 4100, 64}, {1, 4, 4100, 64}}}]], {"fused"})
    -- (store first and range groups need three writers: off here, whatever this run's setting)
    local got = C.mode_results(helpers, script, "EMBER_FLASH_DET_WRITERS", {"2", "1", "3"},
      {EMBER_FLASH_DET_STORE_FIRST = "0", EMBER_FLASH_DET_GROUPS = "1", EMBER_FLASH_BWD_DQ_FIRST = "0"})
    assert.are.equal(6 * 3 * 3, C.assert_modes_agree(got, "2", {"1", "3"}))
    local _, err, code = helpers.ember({"run", script}, {env = {EMBER_FLASH_DET_WRITERS = "4",
      EMBER_FLASH_DET_STORE_FIRST = "0"}})
    assert.are_not.equal(0, code, "EMBER_FLASH_DET_WRITERS=4 should fail")
    assert.matches("expected EMBER_FLASH_DET_WRITERS to be 3, 2 or 1, got '4'", err, 1, true)
    helpers.remove_temps()
  end)

  -- store first (EMBER_FLASH_DET_STORE_FIRST=1, with three writers; docs/flash.md "Step 10"): dq_accum is not
  -- zeroed; each tile's first adder in its copy stores its half, and the conversion reads only the copies the
  -- tile's counters say were written. The same sums in the same order (0 + x is x), so the same values — compared
  -- with ne, which also takes an exact zero's sign as equal (the store keeps a −0 that 0 + −0 would make +0). The
  -- cases: Tq > Tk (q tiles past the last key block; top-left and unmasked only: the API refuses bottom-right
  -- there), Tq < Tk, ragged lengths, GQA, one key block, chains' copies a tile's
  -- first rows never reach, both head dims, every mask.
  it("gives the same values with EMBER_FLASH_DET_STORE_FIRST=1 as with 0 (three writers, in children)", function()
    local script = grads_script([[{{"bf16", {2, 4, 777, 64}, {2, 2, 777, 64}}, {"f16", {1, 8, 2100, 128}, {1, 2, 2100, 128}},
  {"bf16", {1, 2, 17, 64}, {1, 2, 1000, 64}}, {"bf16", {1, 2, 1000, 128}, {1, 2, 100, 128}},
  {"f16", {1, 4, 700, 64}, {1, 2, 90, 64}}, {"bf16", {1, 4, 4100, 64}, {1, 4, 4100, 64}}}]], {"fused"})
    local got = C.mode_results(helpers, script, "EMBER_FLASH_DET_STORE_FIRST", {"0", "1"},
      {EMBER_FLASH_DET_WRITERS = "3"})
    assert.are.equal((6 * 3 - 2) * 3, C.assert_modes_agree(got, "0", {"1"}))
    local _, err, code = helpers.ember({"run", script}, {env = {EMBER_FLASH_DET_STORE_FIRST = "2"}})
    assert.are_not.equal(0, code, "EMBER_FLASH_DET_STORE_FIRST=2 should fail")
    assert.matches("expected EMBER_FLASH_DET_STORE_FIRST to be 0 or 1, got '2'", err, 1, true)
    _, err, code = helpers.ember({"run", script},
      {env = {EMBER_FLASH_DET_STORE_FIRST = "1", EMBER_FLASH_DET_WRITERS = "2"}})
    assert.are_not.equal(0, code, "EMBER_FLASH_DET_STORE_FIRST=1 with two writers should fail")
    assert.matches("EMBER_FLASH_DET_STORE_FIRST=1 needs EMBER_FLASH_DET_WRITERS=3, got 2", err, 1, true)
    helpers.remove_temps()
  end)

  -- range-grouped chains (EMBER_FLASH_DET_GROUPS, read once: children; docs/flash.md "Step 10b"): the key blocks cut
  -- into ranges, each with its own chains and copies of dq_accum, dispatched range by range across the heads. Another
  -- fixed order of dq's adds: the same bits on repeat (two children per setting), dk and dv the default's bits (their
  -- order is not the counters'), dq within a 16-bit rounding of the default's (the same products summed in another
  -- f32 order; a wrong or missing tile is O(1) off). The cases: many key blocks and heads (ranges across heads), GQA,
  -- one key block (one range, the others empty), fewer key blocks than ranges, a 4100-long head (33 key blocks:
  -- uneven ranges), both head dims, every mask; 2, 3 and 8 ranges, chains 1 and 2 in a range, store first on
  -- (default) and off.
  it("gives bit-identical repeats and dq within a rounding with EMBER_FLASH_DET_GROUPS (in children)", function()
    local script = grads_script([[{{"bf16", {2, 4, 777, 64}, {2, 2, 777, 64}}, {"f16", {1, 8, 2100, 128}, {1, 2, 2100, 128}},
  {"bf16", {1, 2, 17, 64}, {1, 2, 100, 64}}, {"bf16", {1, 2, 1000, 128}, {1, 2, 300, 128}},
  {"f16", {1, 4, 700, 64}, {1, 2, 90, 64}}, {"bf16", {1, 4, 4100, 64}, {1, 4, 4100, 64}}}]], {"fused"})
    local ncase = (6 * 3 - 2) * 3   -- two cases with Tq > Tk skip bottom-right
    -- {the other switches, the group counts tried} (each run twice: 14 children in all, with the errors')
    local runs = {{{}, {"2", "8"}}, {{EMBER_FLASH_DET_CHAINS = "1"}, {"3"}}, {{EMBER_FLASH_DET_STORE_FIRST = "0"}, {"2"}}}
    local defaults
    for _, run in ipairs(runs) do
      local env, groups = run[1], run[2]
      local what = next(env) and (next(env) .. "=" .. env[next(env)]) or "defaults"
      local a = C.mode_results(helpers, script, "EMBER_FLASH_DET_GROUPS", {"1", table.unpack(groups)}, env)
      local b = C.mode_results(helpers, script, "EMBER_FLASH_DET_GROUPS", groups, env)
      defaults = defaults or a
      for _, g in ipairs(groups) do
        -- repeat: every tensor the same bits
        assert.are.equal(ncase, C.assert_modes_agree({first = a[g], again = b[g]}, "first", {"again"}))
        local n = 0
        for name, t in pairs(a["1"]) do
          local x = a[g][name]
          if name:match("^dq_") then
            near(x, t, t.dtype, what .. ": EMBER_FLASH_DET_GROUPS=" .. g .. " " .. name .. " vs groups 1")
          else
            assert.are.equal(0, x:ne(t):sum():item(), what .. ": EMBER_FLASH_DET_GROUPS=" .. g .. " " .. name ..
              ": expected the default's bits")
          end
          n = n + 1
        end
        assert.are.equal(ncase, n)
      end
    end
    -- unset: 2 with three writers (the default), 1 with two (range groups need three; two writers add in the
    -- counters' order too, so groups 1's bits)
    local unset = C.mode_results(helpers, script, "EMBER_FLASH_DET_GROUPS", {""}, {})
    assert.are.equal(ncase, C.assert_modes_agree({two = defaults["2"], unset = unset[""]}, "two", {"unset"}))
    unset = C.mode_results(helpers, script, "EMBER_FLASH_DET_GROUPS", {""},
      {EMBER_FLASH_DET_WRITERS = "2", EMBER_FLASH_DET_STORE_FIRST = "0", EMBER_FLASH_BWD_DQ_FIRST = "0"})
    assert.are.equal(ncase, C.assert_modes_agree({one = defaults["1"], unset = unset[""]}, "one", {"unset"}))
    local _, err, code = helpers.ember({"run", script}, {env = {EMBER_FLASH_DET_GROUPS = "9"}})
    assert.are_not.equal(0, code, "EMBER_FLASH_DET_GROUPS=9 should fail")
    assert.matches("expected EMBER_FLASH_DET_GROUPS to be an integer from 1 to 8, got '9'", err, 1, true)
    _, err, code = helpers.ember({"run", script}, {env = {EMBER_FLASH_DET_GROUPS = "2", EMBER_FLASH_DET_WRITERS = "2",
      EMBER_FLASH_DET_STORE_FIRST = "0"}})
    assert.are_not.equal(0, code, "EMBER_FLASH_DET_GROUPS=2 with two writers should fail")
    assert.matches("EMBER_FLASH_DET_GROUPS=2 needs EMBER_FLASH_DET_WRITERS=3, got 2", err, 1, true)
    _, err, code = helpers.ember({"run", script}, {env = {EMBER_FLASH_DET_GROUPS = "8", EMBER_FLASH_DET_CHAINS = "3"}})
    assert.are_not.equal(0, code, "EMBER_FLASH_DET_GROUPS=8 with 3 chains (24 copies) should fail")
    assert.matches("(copies of dq_accum) to be at most 16, got 8 × 3", err, 1, true)
    helpers.remove_temps()
  end)

  -- the consumer loop's instruction diet (EMBER_FLASH_BWD_STEP6, read once: children; docs/flash.md "Step 6"):
  -- descriptors advanced by an add, a uniform consumer index, tile indices stepped instead of divided. The same
  -- wgmmas on the same operands in the same order, so fused's gradients keep their bits, and fused_nd's dk, dv
  -- too (its dq's f32 adds land in arrival order on any setting: within one rounding of the other's). Both head
  -- dims, bf16 and f16, GQA (2, 4), every mask, odd lengths, Tq = Tk and Tq < Tk, one q tile and many.
  it("gives the same bits with EMBER_FLASH_BWD_STEP6=1 as with 0 (in children)", function()
    local script = grads_script([[{{"bf16", {2, 4, 777, 64}, {2, 2, 777, 64}}, {"f16", {1, 8, 1000, 128}, {1, 2, 1000, 128}},
  {"bf16", {1, 2, 17, 64}, {1, 2, 1000, 64}}, {"bf16", {1, 4, 333, 128}, {1, 1, 1000, 128}},
  {"f16", {1, 2, 300, 64}, {1, 2, 300, 64}}}]], {"fused", "fused_nd"})
    -- (dq first needs STEP6=1: off here, whatever this run's setting)
    local got = C.mode_results(helpers, script, "EMBER_FLASH_BWD_STEP6", {"0", "1"}, {EMBER_FLASH_BWD_DQ_FIRST = "0"})
    -- fused_nd's dq apart: not the same bits from run to run on either setting
    local nd = {}
    for _, mode in ipairs({"0", "1"}) do
      nd[mode] = {}
      for name, t in pairs(got[mode]) do
        if name:match("^dq_fused_nd_") then nd[mode][name], got[mode][name] = t, nil end
      end
    end
    assert.are.equal(5 * 3 * 3 * 2 - 5 * 3, C.assert_modes_agree(got, "0", {"1"}))
    local n = 0
    for name, t in pairs(nd["0"]) do
      near(nd["1"][name], t, t.dtype, "fused_nd " .. name .. " STEP6=1 vs 0")
      n = n + 1
    end
    assert.are.equal(5 * 3, n)
    local _, err, code = helpers.ember({"run", script}, {env = {EMBER_FLASH_BWD_STEP6 = "2"}})
    assert.are_not.equal(0, code, "EMBER_FLASH_BWD_STEP6=2 should fail")
    assert.matches("expected EMBER_FLASH_BWD_STEP6 to be 1 or 0, got '2'", err, 1, true)
    helpers.remove_temps()
  end)

  -- dq first (EMBER_FLASH_BWD_DQ_FIRST, read once: children; docs/flash.md "Step 11"): 1, turn B issues dq(j − 1)
  -- first, in a commit group of its own, and hands it to the writer while dv's and dk's wgmmas run; 2, also dSᵀ's
  -- proxy fence off the softmax's tail (D 64: dk's A from registers, as wg2's; D 128: a 2-stage ring, three dSᵀ
  -- buffers stored in turn A, the fence before dk's issue). The same products in the same order, and the counters'
  -- order of dq's adds, so fused's gradients keep their bits — with range groups (2, the default) and without (1) —
  -- and repeat them; unset, the default (2 at D 64, 0 at D 128 or where 2 cannot run), too. The cases: many key blocks, GQA (2, 4), one q tile a block,
  -- Tq < Tk, long heads (65 and 33 q tiles: both dSᵀ buffer rings and the writers in steady state), both head dims,
  -- bf16 and f16, every mask.
  it("gives the same bits with EMBER_FLASH_BWD_DQ_FIRST=1 and 2 as with 0 (in children)", function()
    local script = grads_script([[{{"bf16", {2, 4, 777, 64}, {2, 2, 777, 64}}, {"f16", {1, 8, 1000, 128}, {1, 2, 1000, 128}},
  {"bf16", {1, 2, 17, 64}, {1, 2, 1000, 64}}, {"bf16", {1, 4, 333, 128}, {1, 1, 1000, 128}},
  {"bf16", {1, 4, 4100, 64}, {1, 4, 4100, 64}}, {"f16", {1, 2, 2100, 128}, {1, 2, 2100, 128}}}]], {"fused"})
    local ncase = 6 * 3 * 3
    -- range groups 2 (the default): every mode, and each new one twice; groups 1: mode 2 against 0
    local g2 = {EMBER_FLASH_DET_GROUPS = "2"}
    local a = C.mode_results(helpers, script, "EMBER_FLASH_BWD_DQ_FIRST", {"0", "1", "2"}, g2)
    local b = C.mode_results(helpers, script, "EMBER_FLASH_BWD_DQ_FIRST", {"1", "2"}, g2)
    assert.are.equal(ncase, C.assert_modes_agree(a, "0", {"1", "2"}))
    for _, mode in ipairs({"1", "2"}) do
      assert.are.equal(ncase, C.assert_modes_agree({first = a[mode], again = b[mode]}, "first", {"again"}))
    end
    a = C.mode_results(helpers, script, "EMBER_FLASH_BWD_DQ_FIRST", {"0", "2"}, {EMBER_FLASH_DET_GROUPS = "1"})
    assert.are.equal(ncase, C.assert_modes_agree(a, "0", {"2"}))
    local _, err, code = helpers.ember({"run", script}, {env = {EMBER_FLASH_BWD_DQ_FIRST = "3"}})
    assert.are_not.equal(0, code, "EMBER_FLASH_BWD_DQ_FIRST=3 should fail")
    assert.matches("expected EMBER_FLASH_BWD_DQ_FIRST to be 0, 1 or 2, got '3'", err, 1, true)
    _, err, code = helpers.ember({"run", script}, {env = {EMBER_FLASH_BWD_DQ_FIRST = "1", EMBER_FLASH_DET_WRITERS = "2",
      EMBER_FLASH_DET_STORE_FIRST = "0", EMBER_FLASH_DET_GROUPS = "1"}})
    assert.are_not.equal(0, code, "EMBER_FLASH_BWD_DQ_FIRST=1 with two writers should fail")
    assert.matches("EMBER_FLASH_BWD_DQ_FIRST=1 needs EMBER_FLASH_DET_WRITERS=3, EMBER_FLASH_BWD_STEP6=1 and " ..
      "EMBER_FLASH_DQ=bulk, got 2, 1 and bulk", err, 1, true)
    _, err, code = helpers.ember({"run", script}, {env = {EMBER_FLASH_BWD_DQ_FIRST = "2", EMBER_FLASH_BWD_STEP6 = "0"}})
    assert.are_not.equal(0, code, "EMBER_FLASH_BWD_DQ_FIRST=2 with STEP6=0 should fail")
    assert.matches("EMBER_FLASH_BWD_DQ_FIRST=2 needs EMBER_FLASH_DET_WRITERS=3, EMBER_FLASH_BWD_STEP6=1 and " ..
      "EMBER_FLASH_DQ=bulk, got 3, 0 and bulk", err, 1, true)
    -- unset: 2 at D 64 where it can run, else 0 — so two writers or STEP6=0 alone still work, with the same bits
    local unset = C.mode_results(helpers, script, "EMBER_FLASH_BWD_DQ_FIRST", {""}, {})
    assert.are.equal(ncase, C.assert_modes_agree({zero = a["0"], unset = unset[""]}, "zero", {"unset"}))
    for _, env in ipairs({{EMBER_FLASH_DET_WRITERS = "2", EMBER_FLASH_DET_STORE_FIRST = "0"},
                          {EMBER_FLASH_BWD_STEP6 = "0"}}) do
      unset = C.mode_results(helpers, script, "EMBER_FLASH_BWD_DQ_FIRST", {""}, env)
      assert.are.equal(ncase, C.assert_modes_agree({zero = a["0"], unset = unset[""]}, "zero", {"unset"}))
    end
    helpers.remove_temps()
  end)

  it("fused gives bit-identical gradients on repeat (dq's adds in a fixed order); fused_nd within a rounding", function()
    local q, k, v, g = randn({1, 8, 2100, 128}, "f16"):cuda(), randn({1, 2, 2100, 128}, "f16"):cuda(),
      randn({1, 2, 2100, 128}, "f16"):cuda(), randn({1, 8, 2100, 128}, "f16"):cuda()
    local q6, k6, v6, g6 = randn({2, 4, 777, 64}, "bf16"):cuda(), randn({2, 2, 777, 64}, "bf16"):cuda(),
      randn({2, 2, 777, 64}, "bf16"):cuda(), randn({2, 4, 777, 64}, "bf16"):cuda()
    local q8, k8, v8, g8 = randn({2, 4, 777, 80}, "bf16"):cuda(), randn({2, 2, 777, 80}, "bf16"):cuda(),
      randn({2, 2, 777, 80}, "bf16"):cuda(), randn({2, 4, 777, 80}, "bf16"):cuda()
    for _, causal in ipairs({true, "bottom_right", false}) do
      for _, c in ipairs({{q, k, v, g}, {q6, k6, v6, g6}, {q8, k8, v8, g8}}) do
        local a = flash("fused", c[1], c[2], c[3], c[4], causal)
        for _ = 1, 2 do
          local b = flash("fused", c[1], c[2], c[3], c[4], causal)
          for _, name in ipairs(NAMES) do
            assert.are.equal(0, max_abs(a[name], b[name]), string.format("fused %s moved: D %d causal=%s", name,
              c[1].shape[4], tostring(causal)))
          end
        end
        local n = flash("fused_nd", c[1], c[2], c[3], c[4], causal)
        near(n.dq, a.dq, c[1].dtype, string.format("fused_nd vs fused, D %d causal=%s", c[1].shape[4], tostring(causal)))
        for _, name in ipairs({"dk", "dv"}) do
          assert.are.equal(0, max_abs(n[name], a[name]), "fused_nd " .. name .. " is not fused's")
        end
      end
    end
  end)
end)
