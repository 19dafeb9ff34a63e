--- ember.trainer: the training loop behind scripts/train.lua, for scripts
-- and demos that train without the command line.
--
--   local trainer = require "ember.trainer"          -- also ember.trainer
--   local summary = trainer.run{train = "train.npy", val = "val.npy", tokenizer = "tok.json",
--                               model = "tiny", context = 128, batch = 16, steps = 200, out = "runs/a"}
--   trainer.run{resume = "runs/a", steps = 400}       -- continues bit for bit where it stopped
--
-- One step: grad_accum micro-batches of `batch` sequences (per rank) from
-- an ember.data.Loader, forward and loss (under ember.autocast("bf16") with
-- precision = "bf16"), backward of loss / grad_accum, the DDP gradient
-- average (under `ember launch`), gradient clipping, AdamW (or ZeRO-1's
-- ShardedOptimizer) at the cosine schedule's learning rate with linear
-- warm-up. Weight decay applies to matrices, not to norm weights (1-D).
--
-- Why no host sync per step: losses (and gradient norms) are copied into a
-- device buffer and read every log_every steps; the data goes through pinned
-- memory (ember.data.Loader). With graph = true the whole step after the
-- first is one CUDA graph replay.
--
-- Why a resume is bit-identical: a checkpoint holds everything a step reads
-- (parameters, AdamW moments and step counts, the data loader's generator
-- position, the global random state, the schedule's parameters and the step)
-- and numbers are written with all their digits (ember.util.json_encode).
-- Ctrl-C is deferred to the end of the step it arrives in (ember.util
-- defer_interrupts), so the checkpoint it triggers is never half a step.
-- With ranks (`ember launch` gives each rank the SIGINT) they stop after the
-- same step: the interrupt flag is all-reduced (max) at the log points, where
-- the host syncs for the log anyway, so a stop costs no per-step collective.
-- @module ember.trainer

local ember = require "ember"
local util = require "ember.util"
local checkpoint = require "ember.checkpoint"
local report = require "ember.report"
local cjson = require "cjson"

local fmt = string.format
local M = {}
local FNAME = "ember.trainer"

--- The options: {key, kind, default, help[, choices]}. Keys are the
-- command-line flags with "_" for "-". A nil default is resolved at run time
-- (the help says how).
M.OPTIONS = {
  {"config", "string", nil, "A JSON or Lua file of options (keys as these flags, '-' or '_'); options given " ..
    "explicitly override it."},
  {"train", "string", nil, "Training tokens: a 1-D .npy of ids (scripts/tokenize.lua), memory-mapped."},
  {"val", "string", nil, "Validation tokens (.npy) for the eval loss."},
  {"tokenizer", "string", nil, "The corpus' tokenizer (tok.json): gives the vocabulary size and is copied into " ..
    "every checkpoint."},
  {"out", "string", "runs/train", "Run folder: config.json, log.jsonl, loss.svg, checkpoints/."},
  {"resume", "string", nil, "Continue from a checkpoint folder, or from a run folder's latest checkpoint."},
  {"model", "choice", "small", "Model size (nn.configs); --d-model etc. override its numbers.",
    {"tiny", "small", "medium", "large", "xl", "2.7b"}},
  {"d_model", "int", nil, "Override d_model."},
  {"d_ff", "int", nil, "Override d_ff."},
  {"layers", "int", nil, "Override num_layers."},
  {"heads", "int", nil, "Override num_heads."},
  {"vocab", "int", nil, "Vocabulary size (default: the tokenizer's)."},
  {"context", "int", 256, "Context length T (tokens per sequence)."},
  {"rope_theta", "number", 10000, "RoPE theta."},
  {"attn", "choice", "auto", "Attention: auto (flash on CUDA with bf16), flash or naive.", {"auto", "flash", "naive"}},
  {"batch", "int", 16, "Sequences per micro-batch, per rank."},
  {"grad_accum", "int", 1, "Micro-batches per optimizer step."},
  {"steps", "int", 1000, "Optimizer steps in all (a resumed run continues up to it)."},
  {"decay_steps", "int", nil, "Length of the cosine decay (default: --steps); kept by a resumed run."},
  {"lr", "number", 3e-4, "Peak learning rate (AdamW)."},
  {"min_lr", "number", nil, "Learning rate at the end of the decay (default: lr / 10)."},
  {"warmup", "int", nil, "Linear warm-up steps (default: min(100, decay_steps // 10))."},
  {"weight_decay", "number", 0.1, "AdamW weight decay (matrices only)."},
  {"beta1", "number", 0.9, "AdamW beta1."},
  {"beta2", "number", 0.95, "AdamW beta2."},
  {"eps", "number", 1e-8, "AdamW eps."},
  {"clip", "number", 1.0, "Clip the gradient norm to this (0: no clipping)."},
  {"overlap_optimizer", "bool", false, "AdamW's updates during the last micro-batch's backward, each as soon as " ..
    "its gradient is final (opt:step_in_backward; same bits). With --clip > 0 only with --clip-mode previous."},
  {"clip_mode", "choice", "exact", "With --overlap-optimizer and --clip > 0: exact (clip_grad_norm, no " ..
    "overlap) or previous (scale by the previous step's norm: overlaps, not exact).", {"exact", "previous"}},
  {"precision", "choice", nil, "f32, or bf16 autocast (default: bf16 on CUDA, f32 on the CPU).", {"f32", "bf16"}},
  {"graph", "bool", false, "Capture the training step as a CUDA graph after the first step (CUDA only)."},
  {"device", "string", nil, "cpu or cuda (default: cuda when available)."},
  {"seed", "int", 0, "Seed of the initial weights; batches use their own generator, seeded seed + 1."},
  {"order", "choice", "random", "Training windows: random (uniform starts) or sequential (in order, epochs).",
    {"random", "sequential"}},
  {"eval_every", "int", 500, "Validation loss every N steps (0: only at the end); needs --val."},
  {"eval_batches", "int", 20, "Batches of the validation set per evaluation (the same ones each time)."},
  {"log_every", "int", 10, "Progress line and log flush every N steps (one host sync each on CUDA)."},
  {"ckpt_every", "int", 500, "Checkpoint every N steps (0: only at the end and on Ctrl-C)."},
  {"keep", "int", 1, "Checkpoints kept in the run folder (0: all)."},
  {"ddp", "choice", nil, "DDP strategy under `ember launch` (default there: bucketed).",
    {"naive", "flat", "overlap", "bucketed"}},
  {"bucket_mb", "number", 25, "Bucket size of --ddp bucketed (MB)."},
  {"zero", "bool", false, "ZeRO-1: shard the AdamW state across ranks (ShardedOptimizer)."},
  {"peak_tflops", "number", nil, "Peak TFLOP/s of one device for the MFU figure (scripts/train.lua: from the " ..
    "device name)."},
  {"quiet", "bool", false, "No progress lines (the log is still written)."},
}

local SPEC = {}
for _, o in ipairs(M.OPTIONS) do SPEC[o[1]] = {kind = o[2], default = o[3], choices = o[5]} end
-- a library caller may also force single-process training under a launch
SPEC.distributed = {kind = "bool"}

--- Keys a resumed run cannot change: the model's shape.
M.FIXED_ON_RESUME = {"model", "d_model", "d_ff", "layers", "heads", "vocab", "context", "rope_theta"}
-- not part of a run's saved config
local NOT_SAVED = {config = true, resume = true, distributed = true, quiet = true, peak_tflops = true}

-- ---------------------------------------------------------------------------
-- options

local function is_choice(v, choices)
  for _, c in ipairs(choices) do if v == c then return true end end
  return false
end

-- opts with keys normalised ("-" -> "_") and values checked; `where` names the source in errors
local function normalize(opts, where)
  local out = {}
  for k, v in pairs(opts) do
    if type(k) ~= "string" then error(fmt("%s: %s: expected option names, got a %s key", FNAME, where, type(k)), 0) end
    local key = k:gsub("-", "_")
    local spec = SPEC[key]
    if spec == nil then
      local names = {}
      for _, o in ipairs(M.OPTIONS) do names[#names + 1] = o[1] end
      error(fmt("%s: %s: unknown option '%s' (expected one of: %s)", FNAME, where, k, table.concat(names, ", ")), 0)
    end
    if v == cjson.null then v = nil end
    if v ~= nil then
      local kind, bad = spec.kind, false
      if kind == "int" then
        local i = type(v) == "number" and math.tointeger(v) or (type(v) == "string" and math.tointeger(tonumber(v)))
        bad, v = i == nil, i
      elseif kind == "number" then
        local n = type(v) == "number" and v or (type(v) == "string" and tonumber(v))
        bad, v = not n or n ~= n, n
      elseif kind == "bool" then
        bad = type(v) ~= "boolean"
      elseif kind == "choice" then
        bad = not is_choice(v, spec.choices)
      else
        bad = type(v) ~= "string"
      end
      if bad then
        local want = kind == "int" and "an integer" or kind == "number" and "a number" or kind == "bool" and
          "true or false" or kind == "choice" and ("one of " .. table.concat(spec.choices, ", ")) or "a string"
        error(fmt("%s: %s: expected %s to be %s, got %s", FNAME, where, key, want, tostring(opts[k])), 0)
      end
    end
    out[key] = v
  end
  return out
end

--- read_config(path) -> options table from a JSON object (.json) or a Lua
-- file returning a table (any other name); keys as the flags ('-' or '_').
function M.read_config(path)
  local f, err = io.open(path, "rb")
  if not f then error(fmt("%s: cannot open the config file '%s': %s", FNAME, path, tostring(err)), 0) end
  local text = f:read("a")
  f:close()
  local t
  if path:match("%.json$") then
    local ok, v = pcall(cjson.decode, text)
    if not ok then error(fmt("%s: config file '%s': %s", FNAME, path, tostring(v)), 0) end
    t = v
  else
    local chunk, lerr = load(text, "@" .. path, "t")
    if not chunk then error(fmt("%s: config file '%s': %s", FNAME, path, lerr), 0) end
    local ok, v = pcall(chunk)
    if not ok then error(fmt("%s: config file '%s': %s", FNAME, path, tostring(v)), 0) end
    t = v
  end
  if type(t) ~= "table" then
    error(fmt("%s: config file '%s': expected a table of options, got %s", FNAME, path, type(t)), 0)
  end
  return normalize(t, "config file '" .. path .. "'")
end

local function check_range(cfg, key, lo, what)
  local v = cfg[key]
  if v ~= nil and v < lo then error(fmt("%s: expected %s %s, got %s", FNAME, key, what, tostring(v)), 0) end
end

--- resolve(opts) -> the run's config: defaults, then (with resume) the
-- checkpoint's config, then the config file, then opts; every derived value
-- (device, precision, vocab, model numbers, schedule) filled in and checked.
-- Errors start "ember.trainer:" and say what was expected.
function M.resolve(opts)
  if type(opts) ~= "table" then error(fmt("%s: expected an options table, got %s", FNAME, type(opts)), 2) end
  local given = normalize(opts, "options")
  local file = given.config and M.read_config(given.config) or {}
  local resume = given.resume or file.resume
  local ck
  local cfg = {}
  for k, s in pairs(SPEC) do cfg[k] = s.default end
  if resume then
    ck = checkpoint.load(resume)
    if not ck.state or type(ck.state.config) ~= "table" then
      error(fmt("%s: '%s' holds no %s (a checkpoint written by ember.trainer): cannot resume from it", FNAME,
                ck.dir, checkpoint.STATE_FILE), 0)
    end
    local saved = normalize(ck.state.config, "the checkpoint's config")
    for k, v in pairs(saved) do cfg[k] = v end
    for _, k in ipairs(M.FIXED_ON_RESUME) do
      local v = given[k]
      if v == nil then v = file[k] end
      if v ~= nil and v ~= saved[k] then
        error(fmt("%s: a resumed run keeps its model: %s is %s in '%s', got %s", FNAME, k, tostring(saved[k]),
                  ck.dir, tostring(v)), 0)
      end
    end
  end
  for k, v in pairs(file) do cfg[k] = v end
  for k, v in pairs(given) do cfg[k] = v end
  cfg.resume = resume
  if resume and given.out == nil and file.out == nil then
    -- the run folder the checkpoint lives in (RUN/checkpoints/step_N)
    cfg.out = ck.dir:match("^(.*)/checkpoints/step_%d+$") or cfg.out
  end

  if not cfg.train then error(FNAME .. ": expected train = a .npy of token ids (--train FILE)", 0) end
  cfg.device = cfg.device or (ember.cuda.is_available() and "cuda" or "cpu")
  local on_cuda = cfg.device:match("^cuda") ~= nil
  if on_cuda and not ember.cuda.is_available() then
    error(fmt("%s: device %s: no CUDA device is available (use device = \"cpu\")", FNAME, cfg.device), 0)
  end
  if not on_cuda and cfg.device ~= "cpu" then
    error(fmt("%s: expected device cpu or cuda, got %s", FNAME, cfg.device), 0)
  end
  cfg.precision = cfg.precision or (on_cuda and "bf16" or "f32")
  if cfg.graph and not on_cuda then error(FNAME .. ": graph needs device cuda (CUDA graphs)", 0) end
  if cfg.overlap_optimizer and (cfg.ddp or cfg.zero) then
    error(FNAME .. ": overlap_optimizer cannot be combined with ddp or zero (the gradient is not reduced " ..
      "when its hook fires)", 0)
  end
  if cfg.graph and (cfg.ddp or cfg.zero) then
    error(FNAME .. ": graph cannot be combined with ddp or zero (their collectives are not captured)", 0)
  end

  local preset = ember.nn.configs[cfg.model]{}
  cfg.d_model = cfg.d_model or preset.d_model
  cfg.d_ff = cfg.d_ff or preset.d_ff
  cfg.layers = cfg.layers or preset.num_layers
  cfg.heads = cfg.heads or preset.num_heads
  local tok_path = (ck and given.tokenizer == nil and file.tokenizer == nil and ck.tokenizer) or cfg.tokenizer
  if tok_path then
    local ok, tok = pcall(ember.tokenizer.load, tok_path)
    if not ok then error(fmt("%s: tokenizer: %s", FNAME, tostring(tok)), 0) end
    cfg._tokenizer = tok
    cfg.vocab = cfg.vocab or tok:vocab_size()
    if cfg.vocab < tok:vocab_size() then
      error(fmt("%s: expected vocab >= the tokenizer's %d ids, got %d", FNAME, tok:vocab_size(), cfg.vocab), 0)
    end
  end
  if not cfg.vocab then error(FNAME .. ": expected vocab (--vocab N) or a tokenizer (--tokenizer tok.json)", 0) end

  cfg.decay_steps = cfg.decay_steps or cfg.steps
  cfg.warmup = cfg.warmup or math.min(100, cfg.decay_steps // 10)
  cfg.min_lr = cfg.min_lr or cfg.lr / 10
  for _, k in ipairs({"steps", "decay_steps", "batch", "context", "grad_accum", "log_every", "eval_batches",
                      "vocab", "d_model", "d_ff", "layers", "heads"}) do
    check_range(cfg, k, 1, ">= 1")
  end
  for _, k in ipairs({"warmup", "eval_every", "ckpt_every", "keep", "lr", "min_lr", "weight_decay", "clip",
                      "eps", "beta1", "beta2"}) do
    check_range(cfg, k, 0, ">= 0")
  end
  if cfg.warmup > cfg.decay_steps then
    error(fmt("%s: expected warmup <= decay_steps (%d), got %d", FNAME, cfg.decay_steps, cfg.warmup), 0)
  end
  if cfg.beta1 >= 1 or cfg.beta2 >= 1 then
    error(fmt("%s: expected beta1 and beta2 < 1, got %g and %g", FNAME, cfg.beta1, cfg.beta2), 0)
  end
  if cfg.d_model % cfg.heads ~= 0 then
    error(fmt("%s: expected d_model divisible by heads, got %d and %d", FNAME, cfg.d_model, cfg.heads), 0)
  end
  cfg._checkpoint, cfg._resolved = ck, true
  return cfg
end

--- The TransformerLM config of a resolved run config.
function M.model_config(cfg)
  return {vocab_size = cfg.vocab, context_length = cfg.context, d_model = cfg.d_model, d_ff = cfg.d_ff,
          num_layers = cfg.layers, num_heads = cfg.heads, rope_theta = cfg.rope_theta}
end

-- the config as saved (config.json, trainer.json): no internals, no paths of this invocation
local function saved_config(cfg)
  local out = {}
  for k, v in pairs(cfg) do
    if not k:match("^_") and not NOT_SAVED[k] then out[k] = v end
  end
  return out
end

-- ---------------------------------------------------------------------------
-- the run

local function is_interrupt(err) return tostring(err):find("interrupted!", 1, true) ~= nil end

-- 64-bit integers through JSON as strings (cjson would round them)
local function rng_out(s) return {seed = tostring(s.seed), offset = tostring(s.offset)} end
local function rng_in(s)
  return {seed = math.tointeger(tonumber(s.seed)), offset = math.tointeger(tonumber(s.offset))}
end

local function hms(s)
  s = math.max(0, math.floor(s + 0.5))
  if s >= 3600 then return fmt("%dh%02dm", s // 3600, s % 3600 // 60) end
  if s >= 60 then return fmt("%dm%02ds", s // 60, s % 60) end
  return fmt("%ds", s)
end

local function si(x)
  if x >= 1e9 then return fmt("%.2fG", x / 1e9) end
  if x >= 1e6 then return fmt("%.2fM", x / 1e6) end
  if x >= 1e3 then return fmt("%.1fk", x / 1e3) end
  return fmt("%.0f", x)
end

-- rewrite `path` keeping the records of steps <= step (a resumed run repeats the rest)
local function truncate_log(path, step)
  local f = io.open(path, "rb")
  if not f then return end
  local keep = {}
  for line in f:lines() do
    local ok, rec = pcall(cjson.decode, line)
    if ok and type(rec) == "table" and type(rec.step) == "number" and rec.step <= step then keep[#keep + 1] = line end
  end
  f:close()
  report.write_file(path, #keep > 0 and table.concat(keep, "\n") .. "\n" or "")
end

--- plot(run_dir): loss.svg from log.jsonl (train and validation loss by step).
function M.plot(run_dir)
  local recs = report.read_jsonl(run_dir .. "/log.jsonl")
  if not recs then return nil end
  local rows, ntrain = {}, 0
  for _, r in ipairs(recs) do if r.loss then ntrain = ntrain + 1 end end
  local every = math.max(1, ntrain // 2000)     -- at most ~2000 points per line
  local i = 0
  for _, r in ipairs(recs) do
    if r.loss then
      i = i + 1
      if (i - 1) % every == 0 or i == ntrain then rows[#rows + 1] = {step = r.step, loss = r.loss, split = "train"} end
    elseif r.val_loss then
      rows[#rows + 1] = {step = r.step, loss = r.val_loss, split = "val"}
    end
  end
  local svg = report.svg_lines{rows = rows, x = "step", y = "loss", series = "split", title = "loss",
    xlabel = "step", ylabel = "cross-entropy"}
  report.write_file(run_dir .. "/loss.svg", svg)
  return run_dir .. "/loss.svg"
end

--- run(opts) -> summary {step, loss, val_loss, tokens, out, checkpoint,
-- interrupted}: train as configured (see OPTIONS, resolve), printing
-- progress on rank 0. A Ctrl-C (the `ember` executable) ends the current
-- step, writes a checkpoint and returns with interrupted = true.
function M.run(opts)
  local cfg = (type(opts) == "table" and opts._resolved) and opts or M.resolve(opts)
  local nn, optim, F, dist = ember.nn, ember.optim, ember.nn.functional, ember.dist
  local ck = cfg._checkpoint
  local say = cfg.quiet and function() end or function(...) print(...) io.stdout:flush() end

  -- ranks
  local distributed = cfg.distributed
  if distributed == nil then
    -- a process group of one rank (initialised by someone else) trains as a single process
    distributed = (dist.is_initialized() and dist.world_size() > 1)
      or (tonumber(os.getenv("EMBER_WORLD_SIZE") or "1") or 1) > 1 or cfg.ddp ~= nil or cfg.zero
  end
  if distributed and not dist.is_initialized() then dist.init() end
  local rank, world = distributed and dist.rank() or 0, distributed and dist.world_size() or 1
  if distributed and not cfg.ddp then cfg.ddp = "bucketed" end
  if cfg.zero and not distributed then error(FNAME .. ": zero needs ranks (ember launch)", 0) end
  if rank ~= 0 then say = function() end end
  local device, on_cuda = cfg.device, cfg.device:match("^cuda") ~= nil
  local sync = on_cuda and function() ember.cuda.synchronize() end or function() end
  local out = cfg.out
  local log_path = out .. "/log.jsonl"

  -- the run folder
  if rank == 0 then
    if not cfg.resume and checkpoint.latest(out) then
      error(fmt("%s: '%s' already holds a run (checkpoints/latest); resume it (resume = \"%s\") or choose " ..
                "another out", FNAME, out, out), 0)
    end
    assert(os.execute("mkdir -p '" .. out:gsub("'", "'\\''") .. "'"), FNAME .. ": cannot create " .. out)
    report.write_file(out .. "/config.json", util.json_encode(saved_config(cfg)) .. "\n")
    if ck then truncate_log(log_path, ck.step or 0) else report.write_file(log_path, "") end
  end

  -- data
  local train_tokens = ember.data.open(cfg.train)
  local val_tokens = cfg.val and ember.data.open(cfg.val) or nil
  for _, d in ipairs({{"train", train_tokens}, {"val", val_tokens}}) do
    local t = d[2]
    if t and not (t.dtype == "u16" and cfg.vocab >= 65536) and t:numel() > 0 then
      local top = t:max():item()
      if top >= cfg.vocab then
        error(fmt("%s: %s tokens: expected ids < vocab %d, got %d ('%s')", FNAME, d[1], cfg.vocab, top,
                  cfg[d[1]]), 0)
      end
    end
  end
  local B, T, K = cfg.batch, cfg.context, cfg.grad_accum
  local loader = ember.data.Loader(train_tokens, {batch = B, context = T, device = device, order = cfg.order,
    seed = cfg.seed + 1, rank = rank, world_size = world, slots = K})
  local val_loader
  if val_tokens then
    val_loader = ember.data.Loader(val_tokens, {batch = B, context = T, device = device, order = "sequential",
      rank = rank, world_size = world})
  end

  -- model and optimizer
  ember.manual_seed(cfg.seed)
  local mcfg = M.model_config(cfg)
  local build = {device = device, attn_impl = cfg.attn}
  for k, v in pairs(mcfg) do build[k] = v end
  local model = nn.TransformerLM(build)
  local decay, no_decay = {}, {}
  for _, p in ipairs(model:parameters()) do
    if #p.shape >= 2 then decay[#decay + 1] = p else no_decay[#no_decay + 1] = p end
  end
  local groups = {{params = decay, weight_decay = cfg.weight_decay}, {params = no_decay, weight_decay = 0}}
  local oopts = {lr = cfg.lr, betas = {cfg.beta1, cfg.beta2}, eps = cfg.eps, weight_decay = cfg.weight_decay}
  local opt = cfg.zero and optim.ShardedOptimizer(groups, optim.AdamW, oopts) or optim.AdamW(groups, oopts)
  local lr_at = optim.cosine_schedule{max_lr = cfg.lr, min_lr = cfg.min_lr, warmup = cfg.warmup,
    total = cfg.decay_steps}

  local step, tokens_seen, elapsed0, last_ckpt, last_eval = 0, 0, 0, nil, nil
  if ck then
    local st = ck.state
    model:load_state_dict(ck.model_state)
    if not ck.optimizer then error(fmt("%s: '%s' holds no %s", FNAME, ck.dir, checkpoint.OPTIMIZER_FILE), 0) end
    opt:load_state_dict(ck.optimizer)
    loader:load_state_dict({order = st.data.order, seed = st.data.seed, offset = st.data.offset,
      position = st.data.position, epoch = st.data.epoch})
    ember.set_rng_state(rng_in(st.rng))
    step, tokens_seen, elapsed0 = st.step, st.tokens or 0, st.elapsed_s or 0
    last_ckpt = step
    ck.model_state, ck.optimizer = nil, nil       -- the host copies are not needed any more
  end
  local ddp = distributed and nn.parallel.DDP(model, {strategy = cfg.ddp, bucket_mb = cfg.bucket_mb}) or nil
  local fwd = ddp or model
  local params = model:parameters()

  local bf16 = cfg.precision == "bf16"
  local function forward_loss(m, x, y)
    local function f() return F.cross_entropy(m(x), y) end
    if bf16 then return ember.autocast("bf16", f) end
    return f()
  end

  local n_params = nn.count_parameters(mcfg)
  local n_matmul = n_params - cfg.vocab * cfg.d_model
  local flops_per_token = 6 * n_matmul + 12 * cfg.layers * cfg.d_model * T
  local tokens_per_step = B * T * K * world

  -- one step: K micro-batches from the loader's slots (filled before), backward, sync, clip, update
  local batches = {}
  local function compute()
    opt:zero_grad()
    if ddp then ddp:on_train_batch_start() end
    local total
    for k = 1, K do
      local x, y = batches[k][1], batches[k][2]
      local function micro()
        local loss = forward_loss(fwd, x, y)
        local scaled = K > 1 and loss / K or loss
        if cfg.overlap_optimizer and k == K then
          -- free_grads: each gradient dropped once its update ran (nothing here reads one after step(),
          -- and compute() zeroes them first anyway): 4 bytes a parameter off the backward's peak
          opt:step_in_backward{max_norm = cfg.clip > 0 and cfg.clip or nil,
            clip = cfg.clip > 0 and cfg.clip_mode or nil, free_grads = true}
        end
        scaled:backward()
        return loss:detach()
      end
      local l
      if ddp and k < K then l = ddp:no_sync(micro) else l = micro() end
      total = total and total + l or l
    end
    if ddp then ddp:finish_gradient_synchronization() end
    local norm
    if cfg.overlap_optimizer then
      opt:step()                      -- the rest of the update, and the join
      norm = cfg.clip > 0 and opt:grad_norm() or nil
    else
      norm = cfg.clip > 0 and nn.utils.clip_grad_norm(params, cfg.clip) or nil
      opt:step()
    end
    if K > 1 then total = total / K end
    return total, norm
  end

  -- per-step values wait on the device until the next flush
  local L = cfg.log_every
  local hist_loss = ember.zeros({L}, {dtype = "f32", device = device})
  local hist_norm = ember.zeros({L}, {dtype = "f32", device = device})
  local pending = {}                -- {step =, lr =, norm = number or nil}
  local log_file = rank == 0 and assert(io.open(log_path, "ab")) or nil
  local t_start = ember.core.clock()
  local t_flush, steps_since = t_start, 0
  local last_loss = ck and ck.state.loss or nil

  local function flush()
    local n = #pending
    if n == 0 then return end
    local losses = hist_loss:narrow(0, 0, n)
    if distributed then dist.all_reduce(losses, {op = "avg"}) end
    local lv = losses:tolist()
    local nv = hist_norm:narrow(0, 0, n):tolist()
    local now = ember.core.clock()
    local dt = now - t_flush
    local tps = tokens_per_step * steps_since / math.max(dt, 1e-9)
    for i, p in ipairs(pending) do
      local rec = {step = p.step, loss = lv[i], lr = p.lr, tokens = p.tokens, time = p.time}
      if cfg.clip > 0 then rec.grad_norm = p.norm or nv[i] end
      if log_file then log_file:write(util.json_encode(rec, {"step", "loss", "lr"}), "\n") end
    end
    if log_file then log_file:flush() end
    local last = pending[n]
    last_loss = lv[n]
    local mfu = cfg.peak_tflops and tps * flops_per_token / (cfg.peak_tflops * 1e12 * world)
    local remaining = (cfg.steps - last.step) * dt / math.max(steps_since, 1)
    say(fmt("step %" .. #tostring(cfg.steps) .. "d/%d  loss %.4f  lr %.3e%s  %s tok/s%s  ETA %s", last.step, cfg.steps,
      lv[n], last.lr, cfg.clip > 0 and fmt("  norm %.3f", last.norm or nv[n]) or "", si(tps),
      mfu and fmt("  MFU %.1f%%", 100 * mfu) or "", hms(remaining)))
    pending, t_flush, steps_since = {}, now, 0
  end

  local last_val   -- the latest validation loss (the summary reports it when taken at the last step)
  local function evaluate()
    if not val_loader then return nil end
    local nb = math.min(cfg.eval_batches, val_loader.n_windows // (B * world))
    val_loader:load_state_dict({order = "sequential", seed = 0, offset = 0, position = 0, epoch = 0})
    model:eval()
    local acc = ember.zeros({1}, {dtype = "f64", device = device})
    ember.no_grad(function()
      for _ = 1, nb do
        local x, y = val_loader:next()
        acc:add_(forward_loss(model, x, y):to("f64"):view(1))
      end
    end)
    model:train()
    if distributed then dist.all_reduce(acc, {op = "avg"}) end
    local v = acc:item() / nb
    last_eval, last_val = step, v
    if log_file then
      log_file:write(util.json_encode({step = step, val_loss = v, val_tokens = nb * B * T * world},
        {"step", "val_loss"}), "\n")
      log_file:flush()
    end
    say(fmt("eval  step %d  val loss %.4f  (ppl %.2f, %d batches)", step, v, math.exp(v), nb))
    return v
  end

  local function trainer_state()
    local d = loader:state_dict()
    return {format = "ember.trainer", version = 1, step = step, tokens = tokens_seen,
      elapsed_s = elapsed0 + ember.core.clock() - t_start, world_size = world, loss = last_loss,
      config = saved_config(cfg), rng = rng_out(ember.get_rng_state()),
      data = {order = d.order, seed = tostring(d.seed), offset = tostring(d.offset), position = d.position,
              epoch = d.epoch},
      schedule = {max_lr = cfg.lr, min_lr = cfg.min_lr, warmup = cfg.warmup, total = cfg.decay_steps}}
  end

  local ckpt_path = ck and ck.dir or nil
  local function save()
    if last_ckpt == step then return ckpt_path end
    local osd = (cfg.zero or rank == 0) and opt:state_dict() or nil   -- ZeRO's is a collective
    if rank == 0 then
      ckpt_path = checkpoint.save_run(out, step, {model = model, config = mcfg, step = step, optimizer = osd,
        tokenizer = cfg._tokenizer, state = trainer_state()}, {keep = cfg.keep})
      M.plot(out)
      say(fmt("checkpoint step %d: %s", step, ckpt_path))
    end
    if distributed then dist.barrier() end
    -- the other ranks name the folder rank 0 wrote (their summary's checkpoint, as rank 0's)
    if rank ~= 0 then ckpt_path = checkpoint.run_step_dir(out, step) end
    last_ckpt = step
    return ckpt_path
  end

  say(fmt("train: %s model, %.2fM parameters (d_model %d, d_ff %d, %d layers, %d heads, vocab %d), context %d",
    cfg.model, n_params / 1e6, cfg.d_model, cfg.d_ff, cfg.layers, cfg.heads, cfg.vocab, T))
  say(fmt("train: %d tokens (%s), batch %d x %d micro-batch(es) x %d rank(s) = %d tokens/step; %s, %s%s%s%s",
    train_tokens:numel(), cfg.train, B, K, world, tokens_per_step, device, cfg.precision,
    cfg.graph and ", CUDA graph" or "", ddp and (", DDP " .. cfg.ddp) or "", cfg.zero and ", ZeRO-1" or ""))
  if ck then say(fmt("train: resumed from %s at step %d", ck.dir, step)) end
  say(fmt("train: run folder %s (log.jsonl, loss.svg, checkpoints/)", out))

  local graph, g_loss, g_norm
  local interrupted = false
  local function loop()
    while step < cfg.steps do
      for k = 1, K do
        local x, y = loader:next()
        batches[k] = {x, y}
      end
      local lr = lr_at(step + 1)            -- step s (1-based): s/warmup of the peak during warm-up
      opt:set_lr(lr)
      local loss, norm
      if graph then
        graph:replay()
        loss, norm = g_loss, g_norm
      else
        loss, norm = compute()
        if cfg.graph then
          -- the first step ran eagerly (optimizer state exists); later steps replay this capture
          sync()
          graph, g_loss, g_norm = ember.cuda.graph(compute, {warmup = 0})
        end
      end
      step = step + 1
      tokens_seen = tokens_seen + tokens_per_step
      steps_since = steps_since + 1
      local i = #pending
      hist_loss:narrow(0, i, 1):copy_(loss:view(1))
      local nnum
      if util.is_tensor(norm) then hist_norm:narrow(0, i, 1):copy_(norm:view(1)) else nnum = norm end
      pending[i + 1] = {step = step, lr = lr, norm = nnum, tokens = tokens_seen,
        time = elapsed0 + ember.core.clock() - t_start}
      local stop = false
      if not distributed then stop = util.take_interrupt() end
      if #pending == L or step == cfg.steps or stop then
        if distributed then
          local flag = ember.tensor({util.take_interrupt() and 1 or 0}, {dtype = "i32", device = device})
          dist.all_reduce(flag, {op = "max"})
          stop = flag:item() > 0
        end
        flush()
      end
      if stop then
        interrupted = true
        return
      end
      if val_loader and cfg.eval_every > 0 and step % cfg.eval_every == 0 then evaluate() end
      if cfg.ckpt_every > 0 and step % cfg.ckpt_every == 0 and step < cfg.steps then save() end
    end
  end

  local start_step = step
  if step >= cfg.steps then say(fmt("train: already at step %d of %d: nothing to do", step, cfg.steps)) end
  local prev_defer = debug.getregistry()["ember.defer_interrupt"]
  util.defer_interrupts(true)
  local ok, err = xpcall(loop, debug.traceback)
  local val_loss
  local ok2, err2 = true, nil
  if ok then
    ok2, err2 = xpcall(function()
      flush()
      if interrupted then
        say(fmt("interrupted at step %d (Ctrl-C): writing a checkpoint (a second Ctrl-C stops at once)", step))
      elseif val_loader and last_eval ~= step and step > start_step then
        val_loss = evaluate()
      elseif last_eval == step and step > start_step then
        val_loss = last_val
      end
      if step > 0 then save() end
      if rank == 0 then M.plot(out) end
    end, debug.traceback)
  end
  util.take_interrupt()
  util.defer_interrupts(prev_defer)
  if log_file then log_file:close() end
  if graph then graph:close() end
  if not ok then
    if is_interrupt(err) then
      -- only without the `ember` executable's deferral (a stock lua5.4): the step was cut anywhere
      say(fmt("interrupted inside step %d: no checkpoint written (the last one: %s)", step + 1,
        tostring(ckpt_path)))
      return {step = step, out = out, checkpoint = ckpt_path, interrupted = true, tokens = tokens_seen}
    end
    error(err, 0)
  end
  if not ok2 then error(err2, 0) end
  if not interrupted then
    say(fmt("train: done, step %d, loss %s%s", step, last_loss and fmt("%.4f", last_loss) or "-",
      val_loss and fmt(", val loss %.4f", val_loss) or ""))
  end
  return {step = step, loss = last_loss, val_loss = val_loss, tokens = tokens_seen, out = out,
    checkpoint = ckpt_path, interrupted = interrupted}
end

return M
