--- Train the reference TransformerLM on a tokenized corpus: AdamW, cosine
-- schedule with warm-up, gradient clipping, bf16 autocast, gradient
-- accumulation, CUDA graphs, validation loss, JSON-lines log, SVG loss curve
-- and atomic checkpoints that resume bit for bit. The loop is ember.trainer
-- (bindings/ember/trainer.lua); this script is its command line.
--
--   ember run scripts/tokenize.lua corpus.txt --train-tokenizer tok.json --vocab-size 8000 \
--     --out data/train.npy --val-fraction 0.01
--   ember run scripts/train.lua --train data/train.npy --val data/train.val.npy --tokenizer tok.json \
--     --model small --context 512 --batch 16 --steps 5000 --out runs/small
--   ember run scripts/train.lua --resume runs/small            # after a Ctrl-C or a crash
--   ember launch --nproc 2 scripts/train.lua --config run.json --ddp bucketed --zero
--
-- Options come from the flags, or from a JSON or Lua file (--config FILE,
-- keys as the flags) that flags given on the command line override; a
-- resumed run starts from the checkpoint's config. docs/training.md has the
-- workflow, the checkpoint layout and the log format.
local ember = require "ember"
local argparse = require "argparse"
local trainer = require "ember.trainer"

local script_dir = (arg and arg[0] or ""):match("^(.*/)") or "./"
local S = dofile(script_dir .. "lib/study.lua")
local peaks = dofile(script_dir .. "lib/device_peaks.lua")

local parser = argparse("train.lua", "Train the reference TransformerLM on a tokenized corpus (ember.trainer).")
  :epilog("A resumed run keeps its saved config and takes only the flags given (not the model's shape). " ..
    "Exit status: 0 done, 1 error, 2 bad options, 130 stopped by Ctrl-C after writing a checkpoint. " ..
    "See docs/training.md.")
local function to_int(s) return math.tointeger(tonumber(s)) end
for _, o in ipairs(trainer.OPTIONS) do
  local key, kind, default, help, choices = o[1], o[2], o[3], o[4], o[5]
  local flag = "--" .. key:gsub("_", "-")
  if default ~= nil and kind ~= "bool" then help = help .. (" (default: %s)"):format(tostring(default)) end
  if kind == "bool" then
    parser:flag(flag, help)
  else
    local opt = parser:option(flag, help)
    if kind == "int" then opt:convert(to_int)
    elseif kind == "number" then opt:convert(tonumber)
    elseif kind == "choice" then opt:choices(choices) end
  end
end
local args = parser:parse(arg)

local function fail(msg)
  io.stderr:write("train.lua: ", tostring(msg):gsub("^ember%.trainer: ", ""), "\n")
  os.exit(2)
end

-- only the options given: the trainer layers them over the defaults, the checkpoint and --config
local given = {}
for _, o in ipairs(trainer.OPTIONS) do
  if args[o[1]] ~= nil then given[o[1]] = args[o[1]] end
end
local ok, cfg = pcall(trainer.resolve, given)
if not ok then fail(cfg) end

local rank = tonumber(os.getenv("EMBER_RANK") or "0") or 0
local facts = require("ember.runinfo").collect(cfg.device)
if rank == 0 then S.print_header(facts) end
if cfg.peak_tflops == nil and cfg.device ~= "cpu" then
  local p = peaks.lookup(facts.device)
  cfg.peak_tflops = p and p.tflops[cfg.precision == "bf16" and "bf16" or "f32"] or nil
end

-- errors inside the loop carry their traceback already
local okrun, summary = pcall(trainer.run, cfg)
if not okrun then
  io.stderr:write("train.lua: ", tostring(summary), "\n")
  os.exit(1)
end
if summary.interrupted then
  if rank == 0 then
    print(("resume with: ember run %s --resume %s"):format(arg[0], summary.out))
    io.stdout:flush()
  end
  -- Under `ember launch` the ranks stopped after the same step and the
  -- launcher itself exits 130: a rank exiting non-zero would make mpirun
  -- kill the ranks still finishing (rank 0 writing loss.svg), and would skip
  -- the clean MPI finalize that exit status 0 runs (ember.dist at exit).
  os.exit(os.getenv("EMBER_LAUNCH_DIR") and 0 or 130)
end
os.exit(0)
