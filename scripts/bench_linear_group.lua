--- The grouped projections alone (F.linear_group, EMBER_FUSED_PROJ): one
-- layer's q/k/v (gradients joined by three copies) and w1/w3 (gradients
-- stacked by SwiGLU's backward), forward + backward under bf16 autocast, each
-- captured as a CUDA graph and timed over replays, with ember.backends.fused_proj
-- off and on. The consumers are the same in both runs (a product with fixed
-- gradients for q/k/v, SwiGLU for w1/w3), so the difference is the grouping.
-- docs/perf.md (sixteenth session, fusedproj) has the model it checks.
--   ember run scripts/bench_linear_group.lua --model small [--tokens 2048] [--reps 200]
--   EMBER_FUSED_PROJ=2 ember run scripts/bench_linear_group.lua   (fused without q/k/v's join)
local ember = require "ember"
local argparse = require "argparse"
local nn, F = ember.nn, ember.nn.functional

local parser = argparse("bench_linear_group.lua", "One layer's grouped projections, fused vs unfused (CUDA graphs).")
parser:option("--model", "Model size whose d_model and d_ff to use.", "small"):choices({"small", "medium", "large", "xl", "2.7b"})
parser:option("--tokens", "Rows of x (B·T).", "2048"):convert(math.tointeger)
parser:option("--reps", "Timed graph replays.", "200"):convert(math.tointeger)
parser:option("--json", "Append one JSON line of results to this file.")
local args = parser:parse(arg)

if not ember.cuda.is_available() then
  io.stderr:write("bench_linear_group.lua: needs a CUDA device\n")
  os.exit(1)
end
local cfg = nn.configs[args.model]()
local D, FF, M = cfg.d_model, cfg.d_ff, args.tokens

-- median µs of one replay of fn's step captured as a graph; fn(on) builds the step
local function timed(group, on)
  -- on: keep the mode the environment chose (EMBER_FUSED_PROJ=2 measures without the join), else 1
  local prev = ember.backends.fused_proj()
  if on ~= prev then ember.backends.fused_proj(on) end
  ember.manual_seed(1)
  local lins = {}
  for i = 1, #group.outs do lins[i] = nn.Linear(D, group.outs[i], {bias = false, device = "cuda"}) end
  local params = {}
  for i, l in ipairs(lins) do params[i] = l.weight end
  local opt = ember.optim.AdamW(params, {lr = 1e-4})
  local x = ember.randn({M, D}):to("cuda")
  local gs = {}
  for i = 1, #lins do gs[i] = ember.randn({M, group.outs[i]}):to("cuda"):to("bf16") end
  local kind
  local function step()
    for _, p in ipairs(params) do p.grad = nil end
    local loss = ember.autocast("bf16", function()
      local ys = {nn.Linear.group(x, lins)}
      kind = ys[1].grad_fn
      return group.consume(ys, gs)
    end)
    loss:backward()
  end
  for _ = 1, 2 do step() opt:step() end                     -- shadows written grouped, then current
  step()
  ember.cuda.synchronize()
  local g = ember.cuda.graph(step, {warmup = 0})
  local r = ember.bench(function() g:replay() end, {warmup = 10, reps = args.reps, timer = "events"})
  g:close()
  if on ~= prev then ember.backends.fused_proj(prev) end
  return r.median * 1e6, kind
end

local groups = {
  {name = "q/k/v", outs = {D, D, D}, consume = function(ys, gs)
    return (ys[1] * gs[1]):sum() + (ys[2] * gs[2]):sum() + (ys[3] * gs[3]):sum()
  end},
  {name = "w1/w3", outs = {FF, FF}, consume = function(ys, gs)
    return (F.swiglu(ys[1], ys[2]) * gs[1]):sum()
  end},
}

print(("device %s, %s (d_model %d, d_ff %d), %d tokens, %s"):format(ember.cuda.get_device_name(), args.model, D, FF,
  M, os.date("!%Y-%m-%d %H:%M UTC")))
print("| group | unfused µs | fused µs | saved µs | fused node |")
print("|---|---|---|---|---|")
local results = {}
for _, gr in ipairs(groups) do
  local on, kind = timed(gr, true)                         -- first: the environment's mode still holds
  local off = timed(gr, false)
  print(("| %s | %.1f | %.1f | %.1f | %s |"):format(gr.name, off, on, off - on, kind))
  results[#results + 1] = {group = gr.name, unfused_us = off, fused_us = on, node = kind}
end
if args.json then
  local f = assert(io.open(args.json, "a"))
  f:write(require("cjson").encode({bench = "linear_group", model = args.model, tokens = M,
    commit = require("ember.runinfo").git_commit(), results = results}), "\n")
  f:close()
end
