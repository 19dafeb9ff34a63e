--- ember.checkpoint: training checkpoints as folders, written atomically.
--
--   local ckpt = require "ember.checkpoint"       -- also ember.checkpoint
--   local dir = ckpt.save_run("runs/a", 100, {model = model, config = cfg, step = 100,
--                             optimizer = opt:state_dict(), tokenizer = tok, state = {...}})
--   local model, cfg, meta = ckpt.load_model("runs/a", {device = "cuda"})   -- a run folder or a checkpoint
--
-- A checkpoint is a folder holding
--   model.safetensors      model:state_dict(); metadata `config` = the JSON of the
--                          TransformerLM config (CONFIG_KEYS) and `step` = "100"
--   tokenizer.json         the run's tokenizer (tok:save), when the run has one
--   optimizer.safetensors  optim.state_to_tensors(opt:state_dict()), when given
--   trainer.json           the trainer's own state (ember.trainer: step, RNG,
--                          data position, schedule, run config), when given
-- A run folder keeps them as checkpoints/step_00000100/ with the file
-- checkpoints/latest naming the newest.
--
-- Why a folder is written beside its final name and renamed: a crash or a
-- second Ctrl-C in the middle leaves DIR.tmp, never a DIR with some files
-- missing; `latest` moves to the new folder only once it is complete, and the
-- older folders are removed after that, so a complete checkpoint exists at
-- every moment.
-- @module ember.checkpoint

local ember = require "ember"
local util = require "ember.util"
local cjson = require "cjson"

local fmt = string.format
local M = {}

M.MODEL_FILE = "model.safetensors"
M.OPTIMIZER_FILE = "optimizer.safetensors"
M.STATE_FILE = "trainer.json"
M.TOKENIZER_FILE = "tokenizer.json"
--- The TransformerLM config keys stored in model.safetensors' metadata.
M.CONFIG_KEYS = {"vocab_size", "context_length", "d_model", "d_ff", "num_layers", "num_heads", "rope_theta"}

-- ---------------------------------------------------------------------------
-- files and folders

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

--- True when path names an existing file or folder.
function M.exists(path)
  return os.rename(path, path) ~= nil       -- rename(2) onto itself: succeeds iff path exists
end

local function sh(fname, cmd)
  local ok = os.execute(cmd)
  if not ok then error(fmt("%s: '%s' failed", fname, cmd), 3) end
end

local function mkdir_p(fname, dir) sh(fname, "mkdir -p " .. q(dir)) end
local function rm_rf(fname, path) sh(fname, "rm -rf " .. q(path)) end

