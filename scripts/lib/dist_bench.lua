-- dist_bench.lua — what the distributed studies (scripts/bench_allreduce.lua,
-- bench_ddp.lua, bench_zero.lua) share: the driver/worker split, starting
-- Ember's ranks through `ember launch` and PyTorch's through torchrun one
-- after the other (so they never share the GPUs), timing helpers that agree
-- across ranks, and the output files. Load it with dofile (not a package):
--   local DB = dofile(script_dir .. "lib/dist_bench.lua")
--
-- The decision a reader may question: a study script is its own driver. Run
-- plainly (`ember run scripts/bench_ddp.lua --nproc 2`), it is not under a
-- launch (no EMBER_WORLD_SIZE in its environment), so it re-runs itself as
-- `ember launch --nproc N <script> <worker args> --json TMP`, then runs the
-- PyTorch twin under torchrun, reads both JSON-lines files and prints one
-- table. Run under `ember launch` (or mpirun/srun), it measures. So `ember
-- sweep` (which runs `ember run SCRIPT ...` per point) sweeps distributed
-- runs without knowing about launches.
local ember = require "ember"
local report = require "ember.report"

local M = {}

M.MiB, M.GiB = 2 ^ 20, 2 ^ 30

--- True under `ember launch`, mpirun or srun (the executable sets
-- EMBER_WORLD_SIZE from them): this process is one rank and measures.
function M.is_worker()
  local n = os.getenv("EMBER_WORLD_SIZE")
  return n ~= nil and n ~= ""
end

--- s quoted for the shell.
function M.q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

