--- Record the memory history of a training step and write it in the three
-- forms: Ember's JSON, PyTorch's memory_viz pickle, and an HTML timeline.
--
--   ember run examples/memory_snapshot.lua [--model small] [--device cuda] [--out DIR]
--   python -m torch.cuda._memory_viz trace_plot DIR/step.pickle -o DIR/trace.html
--   (DIR/step.html is memviz.lua's own page: open it in any browser)
local ember = require "ember"
local argparse = require "argparse"
local nn, optim, F = ember.nn, ember.optim, ember.nn.functional

local p = argparse("memory_snapshot.lua", "Record one training step's allocations and write snapshots.")
p:option("--model", "Model size (nn.configs).", "tiny"):choices({"tiny", "small", "medium", "large", "xl", "2.7b"})
p:option("--context", "Context length.", "128"):convert(math.tointeger)
p:option("--batch", "Batch size.", "4"):convert(math.tointeger)
p:option("--device", "cpu or cuda (default: cuda when available).")
p:option("--out", "Output folder.", "snapshots")
local a = p:parse(arg)
a.device = a.device or (ember.cuda.is_available() and "cuda" or "cpu")
os.execute("mkdir -p '" .. a.out .. "'")

local model = nn.TransformerLM(nn.configs[a.model]{vocab_size = 10000, context_length = a.context, device = a.device})
local opt = optim.AdamW(model:parameters(), {lr = 1e-4})
local x = ember.randint(0, 10000, {a.batch, a.context}, {device = a.device})
local y = ember.randint(0, 10000, {a.batch, a.context}, {device = a.device})
local function step()
  opt:zero_grad()
  local loss = ember.autocast("bf16", function() return F.cross_entropy(model(x), y) end)
  loss:backward()
  opt:step()
end

step()                                      -- AdamW state exists before recording
ember.memory.record_history(true)
step()
ember.memory.record_history(false)
ember.memory.snapshot(a.out .. "/step.json")
ember.memory.snapshot(a.out .. "/step.pickle")
print(("wrote %s/step.json and %s/step.pickle"):format(a.out, a.out))
local exe = require("ember.sweep_run").find_exe()     -- this process's ember executable
os.execute(("'%s' run scripts/memviz.lua '%s/step.json' -o '%s/step.html'"):format(exe, a.out, a.out))