local function read_text(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

-- cjson reads every number as a float: integral ones back to integers
local function integers(v)
  if type(v) == "number" then return math.tointeger(v) or v end
  if type(v) == "table" then
    for k, x in pairs(v) do v[k] = integers(x) end
  end
  return v
end

local function decode_json(fname, path, text)
  local ok, v = pcall(cjson.decode, text)
  if not ok or type(v) ~= "table" then
    error(fmt("%s: '%s' is not a JSON object (%s)", fname, path, ok and type(v) or tostring(v)), 3)
  end
  return integers(v)
end

--- The TransformerLM config table (CONFIG_KEYS only; rope_theta 10000 unless given).
function M.model_config(cfg)
  local out = {}
  for _, k in ipairs(M.CONFIG_KEYS) do out[k] = cfg[k] end
  out.rope_theta = out.rope_theta or 10000
  for _, k in ipairs(M.CONFIG_KEYS) do
    if type(out[k]) ~= "number" then
      error(fmt("ember.checkpoint: expected config.%s to be a number, got %s", k, tostring(out[k])), 3)
    end
  end
  return out
end

-- ---------------------------------------------------------------------------
-- writing

--- write(dir, parts): the checkpoint folder `dir`, atomically (see above);
-- an existing `dir` is replaced once the new folder is complete.
-- parts: model (a module or a state dict) and config (TransformerLM config),
-- step (integer); optional optimizer (an optimizer state_dict table),
-- tokenizer (an ember.tokenizer or the path of a tokenizer.json), state (a
-- table written as trainer.json, numbers exact).
function M.write(dir, parts)
  local fname = "ember.checkpoint.write"
  if type(dir) ~= "string" or dir == "" then error(fmt("%s: expected a folder path, got %s", fname, tostring(dir)), 2) end
  if type(parts) ~= "table" or parts.model == nil then
    error(fmt("%s: expected {model =, config =, step =, ...}, got %s", fname,
              type(parts) == "table" and "a table without model" or type(parts)), 2)
  end
  local step = parts.step
  if math.type(step) ~= "integer" or step < 0 then
    error(fmt("%s: expected step to be a non-negative integer, got %s", fname, tostring(step)), 2)
  end
  local config = M.model_config(parts.config or {})
  local sd = parts.model
  if type(sd) == "table" and type(sd.state_dict) == "function" then sd = sd:state_dict() end
  dir = dir:gsub("/+$", "")
  local tmp, old = dir .. ".tmp", dir .. ".old"
  rm_rf(fname, tmp)
  mkdir_p(fname, tmp)
  local ok, err = pcall(function()
    ember.save(tmp .. "/" .. M.MODEL_FILE, sd,
      {metadata = {config = util.json_encode(config, M.CONFIG_KEYS), step = tostring(step)}})
    if parts.optimizer then
      ember.save(tmp .. "/" .. M.OPTIMIZER_FILE, ember.optim.state_to_tensors(parts.optimizer))
    end
    local tok = parts.tokenizer
    if type(tok) == "string" then
      local text = read_text(tok)
      if not text then error(fmt("%s: cannot read the tokenizer '%s'", fname, tok), 0) end
      require("ember.report").write_file(tmp .. "/" .. M.TOKENIZER_FILE, text)
    elseif tok ~= nil then
      tok:save(tmp .. "/" .. M.TOKENIZER_FILE)
    end
    if parts.state then
      require("ember.report").write_file(tmp .. "/" .. M.STATE_FILE, util.json_encode(parts.state) .. "\n")
    end
  end)
  if not ok then
    os.execute("rm -rf " .. q(tmp))
    error(err, 0)
  end
  if M.exists(dir) then
    rm_rf(fname, old)
    assert(os.rename(dir, old))
    assert(os.rename(tmp, dir))
    rm_rf(fname, old)
  else
    local renamed, rerr = os.rename(tmp, dir)
    if not renamed then error(fmt("%s: cannot rename '%s' to '%s': %s", fname, tmp, dir, tostring(rerr)), 2) end
  end
  return dir
end

-- Names in a run's checkpoints folder: complete ones (step_N) and leftovers
-- of an interrupted write (step_N.tmp, step_N.old).
local function entries(run_dir)
  local p = io.popen("ls -1 " .. q(run_dir .. "/checkpoints") .. " 2>/dev/null")
  local names, leftovers = {}, {}
  for name in p:lines() do
    if name:match("^step_%d+$") then names[#names + 1] = name
    elseif name:match("^step_%d+%.tmp$") or name:match("^step_%d+%.old$") then leftovers[#leftovers + 1] = name end
  end
  p:close()
  table.sort(names)
  return names, leftovers
end

--- The checkpoint folders of a run folder (step_* names, oldest first).
function M.list(run_dir) return (entries(run_dir)) end

--- save_run(run_dir, step, parts[, {keep = 1}]) -> the checkpoint folder
-- run_dir/checkpoints/step_%08d (write), then checkpoints/latest names it,
-- then all but the `keep` newest are removed (keep = 0: none are), and
-- the leftovers of an interrupted write (step_N.tmp, step_N.old).
--- The folder save_run(run_dir, step, ...) writes: RUN/checkpoints/step_NNNNNNNN
-- (every rank of a distributed run can name it without the writer telling it).
function M.run_step_dir(run_dir, step)
  return fmt("%s/checkpoints/step_%08d", run_dir, step)
end

function M.save_run(run_dir, step, parts, opts)
  local fname = "ember.checkpoint.save_run"
  opts = util.check_opts(fname, opts, 3)
  local keep = opts.keep or 1
  if math.type(keep) ~= "integer" or keep < 0 then
    error(fmt("%s: expected keep to be an integer >= 0, got %s", fname, tostring(keep)), 2)
  end
  if math.type(step) ~= "integer" or step < 0 then
    error(fmt("%s: expected step to be a non-negative integer, got %s", fname, tostring(step)), 2)
  end
  local ckdir = run_dir .. "/checkpoints"
  mkdir_p(fname, ckdir)
  local name = M.run_step_dir(run_dir, step):match("[^/]+$")
  local all = {}
  for k, v in pairs(parts) do all[k] = v end
  all.step = all.step or step
  M.write(ckdir .. "/" .. name, all)
  require("ember.report").write_file(ckdir .. "/latest", name .. "\n")
  local names, leftovers = entries(run_dir)
  for _, left in ipairs(leftovers) do rm_rf(fname, ckdir .. "/" .. left) end
  if keep > 0 then
    for i = 1, #names - keep do
      if names[i] ~= name then rm_rf(fname, ckdir .. "/" .. names[i]) end
    end
  end
  return ckdir .. "/" .. name
end

-- ---------------------------------------------------------------------------
-- reading

--- The newest checkpoint folder of a run folder, or nil.
function M.latest(run_dir)
  local name = read_text(run_dir .. "/checkpoints/latest")
  name = name and name:match("^%s*(.-)%s*$")
  if not name or name == "" then return nil end
  return run_dir .. "/checkpoints/" .. name
end

--- The checkpoint folder `path` names: itself when it holds model.safetensors,
-- else a run folder's latest. Errors say what was looked for.
function M.resolve(path, fname)
  fname = fname or "ember.checkpoint.resolve"
  if type(path) ~= "string" then error(fmt("%s: expected a folder path, got %s", fname, type(path)), 3) end
  path = path:gsub("/+$", "")
  if M.exists(path .. "/" .. M.MODEL_FILE) then return path end
  local latest = M.latest(path)
  if latest and M.exists(latest .. "/" .. M.MODEL_FILE) then return latest end
  if latest then
    error(fmt("%s: '%s/checkpoints/latest' names '%s', which holds no %s", fname, path, latest, M.MODEL_FILE), 3)
  end
  error(fmt("%s: expected a checkpoint folder (with %s) or a run folder (with checkpoints/latest), got '%s'",
            fname, M.MODEL_FILE, path), 3)
end

--- load(path) -> {dir, model_state (CPU tensors), metadata (strings), config,
-- step, optimizer (state_dict table or nil), state (trainer.json or nil),
-- tokenizer (path of tokenizer.json or nil)}.
function M.load(path)
  local fname = "ember.checkpoint.load"
  local dir = M.resolve(path, fname)
  local sd, meta = ember.load(dir .. "/" .. M.MODEL_FILE)
  if not meta.config then
    error(fmt("%s: '%s/%s' has no 'config' metadata", fname, dir, M.MODEL_FILE), 2)
  end
  local out = {dir = dir, model_state = sd, metadata = meta,
    config = decode_json(fname, dir .. "/" .. M.MODEL_FILE .. " (metadata config)", meta.config),
    step = math.tointeger(tonumber(meta.step or ""))}
  if M.exists(dir .. "/" .. M.OPTIMIZER_FILE) then
    out.optimizer = ember.optim.tensors_to_state(ember.load(dir .. "/" .. M.OPTIMIZER_FILE))
  end
  local text = read_text(dir .. "/" .. M.STATE_FILE)
  if text then out.state = decode_json(fname, dir .. "/" .. M.STATE_FILE, text) end
  if M.exists(dir .. "/" .. M.TOKENIZER_FILE) then out.tokenizer = dir .. "/" .. M.TOKENIZER_FILE end
  return out
end

--- load_model(path[, {device =, dtype =}]) -> model, config, metadata: the
-- TransformerLM of a checkpoint (or a run folder's latest), in eval mode.
-- config is the TransformerLM config table; metadata the safetensors
-- metadata as stored (strings: metadata.step, metadata.config). The global
-- random state is left as it was (building the model draws its init).
function M.load_model(path, opts)
  local fname = "ember.checkpoint.load_model"
  opts = util.check_opts(fname, opts, 3)
  for k in pairs(opts) do
    if k ~= "device" and k ~= "dtype" then
      error(fmt("%s: unknown option '%s' (expected: device, dtype)", fname, tostring(k)), 2)
    end
  end
  local dir = M.resolve(path, fname)
  local sd, meta = ember.load(dir .. "/" .. M.MODEL_FILE)
  if not meta.config then
    error(fmt("%s: '%s/%s' has no 'config' metadata", fname, dir, M.MODEL_FILE), 2)
  end
  local config = decode_json(fname, dir .. "/" .. M.MODEL_FILE .. " (metadata config)", meta.config)
  local build = {}
  for k, v in pairs(config) do build[k] = v end
  build.device, build.dtype = opts.device, opts.dtype
  local rng = ember.get_rng_state()
  local ok, model = pcall(ember.nn.TransformerLM, build)
  ember.set_rng_state(rng)
  if not ok then error(fmt("%s: '%s': %s", fname, dir, tostring(model)), 2) end
  model:load_state_dict(sd)
  model:eval()
  return model, config, meta
end

return M