--- A comma list of numbers ("1,10,100") -> array; nil and a message when
-- an item is not a positive number.
function M.numbers(text, what)
  local out = {}
  for item in (tostring(text) .. ","):gmatch("([^,]*),") do
    local v = tonumber(item)
    if not v or v <= 0 then
      return nil, ("%s expects a comma list of positive numbers, got '%s'"):format(what, text)
    end
    out[#out + 1] = math.tointeger(v) or v
  end
  return out
end

--- A comma list of names, each in `allowed` (a set) -> array, or nil, message.
function M.names(text, what, allowed)
  local out = {}
  for item in (tostring(text) .. ","):gmatch("([^,]*),") do
    if not allowed[item] then
      local names = {}
      for k in pairs(allowed) do names[#names + 1] = k end
      table.sort(names)
      return nil, ("%s expects a comma list of %s; got '%s'"):format(what, table.concat(names, ", "), item)
    end
    out[#out + 1] = item
  end
  return out
end

--- Median of a list of numbers.
function M.median(xs) return require("ember.bench").stats(xs).median end

--- The driver/output options every study has (argparse parser in, parser out).
function M.add_common_options(parser, default_nproc_text)
  parser:option("--nproc", "Ranks (one per GPU) the driver launches (" .. default_nproc_text .. ").")
    :convert(math.tointeger)
  parser:option("--device", "cuda (NCCL) or cpu (MPI) (default: cuda when available).")
  parser:option("--json", "Append one JSON line per result (Ember's and PyTorch's) to this file.")
  parser:option("--md", "Write the header and the Markdown table to this file.")
  parser:option("--out", "Directory: writes <study>.jsonl and <study>.md there (like --json and --md).")
  parser:option("--torch", "Run the PyTorch twin after Ember's ranks: auto (when python3 can import " ..
    "torch), on (fail without it) or off.", "auto"):choices({"auto", "on", "off"})
  parser:option("--python", "Python interpreter for the PyTorch twin.", "python3")
  parser:option("--timeout", "Collective timeout of the launched ranks, seconds (ember launch --timeout).")
    :convert(math.tointeger)
end

--- Fill args.device, args.nproc and the output paths; `study` names the files of --out.
function M.resolve_common(args, study)
  args.device = args.device or (ember.cuda.is_available() and "cuda" or "cpu")
  if not args.device:match("^cuda") and args.device ~= "cpu" then
    return nil, "--device expects cpu or cuda, got '" .. args.device .. "'"
  end
  if args.device:match("^cuda") then args.device = "cuda" end   -- each rank takes its local GPU
  if args.nproc == nil then
    local n = args.device == "cuda" and ember.cuda.device_count() or 2
    args.nproc = math.max(1, n)
  end
  if args.nproc < 1 then return nil, "--nproc must be a positive integer" end
  if args.out then
    os.execute("mkdir -p " .. M.q(args.out))
    args.json = args.json or (args.out .. "/" .. study .. ".jsonl")
    args.md = args.md or (args.out .. "/" .. study .. ".md")
  end
  return true
end

--- Print the device / commit / date / config lines (rank 0, or the driver);
-- returns the runinfo facts and the lines (for the Markdown file).
function M.print_header(device, config_text)
  local facts = require("ember.runinfo").collect(device)
  local lines = {
    ("device: %s%s, %d CPU threads"):format(facts.device,
      facts.driver and (", driver " .. facts.driver) or "", facts.threads or 1),
    ("commit: %s, %s, ember %s"):format(facts.commit, os.date("!%Y-%m-%d %H:%M UTC"), ember.version),
    "config: " .. config_text,
  }
  for _, l in ipairs(lines) do print(l) end
  return facts, lines
end

-- ---------------------------------------------------------------------------
-- running the ranks

--- The ember executable (the one running this script, as ember sweep finds it).
function M.ember_exe() return require("ember.sweep_run").find_exe() end

--- Run a shell command with its output on ours; returns true or false, how.
function M.run(cmd)
  io.stdout:write("$ ", cmd, "\n")
  io.stdout:flush()
  local ok, kind, code = os.execute(cmd)
  if ok then return true end
  return false, ("%s %s"):format(kind, tostring(code))
end

--- A fresh temporary file path (nothing created).
function M.temp(suffix)
  local p = os.tmpname()
  os.remove(p)
  return p .. (suffix or "")
end

-- JSON null (PyTorch's None) as a missing value.
local function drop_nulls(recs)
  for _, r in ipairs(recs or {}) do
    for k, v in pairs(r) do if v == require("cjson").null then r[k] = nil end end
  end
  return recs
end

--- `ember launch --nproc N script worker_args --json tmp`: the records rank 0
-- wrote, or nil and why.
function M.launch_ember(script, nproc, worker_args, timeout)
  local json = M.temp(".jsonl")
  local parts = {M.q(M.ember_exe()), "launch", "--nproc", tostring(nproc)}
  if timeout then parts[#parts + 1] = "--timeout " .. timeout end
  parts[#parts + 1] = M.q(script)
  for _, a in ipairs(worker_args) do parts[#parts + 1] = M.q(a) end
  parts[#parts + 1] = "--json " .. M.q(json)
  local ok, how = M.run(table.concat(parts, " "))
  local recs = drop_nulls(report.read_jsonl(json))
  os.remove(json)
  if not ok and not (recs and #recs > 0) then return nil, "ember launch failed (" .. how .. ")" end
  if not recs or #recs == 0 then return nil, "the ranks wrote no JSON line" end
  return recs
end

--- Whether `python` can import torch: version string, or nil and why.
function M.torch_version(python)
  local out = require("ember.runinfo").sh(M.q(python) ..
    " -c 'import torch, torch.distributed; print(torch.__version__)'")
  if out and out:match("^%d") then return out:match("[^\n]+$") end
  return nil, ("%s cannot import torch"):format(python)
end

--- The PyTorch twin under torchrun: records, or nil and why. EMBER_COMMIT
-- gives its lines Ember's commit, so the two sides carry the same one.
function M.torchrun(python, nproc, pyscript, py_args, commit)
  local json = M.temp(".jsonl")
  local parts = {"EMBER_COMMIT=" .. M.q(commit), "OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}", M.q(python),
    "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", tostring(nproc), M.q(pyscript)}
  for _, a in ipairs(py_args) do parts[#parts + 1] = M.q(a) end
  parts[#parts + 1] = "--json " .. M.q(json)
  local ok, how = M.run(table.concat(parts, " "))
  local recs = drop_nulls(report.read_jsonl(json))
  os.remove(json)
  if not ok and not (recs and #recs > 0) then return nil, "torchrun failed (" .. how .. ")" end
  if not recs or #recs == 0 then return nil, "the PyTorch ranks wrote no JSON line" end
  return recs
end

--- Decide whether to run PyTorch: returns true, or false and the sentence to print.
function M.want_torch(args)
  if args.torch == "off" then return false, "PyTorch: not run (--torch off)" end
  local v, why = M.torch_version(args.python)
  if v then return true, "PyTorch: torch " .. v end
  if args.torch == "on" then return nil, "PyTorch: --torch on, but " .. why end
  return false, "PyTorch: not run (" .. why .. "; --python to choose another interpreter)"
end

-- ---------------------------------------------------------------------------
-- in a rank

--- v reduced over ranks (op "max", "min", "sum" or "avg"), through a 1-element
-- f64 tensor on `device` (so a backend = "nccl" job works too).
function M.reduce_number(v, op, device)
  local t = ember.tensor({v}, {dtype = "f64", device = device})
  ember.dist.all_reduce(t, {op = op})
  return t:item()
end

--- Time `fn` (which issues collectives and/or device work) as the studies
-- do: CUDA: an event on the current stream before and after `reps` calls,
-- then synchronize; CPU: the wall clock. Returns ms per call, this rank's.
function M.time_calls(fn, reps, on_cuda)
  if on_cuda then
    local e0, e1 = ember.cuda.Event{enable_timing = true}, ember.cuda.Event{enable_timing = true}
    e0:record()
    for _ = 1, reps do fn() end
    e1:record()
    e1:synchronize()
    return e0:elapsed_time(e1) / reps
  end
  local t0 = ember.core.clock()
  for _ = 1, reps do fn() end
  return (ember.core.clock() - t0) * 1e3 / reps
end

--- A JSON line for rank 0 to append: runinfo facts, results, config (flat).
function M.record(config, results, device)
  return report.record(config, results, device)
end

-- ---------------------------------------------------------------------------
-- output

--- Append records to args.json and write the header + table to args.md.
function M.write_outputs(args, records, header_lines, table_text, notes)
  if args.json then
    for _, r in ipairs(records) do report.append_jsonl(args.json, r) end
    print(("json: %d lines appended to %s"):format(#records, args.json))
  end
  if args.md then
    local parts = {}
    for _, l in ipairs(header_lines) do parts[#parts + 1] = l .. "  " end
    parts[#parts + 1] = ""
    parts[#parts + 1] = table_text
    for _, n in ipairs(notes or {}) do parts[#parts + 1] = n end
    report.write_file(args.md, table.concat(parts, "\n") .. "\n")
    print("markdown: " .. args.md)
  end
end

--- One JSON line from a rank (rank 0 only): append to `path` when given.
function M.append(path, rec)
  if path then report.append_jsonl(path, rec) end
end

return M
