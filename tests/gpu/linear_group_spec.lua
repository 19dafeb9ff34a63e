-- linear_group_spec.lua (GPU) — the grouped projections on CUDA
-- (engine/ops/linear_group.c; ember.backends.fused_proj): a TransformerLM
-- block trained in bf16 autocast with AdamW, fused (q/k/v and w1/w3 as one
-- batched gemm forward, one gemm each for the input's and the weights'
-- gradients, on the shadow weights AdamW writes grouped) against unfused,
-- eager and inside a captured CUDA graph; the fused op against the CPU's
-- per-weight linear; the fused node is what runs once the shadows are
-- written; EMBER_FUSED_PROJ=2 (no join) in a child process. The CPU side
-- is tests/lua/linear_group_spec.lua.
--
-- Tolerances, and why: the fused gemms sum the same products as the
-- per-projection gemms in another order (other tile shapes, k = 3·768 for the
-- input's gradient), so bf16 outputs may round to a neighbouring value:
--   * losses of 6 steps: 1e-2 relative; parameters after them (lr 1e-3):
--     2e-3 absolute (an AdamW update is at most lr a step).
--   * one forward against the CPU: the bf16 table's 1e-2 relative.
--   * a graph's replays against the same process's eager fused steps: the
--     same bits (one cuBLASLt algorithm per shape with tuning off).
local ember = require "ember"
local nn, F = ember.nn, ember.nn.functional
local core = ember.core

local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "compare.lua")
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../lua/helpers.lua")

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local D, HEADS, FF, B, T = 768, 12, 3072, 2, 256

local function with_switch(on, fn)
  local prev = ember.backends.fused_proj(on)
  local ok, a, b = pcall(fn)
  ember.backends.fused_proj(prev)
  if not ok then error(a, 0) end
  return a, b
end

local function block()
  ember.manual_seed(21)
  local m = nn.Module()
  m.attn = nn.CausalSelfAttention(D, HEADS, {device = "cuda"})
  m.ffn = nn.SwiGLU(D, FF, {device = "cuda"})
  return m
end

local function maxdiff(a, b) return (a:to("f32"):cpu() - b:to("f32"):cpu()):abs():max():item() end

-- steps of AdamW under bf16 autocast; graph: steps 3.. are replays of a captured step
local function train(on, steps, graph)
  return with_switch(on, function()
    local m = block()
    local opt = ember.optim.AdamW(m:parameters(), {lr = 1e-3})
    ember.manual_seed(22)
    local x, target = ember.randn({B, T, D}):to("cuda"), ember.randn({B, T, D}):to("cuda")
    local function step()
      opt:zero_grad()
      local loss = ember.autocast("bf16", function()
        return F.mse_loss(m.ffn(m.attn(x)):to("f32"), target)
      end)
      loss:backward()
      opt:step()
      return loss
    end
    local losses = {}
    local first = graph and 2 or steps
    for s = 1, first do losses[s] = step():item() end
    if graph then
      opt:zero_grad()
      local loss
      local g = ember.cuda.graph(function() loss = step() end, {warmup = 0})
      for s = 3, steps do
        g:replay()
        ember.cuda.synchronize()
        losses[s] = loss:item()
      end
      g:close()
    end
    return losses, m
  end)
end

local function close_runs(lf, mf, lu, mu, what)
  for s = 1, #lu do
    assert.is_true(math.abs(lf[s] - lu[s]) <= 1e-2 * math.abs(lu[s]),
      ("%s: loss %d %.6g vs %.6g"):format(what, s, lf[s], lu[s]))
  end
  local pu = mu:named_parameters()
  for i, np in ipairs(mf:named_parameters()) do
    assert.are.equal(pu[i][1], np[1])
    local d = maxdiff(np[2], pu[i][2])
    assert.is_true(d <= 2e-3, ("%s: %s differs by %g"):format(what, np[1], d))
  end
end

describe("grouped projections on CUDA", function()
  it("fused training (bf16 autocast, AdamW) follows unfused training", function()
    local lf, mf = train(true, 6)
    local lu, mu = train(false, 6)
    close_runs(lf, mf, lu, mu, "eager")
  end)

  it("inside a captured graph: replays follow unfused eager training and give the fused eager bits", function()
    local lg, mg = train(true, 6, true)
    local lu, mu = train(false, 6)
    close_runs(lg, mg, lu, mu, "graph")
    local lf, mf = train(true, 6)
    assert.are.same(lf, lg)
    local pf = mf:named_parameters()
    for i, np in ipairs(mg:named_parameters()) do C.assert_same_bits(np[2], pf[i][2], np[1]) end
  end)

  it("EMBER_FUSED_PROJ=2 (q/k/v's backward without the join) trains as the unfused path does", function()
    -- a child process: the mode is read from the environment once
    local script = H.temp_file(([[
local ember = require "ember"
local nn, F = ember.nn, ember.nn.functional
ember.manual_seed(21)
local m = nn.Module()
m.attn = nn.CausalSelfAttention(%d, %d, {device = "cuda"})
m.ffn = nn.SwiGLU(%d, %d, {device = "cuda"})
local opt = ember.optim.AdamW(m:parameters(), {lr = 1e-3})
ember.manual_seed(22)
local x, target = ember.randn({%d, %d, %d}):to("cuda"), ember.randn({%d, %d, %d}):to("cuda")
local out = {}
for s = 1, 6 do
  opt:zero_grad()
  local loss = ember.autocast("bf16", function() return F.mse_loss(m.ffn(m.attn(x)):to("f32"), target) end)
  loss:backward()
  opt:step()
  out[s] = ("%%.9g"):format(loss:item())
end
local q = ember.autocast("bf16", function() return (nn.Linear.group(x, {m.attn.q_proj, m.attn.k_proj, m.attn.v_proj})) end)
print(q.grad_fn .. " " .. table.concat(out, " "))
]]):format(D, HEADS, D, FF, B, T, D, B, T, D), ".lua")
    local out, err = H.ember({"run", script}, {env = {EMBER_FUSED_PROJ = "2"}})
    assert.are.equal("", err or "")
    local lu = train(false, 6)
    assert.are.equal("linear_group", out:match("^(%S+)"))
    local s = 0
    for v in out:gsub("^%S+", ""):gmatch("%S+") do
      s = s + 1
      local l = tonumber(v)
      assert.is_true(math.abs(l - lu[s]) <= 1e-2 * math.abs(lu[s]), ("loss %d %.6g vs %.6g"):format(s, l, lu[s]))
    end
    assert.are.equal(6, s)
    H.remove_temps()
  end)

  it("runs the fused node on the grouped shadows, each the cast of its weight, close to the CPU", function()
    local _, m = train(true, 2)
    ember.manual_seed(23)
    local x = ember.randn({B, T, D}):to("cuda")
    with_switch(true, function()
      ember.autocast("bf16", function()
        local a = m.attn
        local lins = {a.q_proj, a.k_proj, a.v_proj}
        local ys = {nn.Linear.group(x, lins)}
        for i, lin in ipairs(lins) do
          assert.are.equal("linear_group", ys[i].grad_fn)
          C.assert_same_bits(core.shadow_weight(lin.weight), lin.weight:to("bf16"), "shadow " .. i)
          local ref = F.linear(x:cpu():to("bf16"), lin.weight:cpu():to("bf16")):to("f32")
          local got = ys[i]:to("f32"):cpu()
          local err = (got - ref):abs():max():item() / ref:abs():max():item()
          assert.is_true(err <= 1e-2, ("projection %d: relative error %g"):format(i, err))
        end
      end)
    end)
  end)
end)
