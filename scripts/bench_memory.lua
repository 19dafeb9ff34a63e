--- What memory history costs: allocation/free pairs per second with
-- recording off and on (with and without caller frames), and a training step
-- of the reference TransformerLM with recording off and on.
--
--   ember run scripts/bench_memory.lua                       # CPU, tiny model
--   ember run scripts/bench_memory.lua --device cuda --model small --batch 4 --context 512
local ember = require "ember"
local argparse = require "argparse"
local nn, optim, F = ember.nn, ember.optim, ember.nn.functional
local memory = ember.memory

local parser = argparse("bench_memory.lua", "Cost of ember.memory.record_history.")
parser:option("--device", "cpu or cuda.", "cpu"):choices({"cpu", "cuda"})
parser:option("--model", "Model size (nn.configs).", "tiny"):choices({"tiny", "small", "medium", "large", "xl", "2.7b"})
parser:option("--batch", "Batch size.", "4"):convert(math.tointeger)
parser:option("--context", "Context length.", "64"):convert(math.tointeger)
parser:option("--pairs", "Allocation/free pairs for the raw rate.", "200000"):convert(math.tointeger)
parser:option("--steps", "Timed training steps per setting.", "5"):convert(math.tointeger)
local args = parser:parse(arg)

local function sync() if args.device == "cuda" then ember.cuda.synchronize() end end

local SETTINGS = {
  {"off", nil},
  {"on", {}},
  {"on, stack_depth=4", {stack_depth = 4}},
}

-- raw rate: a 16-element tensor made and dropped (<close> frees it at once)
print(("%-20s %14s %12s"):format("alloc/free pairs", "pairs/s", "ns/event"))
for _, s in ipairs(SETTINGS) do
  if s[2] then memory.record_history(true, s[2]) end
  collectgarbage()
  local t0 = ember.clock()
  for _ = 1, args.pairs do
    local t <close> = ember.empty(16, {device = args.device})
  end
  sync()
  local dt = ember.clock() - t0
  memory.record_history(false)
  memory.clear_history()
  print(("%-20s %14.0f %12.0f"):format(s[1], args.pairs / dt, dt / (2 * args.pairs) * 1e9))
end

-- a training step
ember.manual_seed(0)
local cfg = nn.configs[args.model]{vocab_size = 10000, context_length = args.context}
local model = nn.TransformerLM(cfg):to(args.device)
local opt = optim.AdamW(model:parameters(), {lr = 1e-4})
local x = ember.randint(0, cfg.vocab_size, {args.batch, args.context + 1}, {device = args.device})
local inputs, targets = x:narrow(1, 0, args.context), x:narrow(1, 1, args.context)
local function step()
  opt:zero_grad()
  F.cross_entropy(model(inputs), targets):backward()
  opt:step()
end
step()                                      -- warm-up: optimizer state, workspaces
print(("\n%-20s %12s %14s"):format(args.model .. " train step", "ms/step", "events/step"))
for _, s in ipairs(SETTINGS) do
  if s[2] then memory.record_history(true, s[2]) end
  collectgarbage()
  sync()
  local t0 = ember.clock()
  for _ = 1, args.steps do step() end
  sync()
  local dt = (ember.clock() - t0) / args.steps
  local events = memory.stats(args.device == "cpu" and "cpu" or nil).history.recorded / args.steps
  memory.record_history(false)
  memory.clear_history()
  print(("%-20s %12.2f %14.0f"):format(s[1], dt * 1e3, events))
end
