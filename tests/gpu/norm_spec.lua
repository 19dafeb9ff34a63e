-- norm_spec.lua (GPU) — fused RMSNorm forward/backward on CUDA
-- (kernels/norm.cu) against the CPU reference.
--
-- Error measure: ‖got − want‖ / ‖want‖ in f64 on the CPU. Tolerances:
--   * f32: 1e-5 — both in f32; the CPU sums squares and dot products in
--     double, the GPU in f32 trees (relative error ~1e-7·log2(D)).
--   * bf16: 1e-2 — one rounding to bf16 on both sides, a few flip.
-- dw is a sum over all rows; it is compared the same way, and checked to be
-- bit-identical across runs (fixed-order reduction, no atomics).
local ember = require "ember"
local F = ember.nn.functional

local C, H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "compare.lua")
local rel, close = C.rel_error, C.assert_rel

local randn = H.seeded(4000).randn

local TOL = {f32 = 1e-5, bf16 = 1e-2}

local function check(shape, dt, wdt, what)
  local D = shape[#shape]
  local x = randn(shape, dt, 2)
  local w = wdt and randn({D}, wdt) or nil
  local g = randn(shape, dt)
  local xc = x:clone(); xc.requires_grad = true
  local xg = x:cuda(); xg.requires_grad = true
  local wc, wg
  if w then
    wc = w:clone(); wc.requires_grad = true
    wg = w:cuda(); wg.requires_grad = true
  end
  local yc, yg = F.rmsnorm(xc, wc, 1e-5), F.rmsnorm(xg, wg, 1e-5)
  assert.equals(dt, yg.dtype)
  close(yg, yc, TOL[dt], what .. " y")
  yc:backward(g)
  yg:backward(g:cuda())
  close(xg.grad, xc.grad, TOL[dt], what .. " dx")
  if w then close(wg.grad, wc.grad, TOL[wdt] or TOL[dt], what .. " dw") end
  return xg, wg, g
end

describe("rmsnorm on CUDA", function()
  assert.is_true(ember.cuda.is_available(), "the GPU specs need a CUDA device")

  for _, dt in ipairs {"f32", "bf16"} do
    it(dt .. ": (67, 1600) with weight (the xl model's rows), forward and backward", function()
      check({67, 1600}, dt, dt, dt)
    end)
    it(dt .. ": (3, 11, 37) odd D, with weight", function() check({3, 11, 37}, dt, dt, dt) end)
    it(dt .. ": (29, 64) without weight", function() check({29, 64}, dt, nil, dt) end)
  end

  -- every launch configuration of the backward: 32 threads a row with 1 to
  -- 4 16-byte chunks a thread, 64, 128 and 256 with 3 or 4 (f32 64, 200,
  -- 352, 512 | 768, 1024 | 1536, 1600 | 3072, 4096; bf16 twice the columns),
  -- and the block kernel past 1024 chunks (or rows not a whole number of
  -- chunks); 3001 rows give every block several row tiles, one last tile with
  -- rows missing, and the weight gradient's in-kernel sum several groups of
  -- 16 blocks and a last group partly filled
  local widths = {f32 = {64, 200, 352, 512, 768, 1024, 1536, 1600, 3072, 4096, 4100, 8192},
                  bf16 = {256, 512, 768, 1024, 1536, 1600, 3072, 4096, 6144, 8192, 16384}}
  for _, dt in ipairs {"f32", "bf16"} do
    for _, d in ipairs(widths[dt]) do
      local rows = d <= 1600 and 3001 or 37
      it(("%s: (%d, %d) with an f32 weight: backward configuration for %d columns"):format(dt, rows, d, d), function()
        check({rows, d}, dt, "f32", ("%s (%d, %d)"):format(dt, rows, d))
      end)
    end
  end

  -- 16-bit rows at 2 chunks a thread (the default; u = gy·w and x held from
  -- the dot pass for the gx pass): each threads-a-row step's edges, a last
  -- chunk that only one thread of the row holds (264 = 33 chunks on 32
  -- threads, 520 on 64, 1032 on 128, 2056 on 256), 4104 = 513 chunks, one
  -- past 2 a thread on 256 threads (3 chunks, recomputed); tiny N (fewer
  -- rows than a block's row groups: one block, one partial row) and D not a
  -- multiple of 8 (the block kernel). EMBER_RMSNORM_BWD_CHUNKS=4 runs the
  -- same cases through the 4-chunk kernels.
  for _, s in ipairs {{301, 264}, {301, 520}, {301, 1032}, {37, 2056}, {37, 4104}, {1, 1600}, {3, 768},
                      {2, 4096}, {5, 1601}, {7, 250}} do
    it(("bf16: (%d, %d) with an f32 weight: 2-chunk configuration edge"):format(s[1], s[2]), function()
      check(s, "bf16", "f32", ("bf16 (%d, %d)"):format(s[1], s[2]))
    end)
  end
  it("bf16: (301, 1600) with a bf16 weight and without one (2 chunks a thread)", function()
    check({301, 1600}, "bf16", "bf16", "bf16/bf16 (301, 1600)")
    check({301, 1600}, "bf16", nil, "bf16/none (301, 1600)")
  end)

  -- more than 512 blocks (8192 rows of 64: 1024 blocks of 8 rows): more than
  -- 64 group sums, so each level-2 warp of the weight gradient's tail adds
  -- more than one batch of 8 group rows
  it("f32: (8192, 64) with an f32 weight: the weight gradient's tail over 128 group sums", function()
    check({8192, 64}, "f32", "f32", "f32 (8192, 64)")
  end)

  it("bf16 activations with an f32 weight (f32 master weights)", function()
    check({45, 96}, "bf16", "f32", "bf16/f32")
  end)

  it("f64 computes in f64", function()
    local x, w = randn({7, 33}, "f64"), randn({33}, "f64")
    close(F.rmsnorm(x:cuda(), w:cuda(), 1e-5), F.rmsnorm(x, w, 1e-5), 1e-12, "f64")
  end)

  -- the blocks finish in a different order each run; the sums' order is fixed
  -- (bf16 rows are held at 2 chunks a thread: the same fixed order)
  for _, c in ipairs {{160, "f32"}, {768, "f32"}, {1600, "f32"}, {4096, "f32"}, {1600, "bf16"}} do
    local d, dt = c[1], c[2]
    it(("%s: dw is bit-identical across runs (2048 x %d, f32 weight: the partial rows of hundreds of blocks)")
        :format(dt, d), function()
      local x, w = randn({2048, d}, dt), randn({d})
      local g = randn({2048, d}, dt):cuda()
      local xg = x:cuda()
      local wg = w:cuda(); wg.requires_grad = true
      F.rmsnorm(xg, wg, 1e-5):backward(g)
      local first = wg.grad:clone()
      for _ = 1, 3 do
        wg.grad = nil
        F.rmsnorm(xg, wg, 1e-5):backward(g)
        C.assert_same_bits(wg.grad, first, dt .. " dw")
      end
    end)
  end

  -- The weight gradient's block counters live in one buffer per stream that
  -- every launch leaves zeroed (kernels/counters.cu): launches of other grids
  -- in between, a side stream and the replays of a captured graph must each
  -- give the first call's bits. A counter left non-zero would make a later
  -- launch skip or repeat part of its sum.
  it("dw bits hold across grids, streams and graph replays (counters reused, not reset by a memset)", function()
    local cuda = ember.cuda
    local cases = {}
    for _, s in ipairs {{2048, 768}, {37, 4096}, {3001, 1600}, {8192, 64}, {5, 160}} do
      cases[#cases + 1] = {x = randn(s):cuda(), w = randn({s[2]}):cuda(), g = randn(s):cuda()}
    end
    local function dw(c)
      local w = c.w:clone(); w.requires_grad = true
      F.rmsnorm(c.x, w, 1e-5):backward(c.g)
      return w.grad
    end
    local first = {}
    for i, c in ipairs(cases) do first[i] = dw(c) end
    for round = 1, 3 do
      for i, c in ipairs(cases) do C.assert_same_bits(dw(c), first[i], ("dw, round %d, case %d"):format(round, i)) end
    end
    local side = cuda.Stream()
    for round = 1, 2 do
      local got = {}
      cuda.stream(side, function() for i, c in ipairs(cases) do got[i] = dw(c) end end)
      side:synchronize()
      for i = 1, #cases do C.assert_same_bits(got[i], first[i], ("dw on a side stream, round %d, case %d"):format(round, i)) end
    end
    local ws = {}
    for i, c in ipairs(cases) do ws[i] = c.w:clone(); ws[i].requires_grad = true end
    local graph = cuda.graph(function()
      for i, c in ipairs(cases) do
        ws[i].grad = nil
        F.rmsnorm(c.x, ws[i], 1e-5):backward(c.g)
      end
    end, {warmup = 0})
    for rep = 1, 3 do
      for i = 1, #cases do ws[i].grad:fill_(0 / 0) end     -- poisoned: each replay must write every element
      graph:replay()
      cuda.synchronize()
      for i = 1, #cases do C.assert_same_bits(ws[i].grad, first[i], ("dw, graph replay %d, case %d"):format(rep, i)) end
      for i, c in ipairs(cases) do C.assert_same_bits(dw(c), first[i], ("dw eager after replay %d, case %d"):format(rep, i)) end
    end
    graph:close()
  end)

  -- Captured kernels share the graph's own zeroed counters (kernels/graph.cu,
  -- em_cuda_graph_counters) instead of a memset node each: the split rows
  -- sums (reduce.cu: block counters 0..) and rmsnorm's ticket word (past
  -- them) in one graph, in turn, each leaving its part ready for the next
  -- kernel and the next replay. Poisoned outputs: every replay writes them.
  it("a graph's rmsnorm backwards and split sums share its counters and keep the eager bits", function()
    local cuda = ember.cuda
    local long = randn({8, 1048576}):cuda()             -- 8 rows of 2^20: a split rows sum
    local cases = {}
    for _, s in ipairs {{2048, 768}, {1, 768}, {4099, 4096}} do
      cases[#cases + 1] = {x = randn(s):cuda(), w = randn({s[2]}):cuda(), g = randn(s):cuda()}
    end
    local function dw(c, w)
      w.grad = nil
      F.rmsnorm(c.x, w, 1e-5):backward(c.g)
      return w.grad
    end
    local want_sum, want = long:sum(1), {}
    for i, c in ipairs(cases) do
      local w = c.w:clone(); w.requires_grad = true
      want[i] = dw(c, w)
    end
    local ws, sums = {}, {}
    for i, c in ipairs(cases) do ws[i] = c.w:clone(); ws[i].requires_grad = true end
    local graph = cuda.graph(function()
      for i, c in ipairs(cases) do
        sums[i] = long:sum(1)
        dw(c, ws[i])
      end
    end, {warmup = 0})
    for rep = 1, 3 do
      for i = 1, #cases do ws[i].grad:fill_(0 / 0); sums[i]:fill_(0 / 0) end
      graph:replay()
      cuda.synchronize()
      for i = 1, #cases do
        C.assert_same_bits(ws[i].grad, want[i], ("dw, graph replay %d, case %d"):format(rep, i))
        C.assert_same_bits(sums[i], want_sum, ("split sum, graph replay %d, after case %d"):format(rep, i))
      end
    end
    graph:close()
    for i, c in ipairs(cases) do                          -- and the stream's own counters are still ready
      local w = c.w:clone(); w.requires_grad = true
      C.assert_same_bits(dw(c, w), want[i], ("dw eager after the graph, case %d"):format(i))
    end
    C.assert_same_bits(long:sum(1), want_sum, "split sum eager after the graph")
  end)

  -- finish_dw's reducers (kernels/norm.cu bwd_reducers): by default as many
  -- as make one trip of loads a thread (96 at (2048, 768) f32, 132 and two
  -- trips at (1031, 4096): 344 blocks), with EMBER_RMSNORM_BWD_REDUCERS=64 the earlier
  -- count; both against the CPU (their sum orders differ), each repeatable,
  -- and a bad value refused by name.
  it("EMBER_RMSNORM_BWD_REDUCERS=trip and 64 both match the CPU, run to run; others are refused", function()
    local script = H.temp(".lua")
    H.spit(script, [==[
local ember = require "ember"
local F = ember.nn.functional
ember.manual_seed(5)
local out = {}
for k, s in ipairs({{2048, 768}, {1031, 4096}, {3001, 1600}, {1, 768}}) do
  for _, dt in ipairs({"f32", "bf16"}) do
    local x, g = ember.randn(s):to(dt), ember.randn(s):to(dt)
    local w = ember.randn({s[2]})
    local wg = w:cuda(); wg.requires_grad = true
    F.rmsnorm(x:cuda(), wg, 1e-5):backward(g:cuda())
    local first = wg.grad:cpu()
    wg.grad = nil
    F.rmsnorm(x:cuda(), wg, 1e-5):backward(g:cuda())
    local key = ("%s_%d"):format(dt, k)
    out["x_" .. key], out["g_" .. key], out["w_" .. key] = x, g, w
    out["dw_" .. key], out["dw2_" .. key] = first, wg.grad:cpu()
  end
end
ember.save(os.getenv("SCAN_SPEC_OUT"), out)
]==])
    local got = C.mode_results(H, script, "EMBER_RMSNORM_BWD_REDUCERS", {"trip", "64"})
    for mode, r in pairs(got) do
      for k = 1, 4 do
        for _, dt in ipairs({"f32", "bf16"}) do
          local key = ("%s_%d"):format(dt, k)
          local wc = r["w_" .. key]:clone(); wc.requires_grad = true
          F.rmsnorm(r["x_" .. key], wc, 1e-5):backward(r["g_" .. key])
          close(r["dw_" .. key], wc.grad, TOL.f32, ("%s dw %s"):format(mode, key))
          C.assert_same_bits(r["dw2_" .. key], r["dw_" .. key], ("%s dw %s, second run"):format(mode, key))
        end
      end
    end
    local _, err, code = H.ember({"run", script}, {env = {EMBER_RMSNORM_BWD_REDUCERS = "128",
                                                          SCAN_SPEC_OUT = H.temp(".st")}})
    assert.are_not.equal(0, code, "EMBER_RMSNORM_BWD_REDUCERS=128 should fail")
    assert.matches("expected EMBER_RMSNORM_BWD_REDUCERS to be trip or 64, got '128'", err, 1, true)
    H.remove_temps()
  end)

  -- EMBER_RMSNORM_BWD_DW (kernels/norm.cu cluster_dw): the weight gradient's
  -- tail by the waiting ticket reducers or by clusters of 8 blocks through
  -- distributed shared memory. x's gradient (and add_rmsnorm's x, r and
  -- stream gradients) the same bits in both; dw within the CPU's tolerance in
  -- both (their sum orders differ), bit-identical run to run, on a side
  -- stream and in graph replays. Shapes: the models' rows, 1 row (7 empty
  -- blocks of a cluster), every row-group configuration (D 64: 32 threads a
  -- row, 1600 and 4096: 128 and 256), D 16 (fewer chunks than slices), odd D
  -- (the block kernel, no cluster), bf16 and f32, no weight gradient.
  it("EMBER_RMSNORM_BWD_DW=ticket and cluster: x's gradient the same bits, dw the CPU's and repeatable; others refused", function()
    local script = H.temp(".lua")
    H.spit(script, [==[
local ember = require "ember"
local F = ember.nn.functional
ember.manual_seed(9)
local out = {}
local function leaf(t) local c = t:clone(); c.requires_grad = true; return c end
local cases = {{2048, 768, "f32"}, {2048, 768, "bf16"}, {1, 768, "f32"}, {1, 768, "bf16"}, {3001, 1600, "f32"},
  {3001, 1600, "bf16"}, {1031, 4096, "f32"}, {8192, 64, "f32"}, {8192, 64, "bf16"}, {5, 16, "f32"}, {7, 37, "f32"},
  {301, 1600, "bf16", "bf16"}}
local side = ember.cuda.Stream()
for k, c in ipairs(cases) do
  local s, dt, wdt = {c[1], c[2]}, c[3], c[4] or "f32"
  local x, g, w = ember.randn(s):to(dt), ember.randn(s):to(dt), ember.randn({s[2]}):to(wdt)
  local xg, gg = x:cuda(), g:cuda()
  local function run()
    local xl, wl = leaf(xg), leaf(w:cuda())
    F.rmsnorm(xl, wl, 1e-5):backward(gg)
    return xl.grad:cpu(), wl.grad:cpu()
  end
  local key = tostring(k)
  out["x_" .. key], out["g_" .. key], out["w_" .. key] = x, g, w
  out["dx_" .. key], out["dw_" .. key] = run()
  out["dx2_" .. key], out["dw2_" .. key] = run()
  ember.cuda.stream(side, function() out["dx3_" .. key], out["dw3_" .. key] = run() end)
  side:synchronize()
  -- a graph replay, its grads poisoned first: every replay writes them
  local xl, wl = leaf(xg), leaf(w:cuda())
  local graph = ember.cuda.graph(function()
    xl.grad, wl.grad = nil, nil
    F.rmsnorm(xl, wl, 1e-5):backward(gg)
  end, {warmup = 0})
  for _ = 1, 2 do
    xl.grad:fill_(0 / 0); wl.grad:fill_(0 / 0)
    graph:replay()
  end
  ember.cuda.synchronize()
  out["dx4_" .. key], out["dw4_" .. key] = xl.grad:cpu(), wl.grad:cpu()
  graph:close()
end
-- no weight gradient: x's alone
do
  local x, g, w = ember.randn({2048, 768}), ember.randn({2048, 768}), ember.randn({768})
  local xl = leaf(x:cuda())
  F.rmsnorm(xl, w:cuda(), 1e-5):backward(g:cuda())
  out.nw_dx = xl.grad:cpu()
end
-- the models' call: add_rmsnorm's backward on an f32 stream with a bf16 branch and a bf16 y (the stream's
-- gradient added into, the branch's bf16 gradient written beside it)
do
  local x, r, w = ember.randn({2048, 768}), ember.randn({2048, 768}):to("bf16"), ember.randn({768})
  local gs, gy = ember.randn({2048, 768}), ember.randn({2048, 768}):to("bf16")
  local xl, rl, wl = leaf(x:cuda()), leaf(r:cuda()), leaf(w:cuda())
  local sum, y = F.add_rmsnorm(xl, rl, wl, 1e-5, {out_dtype = "bf16"})
  ;((y * gy:cuda()):sum() + (sum * gs:cuda()):sum()):backward()
  out.add_x, out.add_r, out.add_w, out.add_gs, out.add_gy = x, r, w, gs, gy
  out.add_gx, out.add_gr, out.add_dw = xl.grad:cpu(), rl.grad:cpu(), wl.grad:cpu()
end
ember.save(os.getenv("SCAN_SPEC_OUT"), out)
]==])
    local got = C.mode_results(H, script, "EMBER_RMSNORM_BWD_DW", {"ticket", "cluster"})
    local ticket, cluster = got.ticket, got.cluster
    for k = 1, 12 do
      local key = tostring(k)
      local x, g, w = ticket["x_" .. key], ticket["g_" .. key], ticket["w_" .. key]
      local xc, wc = x:clone(), w:clone()
      xc.requires_grad, wc.requires_grad = true, true
      F.rmsnorm(xc, wc, 1e-5):backward(g)
      for mode, r in pairs(got) do
        close(r["dw_" .. key], wc.grad, TOL[w.dtype], ("%s dw, case %d"):format(mode, k))
        for _, n in ipairs({"2", "3", "4"}) do
          C.assert_same_bits(r["dw" .. n .. "_" .. key], r["dw_" .. key], ("%s dw%s, case %d"):format(mode, n, k))
          C.assert_same_bits(r["dx" .. n .. "_" .. key], r["dx_" .. key], ("%s dx%s, case %d"):format(mode, n, k))
        end
      end
      C.assert_same_bits(cluster["dx_" .. key], ticket["dx_" .. key], ("dx cluster vs ticket, case %d"):format(k))
    end
    C.assert_same_bits(cluster.nw_dx, ticket.nw_dx, "dx without a weight gradient")
    for _, n in ipairs({"add_gx", "add_gr"}) do C.assert_same_bits(cluster[n], ticket[n], n .. " cluster vs ticket") end
    local xl, rl, wl = C.leaf(ticket.add_x), C.leaf(ticket.add_r:to("f32")), C.leaf(ticket.add_w)
    local sum, y = F.add_rmsnorm(xl, rl, wl, 1e-5)
    ;((y * ticket.add_gy:to("f32")):sum() + (sum * ticket.add_gs):sum()):backward()
    for mode, r in pairs(got) do
      close(r.add_dw, wl.grad, TOL.f32, mode .. " add_rmsnorm dw")
      close(r.add_gx, xl.grad, TOL.f32, mode .. " add_rmsnorm dx")
    end
    local _, err, code = H.ember({"run", script}, {env = {EMBER_RMSNORM_BWD_DW = "tree", SCAN_SPEC_OUT = H.temp(".st")}})
    assert.are_not.equal(0, code, "EMBER_RMSNORM_BWD_DW=tree should fail")
    assert.matches("expected EMBER_RMSNORM_BWD_DW to be ticket or cluster, got 'tree'", err, 1, true)
    H.remove_temps()
  end)

  -- On a residual stream, x's gradient sum is formed inside the rmsnorm
  -- backward (it adds into the gradient the residual branch delivered first):
  -- the result must equal the CPU's separate sum.
  for _, shape in ipairs {{64, 768}, {5, 7, 37}, {2048, 1600}, {33, 4096}} do
    it(("adds into the residual gradient sum (%s)"):format(table.concat(shape, "x")), function()
      local x, w, d = randn(shape, "f32", 2), randn({shape[#shape]}), randn(shape)
      local function grads(dev)
        local xx = x:clone():to(dev); xx.requires_grad = true
        local ww = w:clone():to(dev); ww.requires_grad = true
        local y = F.rmsnorm(xx, ww, 1e-5)
        local r = y + xx * d:to(dev)          -- the mul's backward runs first: the sum starts there
        r:sum():backward()
        return xx.grad, ww.grad
      end
      local gxc, gwc = grads("cpu")
      local gxg, gwg = grads("cuda")
      close(gxg, gxc, 1e-5, "dx (sum)")
      close(gwg, gwc, 1e-5, "dw")
    end)
  end

  -- the same for bf16 activations (the 2-chunk kernels' residual read)
  for _, shape in ipairs {{64, 768}, {2048, 1600}, {33, 4096}} do
    it(("bf16: adds into the residual gradient sum (%s)"):format(table.concat(shape, "x")), function()
      local x, w, d = randn(shape, "bf16", 2), randn({shape[#shape]}), randn(shape, "bf16")
      local function grads(dev)
        local xx = x:clone():to(dev); xx.requires_grad = true
        local ww = w:clone():to(dev); ww.requires_grad = true
        local y = F.rmsnorm(xx, ww, 1e-5)
        local r = y + xx * d:to(dev)
        r:sum():backward()
        return xx.grad, ww.grad
      end
      local gxc, gwc = grads("cpu")
      local gxg, gwg = grads("cuda")
      close(gxg, gxc, TOL.bf16, "bf16 dx (sum)")
      close(gwg, gwc, TOL.f32, "bf16 dw (f32 weight)")
    end)
  end

  it("under autocast bf16: computes in f32 and returns f32", function()
    local x, w = randn({12, 80}, "bf16"), randn({80})
    local y = ember.autocast("bf16", function() return F.rmsnorm(x:cuda(), w:cuda(), 1e-5) end)
    assert.equals("f32", y.dtype)
    close(y, F.rmsnorm(x:to("f32"), w, 1e-5), 1e-5, "autocast")
  end)
end)

-- F.add_rmsnorm on CUDA (kernels/norm.cu, rms_fwd_reg_kernel with a
-- residual): s, y and the gradients of x, r and w bit for bit those of
-- `x + r` then F.rmsnorm on CUDA (the add kernel, the plain forward, the
-- backward adding into the stream's gradient), and y within TOL of the CPU.
-- Widths: every register variant (f32 D 96 | 256 | 512 | 768, 1024: 1, 2, 4,
-- 8 chunks a lane) and the two-pass fallback (D 1028 past the registers, D
-- 37 not a whole chunk, f64); r f32, bf16 and f16; 2051 rows: a grid-stride
-- tail. EMBER_FUSE_ADD_RMSNORM=0 vs 1: a small model's bf16-autocast steps.
describe("add_rmsnorm on CUDA", function()
  local function pair(fused, x, r, w, gs, gy)
    local xl, rl = C.leaf(x), C.leaf(r)
    local wl = w and C.leaf(w)
    local s, y
    if fused then s, y = F.add_rmsnorm(xl, rl, wl)
    else s = xl + rl; y = F.rmsnorm(s, wl) end
    ;((y * gy):sum() + (s * gs):sum()):backward()
    return {s = s, y = y, gx = xl.grad, gr = rl.grad, gw = wl and wl.grad}
  end

  local cases = {
    {96, "f32", "bf16", true}, {256, "f32", "bf16", true}, {512, "f32", "f32", true}, {768, "f32", "bf16", true},
    {1024, "f32", "f16", true}, {768, "f32", "bf16", false}, {1028, "f32", "bf16", true}, {37, "f32", "bf16", true},
    {768, "f64", "f32", true},
  }
  for _, c in ipairs(cases) do
    local D, xd, rd, has_w = c[1], c[2], c[3], c[4]
    it(("(2051, %d) x %s + r %s%s: the pair's bits, forward and backward"):format(D, xd, rd,
       has_w and ", weight" or ""), function()
      local x, r = randn({2051, D}, xd, 2):cuda(), randn({2051, D}, rd):cuda()
      local w = has_w and randn({D}, xd):cuda() or nil   -- nil, not false: F.rmsnorm takes no boolean weight
      local gs, gy = randn({2051, D}, xd):cuda(), randn({2051, D}, xd):cuda()
      local a, b = pair(true, x, r, w, gs, gy), pair(false, x, r, w, gs, gy)
      for _, k in ipairs({"s", "y", "gx", "gr", "gw"}) do
        if a[k] or b[k] then
          assert.equals(b[k].dtype, a[k].dtype, k)
          C.assert_same_bits(a[k], b[k], k)
        end
      end
      local yc = F.rmsnorm(x:cpu() + r:cpu(), w and w:cpu())
      close(a.y, yc, xd == "f64" and 1e-12 or TOL.f32, "y vs the CPU")
    end)
  end

  it("replays in a CUDA graph with the eager bits", function()
    local x, r, w = randn({512, 768}, "f32"):cuda(), randn({512, 768}, "bf16"):cuda(), randn({768}, "f32"):cuda()
    local _, want = F.add_rmsnorm(x, r, w)
    local got
    local graph = ember.cuda.graph(function() local _, y = F.add_rmsnorm(x, r, w); got = y end, {warmup = 0})
    got:fill_(0 / 0)
    graph:replay()
    ember.cuda.synchronize()
    C.assert_same_bits(got, want, "graph replay y")
    graph:close()
  end)

  it("EMBER_FUSE_ADD_RMSNORM=0 and 1 train a small model (bf16 autocast) to the same bits", function()
    local script = C.train_small_script(H, 64, 4)
    local got = C.mode_results(H, script, "EMBER_FUSE_ADD_RMSNORM", {"0", "1"})
    assert.is_true(C.assert_modes_agree(got, "0", {"1"}) > 10)
    H.remove_temps()
  end)
end)

-- out_dtype on CUDA (kernels/norm.cu: the forward kernels writing a bf16/f16
-- y from f32 rows, the backward kernels reading a bf16/f16 gy): y and the
-- gradients of x, r and w bit for bit those of the composition on CUDA
-- (F.rmsnorm then :to(od); for add_rmsnorm the add, the norm, the cast), both
-- with the half gy at the root (the kernels reading it, where the
-- composition converts it first) and through a bf16 product (y's gradient
-- summed in f32: the f32 kernels; a bf16/f16 r's gradient then written by
-- the kernel beside gx); y within one rounding of the CPU's.
-- Widths: forward 1, 2, 4, 8 chunks a lane (D 96 | 256 | 512 | 768, 1024),
-- the loop kernel (1028: vector rows past the registers; 37: not a whole
-- chunk; 4100); backward 32 threads x 1, 2, 4 chunks, 64 x 3, 4, 128 x 3,
-- and the block kernel (4100, 37); 2051 rows: grid-stride tails.
describe("out_dtype norms on CUDA", function()
  local run = H.norm_out_grads   -- the op with out_dtype (new) or the composition (helpers.lua)

  local widths = {96, 256, 512, 768, 1024, 1028, 37, 4100}
  for wi, D in ipairs(widths) do
    for _, op in ipairs({"rmsnorm", "add_rmsnorm"}) do
      for _, consumer in ipairs({"root", "product"}) do
        local od = wi % 3 == 0 and "f16" or "bf16"
        local has_w = wi ~= 2
        local rows = D <= 1028 and 2051 or 37
        it(("%s (%d, %d) f32 -> %s%s, gradient by %s: the composition's bits"):format(op, rows, D, od,
           has_w and ", weight" or "", consumer), function()
          local x = randn({rows, D}, "f32", 2):cuda()
          local w = has_w and randn({D}, "f32"):cuda() or nil
          local r = op == "add_rmsnorm" and randn({rows, D}, wi % 2 == 0 and "bf16" or "f32"):cuda() or nil
          local gs, gy = randn({rows, D}, "f32"):cuda(), randn({rows, D}, od):cuda()
          local a, b = run(true, op, od, x, r, w, gs, gy, consumer), run(false, op, od, x, r, w, gs, gy, consumer)
          assert.equals(od, a.y.dtype)
          assert.equals(op, a.y.grad_fn)
          for _, k in ipairs({"s", "y", "gx", "gr", "gw"}) do
            if a[k] or b[k] then
              assert.equals(b[k].dtype, a[k].dtype, k)
              C.assert_same_bits(a[k], b[k], k)
            end
          end
          local yc
          if op == "rmsnorm" then yc = F.rmsnorm(x:cpu(), w and w:cpu(), 1e-5, {out_dtype = od})
          else local _; _, yc = F.add_rmsnorm(x:cpu(), r:cpu(), w and w:cpu(), 1e-5, {out_dtype = od}) end
          close(a.y, yc, TOL.bf16, "y vs the CPU")
        end)
      end
    end
  end

  it("runs no convert kernel around the norm, forward or backward", function()
    C.need_cupti(pending)
    local x, r = randn({2048, 768}, "f32"):cuda(), randn({2048, 768}, "bf16"):cuda()
    local w, gy = randn({768}, "f32"):cuda(), randn({2048, 768}, "bf16"):cuda()
    local xl, wl = C.leaf(x), C.leaf(w)
    local ran = C.kernel_names(function()
      F.rmsnorm(xl, wl, 1e-5, {out_dtype = "bf16"}):backward(gy)
      local _, y = F.add_rmsnorm(xl, r, wl, 1e-5, {out_dtype = "bf16"})
      y:backward(gy)
    end)
    assert.truthy(ran:find("rms_fwd_reg_kernel", 1, true), ran)
    assert.truthy(ran:find("rms_bwd_rg_kernel", 1, true), ran)
    assert.is_nil(ran:find("convert", 1, true), "expected no convert kernel, ran: " .. ran)
    -- under autocast, norm then a linear (the model's pair): one convert fewer than with an f32 y
    -- (the activation's cast; the weight's stays), and the backward's kernels unchanged
    local lw = C.leaf(randn({512, 768}, "f32"):cuda())
    local function pair(od)
      return function()
        ember.autocast("bf16", function()
          local _, y = F.add_rmsnorm(xl, r, wl, 1e-5, od and {out_dtype = od} or nil)
          F.linear(y, lw):float():sum():backward()
        end)
      end
    end
    -- launches, not names: the weight's cast and the activation's are the same kernel
    local old_n, new_n = C.kernel_calls(pair(nil), "convert"), C.kernel_calls(pair("bf16"), "convert")
    assert.equals(old_n - 1, new_n, ("convert launches: %d with an f32 y, %d with a bf16 y\nold: %s\nnew: %s")
      :format(old_n, new_n, C.kernel_names(pair(nil)), C.kernel_names(pair("bf16"))))
    assert.equals(C.kernel_calls(pair(nil), "rms_bwd_rg_kernel"), C.kernel_calls(pair("bf16"), "rms_bwd_rg_kernel"))
    -- a bf16 branch r that needs a gradient: the backward kernel writes it (no cast of the f32 gx after it)
    local rl, gsf, gyf = C.leaf(r), randn({2048, 768}, "f32"):cuda(), randn({2048, 768}, "f32"):cuda()
    local ran2 = C.kernel_names(function()
      local s, y = F.add_rmsnorm(xl, rl, wl, 1e-5)
      ;((y * gyf):sum() + (s * gsf):sum()):backward()
    end)
    assert.truthy(ran2:find("rms_bwd_rg_kernel", 1, true), ran2)
    assert.is_nil(ran2:find("convert", 1, true), "expected no convert kernel, ran: " .. ran2)
    assert.equals("bf16", rl.grad.dtype)
  end)

  it("EMBER_NORM_OUT16=0 and 1 train a small model (bf16 autocast) to the same bits", function()
    local script = C.train_small_script(H, 64, 4)
    local got = C.mode_results(H, script, "EMBER_NORM_OUT16", {"0", "1"})
    assert.is_true(C.assert_modes_agree(got, "0", {"1"}) > 20)
    H.remove_temps()
  end)
end)
