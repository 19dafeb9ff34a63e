--- ember.generate: text generation with a TransformerLM and a tokenizer.
--
--     local text, info = ember.generate(model, tok, "Once upon a time",
--       {max_tokens = 100, temperature = 0.8, top_p = 0.95, seed = 0})
--
-- The prompt runs once through the model (prefill, filling an nn.KVCache),
-- then each new token is one decode step of one token. On CUDA the decode
-- step is captured once as a CUDA graph and replayed for every token: the
-- step reads its position from the cache's device tensor kv.pos and its
-- input id from a device buffer, so nothing of the step depends on a host
-- value (docs/generation.md). Sampling runs eagerly after each step, on the
-- model's device: temperature, then top-k, then top-p (nucleus), then one
-- draw (ember.multinomial) from a generator of the call's own (`seed`),
-- swapped into Ember's global generator around each draw and out again, so
-- the caller's random stream is left as it was.
--
-- Also here: generate.sample / generate.filter_logits (the sampling on a
-- logits tensor) and generate.load (a checkpoint folder written by
-- scripts/train.lua: model.safetensors + tokenizer.json).
-- @module ember.generate

local ember = require "ember"
local F = require "ember.functional"
local util = require "ember.util"
local KVCache = require("ember.nn.kv_cache").KVCache

local fmt = string.format
local NEG_INF = -math.huge
local M = {}

-- An error message without its "file:line: " prefix (to wrap it in ours).
local function strip_where(msg) return (tostring(msg):gsub("^[^%s]+:%d+: ", "", 1)) end

-- ---------------------------------------------------------------------------
-- sampling

-- The sampling options with their defaults filled in, checked; fname names the caller.
local function sampling_opts(fname, opts, level)
  local t = opts.temperature == nil and 1.0 or opts.temperature
  if type(t) ~= "number" or t ~= t or t < 0 or t == math.huge then
    error(fmt("%s: expected temperature to be a finite number >= 0 (0: greedy), got %s", fname, tostring(t)), level)
  end
  local k = opts.top_k or 0
  if math.type(k) ~= "integer" or k < 0 then
    error(fmt("%s: expected top_k to be an integer >= 0 (0: off), got %s", fname, tostring(k)), level)
  end
  local p = opts.top_p == nil and 1.0 or opts.top_p
  if type(p) ~= "number" or not (p > 0 and p <= 1) then
    error(fmt("%s: expected top_p in (0, 1] (1: off), got %s", fname, tostring(p)), level)
  end
  return t, k, p
end

local function check_logits(fname, logits, level)
  if not util.is_tensor(logits) or #logits.shape < 1 or not util.FLOAT_DTYPES[logits.dtype] then
    error(fmt("%s: expected logits (..., V) as a floating-point tensor, got %s", fname,
      util.is_tensor(logits) and (logits.dtype .. " of shape " .. util.shape_str(logits.shape)) or type(logits)), level)
  end
end

-- f32 logits / temperature, then top-k, then top-p: removed entries are -inf.
local function filter(logits, temperature, top_k, top_p)
  local x = logits:to("f32") / temperature
  local V = x.shape[#x.shape]
  if top_k > 0 and top_k < V then
    local kth = x:topk(top_k, -1):narrow(-1, top_k - 1, 1)   -- ties with the k-th stay in
    x = x:masked_fill(x:lt(kth), NEG_INF)
  end
  if top_p < 1 then
    -- keep the most likely tokens until their mass reaches top_p: a token is
    -- dropped when the tokens ranked before it already hold >= top_p
    local sorted, order = x:sort(-1, {descending = true})
    local p = F.softmax(sorted, -1)
    local drop = (p:cumsum(-1) - p):ge(top_p)
    local drop_v = ember.zeros(x.shape, {dtype = "bool", device = x.device}):scatter(-1, order, drop)
    x = x:masked_fill(drop_v, NEG_INF)
  end
  return x
end

--- The logits sampling draws from: f32 logits divided by the temperature,
-- then top-k (entries below the k-th largest of their row set to -inf; ties
-- with the k-th are kept), then top-p (the smallest set of most likely
-- tokens whose probability reaches top_p is kept, the rest -inf).
-- @param logits float tensor (..., V)
-- @tparam table opts temperature (> 0, default 1), top_k (0: off), top_p (1: off)
-- @return f32 tensor (..., V)
function M.filter_logits(logits, opts)
  local fname = "ember.generate.filter_logits"
  check_logits(fname, logits, 3)
  local t, k, p = sampling_opts(fname, util.check_opts(fname, opts, 3), 3)
  if t == 0 then error(fname .. ": expected temperature > 0 (greedy decoding filters nothing), got 0", 2) end
  return filter(logits, t, k, p)
end

--- Next-token ids from logits (B, V): argmax when temperature is 0, else
-- one draw from softmax(filter_logits(logits)) per row (ember.multinomial,
-- Ember's global generator: seed it, or use ember.generate's `seed`).
-- @return i64 tensor (B, 1) on logits' device
function M.sample(logits, opts)
  local fname = "ember.generate.sample"
  check_logits(fname, logits, 3)
  if #logits.shape ~= 2 then
    error(fmt("%s: expected logits (B, V), got shape %s", fname, util.shape_str(logits.shape)), 2)
  end
  local t, k, p = sampling_opts(fname, util.check_opts(fname, opts, 3), 3)
  if t == 0 then return logits:argmax(-1, {keepdim = true}) end
  return ember.multinomial(F.softmax(filter(logits, t, k, p), -1), 1)
end

-- sample() drawing from `rng` ({seed, offset}, updated) instead of the caller's stream.
local function sample_with(rng, logits, t, k, p)
  if t == 0 then return logits:argmax(-1, {keepdim = true}) end
  local saved = ember.get_rng_state()
  ember.set_rng_state(rng)
  local ok, ids = pcall(function() return ember.multinomial(F.softmax(filter(logits, t, k, p), -1), 1) end)
  local after = ember.get_rng_state()
  ember.set_rng_state(saved)
  if not ok then error(ids, 0) end
  rng.seed, rng.offset = after.seed, after.offset
  return ids
end

-- ---------------------------------------------------------------------------
-- the decoder: prefill, then one token per step (eager, or a replayed graph)

--- A model and its KV cache driven one token at a time; ember.generate's
-- loop, for scripts that write their own.
--     local dec = generate.Decoder(model, kv, {graph = true, autocast = "bf16"})
--     local logits = dec:prefill(ids)    -- (B, T) -> (B, T, V)
--     dec:capture()                      -- on CUDA: the decode step as a graph
--     logits = dec:step(next_ids)        -- (B, 1) ids on the device -> (B, 1, V)
-- With a graph, step's logits are the graph's static output: read them
-- before the next step.
-- @type Decoder
local Decoder = {}
Decoder.__index = Decoder

local function new_decoder(model, kv, opts)
  return setmetatable({model = model, kv = kv, autocast = opts.autocast, use_graph = opts.graph}, Decoder)
end

--- The first token is out: info.prefill_s = the seconds since t0; when more
-- tokens follow, the decoder dec (nil: uncached) captures its step as a CUDA
-- graph where it can (info.graph, info.capture_s). Returns the clock at which
-- decoding starts. (generate and scripts/bench_generate.lua's batches.)
function M.end_prefill(info, dec, more, t0)
  local clock = ember.core.clock
  info.prefill_s = clock() - t0
  if dec and more then
    local t1 = clock()
    info.graph = dec:capture()
    info.capture_s = info.graph and clock() - t1 or nil
  end
  return clock()
end

--- Decoder(model, kv, opts): opts `graph` (capture() captures; needs CUDA),
-- `autocast` ("bf16", "f16" or nil: the forward passes run in that region).
function M.Decoder(model, kv, opts)
  local fname = "ember.generate.Decoder"
  if type(model) ~= "table" or type(model.layers) ~= "table" or not model.lm_head then
    error(fmt("%s: expected a TransformerLM as argument 1, got %s", fname, type(model)), 2)
  end
  if getmetatable(kv) ~= KVCache then
    error(fmt("%s: expected an nn.KVCache as argument 2, got %s", fname, type(kv)), 2)
  end
  opts = util.check_opts(fname, opts, 3)
  for k in pairs(opts) do
    if k ~= "graph" and k ~= "autocast" then
      error(fmt("%s: unknown option '%s' (expected graph, autocast)", fname, tostring(k)), 2)
    end
  end
  if opts.graph and tostring(kv.device) == "cpu" then
    error(fname .. ": graph = true needs a model and cache on a CUDA device", 2)
  end
  local ac = opts.autocast and util.DTYPES[opts.autocast]
  if opts.autocast and ac ~= "bf16" and ac ~= "f16" then
    error(fmt('%s: expected autocast "bf16", "f16" or nil, got %s', fname, tostring(opts.autocast)), 2)
  end
  return new_decoder(model, kv, {graph = opts.graph or false, autocast = ac})
end

--- The logits (B, T, V) of ids (B, T) appended to the cache (eagerly).
function Decoder:forward(ids)
  local model, kv = self.model, self.kv
  local function f() return model:forward(ids, {cache = kv}) end
  if self.autocast then return ember.autocast(self.autocast, f) end
  return f()
end

--- Capture the decode step as a CUDA graph (when use_graph): a warm-up step
-- and the capture, after which the cache is rewound, so what they wrote at
-- position kv.len is written again by the first replay. Returns whether a
-- graph is in use.
function Decoder:capture()
  local kv = self.kv
  -- the warm-up and the capture each move kv.len on the host (the capture
  -- does not run on the device): both need a free position
  if not self.use_graph or kv.len + 2 > kv.max_len then
    self.use_graph = false
    return false
  end
  self.ids = ember.zeros({kv.batch, 1}, {dtype = "i64", device = kv.device})   -- the static input
  local len = kv.len
  local g, logits = ember.cuda.graph(function() return self:forward(self.ids) end, {warmup = 1})
  kv:seek(len)
  self.graph, self.logits = g, logits
  return true
end

Decoder.prefill = Decoder.forward

--- logits (B, 1, V) of the next position after feeding `ids` (B, 1) on the
-- device: a replay of the captured graph, or an eager forward.
function Decoder:step(ids)
  local kv = self.kv
  if not self.graph then return self:forward(ids) end
  self.ids:copy_(ids)
  self.graph:replay()                               -- also moves kv.pos on the device
  kv.len = kv.len + 1
  return self.logits
end

function Decoder:close()
  if self.graph then self.graph:close() end
  self.graph, self.logits, self.ids = nil, nil, nil
end

-- ---------------------------------------------------------------------------
-- ember.generate

local OPTS = {"max_tokens", "temperature", "top_k", "top_p", "seed", "stop", "eos", "stream",
  "graph", "cache", "autocast"}
local OPTS_SET = {}
for _, k in ipairs(OPTS) do OPTS_SET[k] = true end

local function check_model(fname, model)
  if type(model) ~= "table" or type(model.layers) ~= "table" or type(model.config) ~= "table"
      or not model.lm_head then
    error(fmt("%s: expected a TransformerLM as argument 1, got %s", fname, type(model)), 4)
  end
end

-- The prompt as a list of 0-based ids (a string through tok:encode, or ids as given).
local function prompt_ids(fname, tok, prompt, start, vocab)
  local ids
  if type(prompt) == "string" then
    if tok == nil then error(fname .. ": a text prompt needs a tokenizer (argument 2), got nil", 4) end
    ids = tok:encode(prompt)
  elseif type(prompt) == "table" then
    ids = {}
    for i, id in ipairs(prompt) do
      if math.type(id) ~= "integer" then
        error(fmt("%s: expected the prompt's ids to be integers, got %s at position %d", fname, tostring(id), i), 4)
      end
      ids[i] = id
    end
  else
    error(fmt("%s: expected the prompt as a string or a list of token ids, got %s", fname, type(prompt)), 4)
  end
  if #ids == 0 then
    if not start then
      error(fname .. ": expected a non-empty prompt (there is no end-of-text token to start from)", 4)
    end
    ids = {start}
  end
  for i, id in ipairs(ids) do
    if id < 0 or id >= vocab then
      error(fmt("%s: expected prompt ids in [0, %d) (the model's vocab_size), got %d at position %d", fname,
        vocab, id, i), 4)
    end
  end
  return ids
end

local function check_generate_opts(fname, model, tok, opts)
  opts = util.check_opts(fname, opts, 5)
  for k in pairs(opts) do
    if not OPTS_SET[k] then
      error(fmt("%s: unknown option '%s' (expected %s)", fname, tostring(k), table.concat(OPTS, ", ")), 4)
    end
  end
  local o = {}
  o.temperature, o.top_k, o.top_p = sampling_opts(fname, opts, 5)
  o.max_tokens = opts.max_tokens or 100
  if math.type(o.max_tokens) ~= "integer" or o.max_tokens < 0 then
    error(fmt("%s: expected max_tokens to be an integer >= 0, got %s", fname, tostring(opts.max_tokens)), 4)
  end
  o.seed = opts.seed or 0
  if math.type(o.seed) ~= "integer" then
    error(fmt("%s: expected seed to be an integer, got %s", fname, tostring(opts.seed)), 4)
  end
  local stop = opts.stop
  if type(stop) == "string" then stop = {stop} end
  if stop ~= nil and type(stop) ~= "table" then
    error(fmt("%s: expected stop to be a string or a list of strings, got %s", fname, type(stop)), 4)
  end
  o.stop = {}
  for i, s in ipairs(stop or {}) do
    if type(s) ~= "string" or s == "" then
      error(fmt("%s: expected stop strings to be non-empty strings, got %s at position %d", fname,
        type(s) == "string" and '""' or type(s), i), 4)
    end
    o.stop[i] = s
  end
  if #o.stop > 0 and tok == nil then error(fname .. ": stop strings need a tokenizer (argument 2)", 4) end
  -- eos: an id, false (none), or the tokenizer's <|endoftext|> when it has one;
  -- an empty prompt starts from that token (or the eos id given)
  local eot = tok ~= nil and type(tok.id_of) == "function" and tok:id_of("<|endoftext|>") or nil
  o.start = math.type(opts.eos) == "integer" and opts.eos or eot
  if opts.eos == nil then
    o.eos = eot
  elseif opts.eos == false then
    o.eos = nil
  elseif math.type(opts.eos) == "integer" and opts.eos >= 0 then
    o.eos = opts.eos
  else
    error(fmt("%s: expected eos to be a token id or false, got %s", fname, tostring(opts.eos)), 4)
  end
  if opts.stream ~= nil and not util.is_callable(opts.stream) then
    error(fmt("%s: expected stream to be a function(text, id), got %s", fname, type(opts.stream)), 4)
  end
  o.stream = opts.stream
  local on_cuda = tostring(model.lm_head.weight.device) ~= "cpu"
  if opts.graph ~= nil and type(opts.graph) ~= "boolean" then
    error(fmt("%s: expected graph to be a boolean, got %s", fname, type(opts.graph)), 4)
  end
  if opts.graph and not on_cuda then
    error(fname .. ": graph = true needs a model on a CUDA device (this one is on the CPU)", 4)
  end
  if opts.cache ~= nil and type(opts.cache) ~= "boolean" then
    error(fmt("%s: expected cache to be a boolean, got %s", fname, type(opts.cache)), 4)
  end
  o.cache = opts.cache ~= false
  o.graph = o.cache and on_cuda and opts.graph ~= false
  if opts.autocast ~= nil and opts.autocast ~= false then
    local dt = util.DTYPES[opts.autocast]
    if dt ~= "bf16" and dt ~= "f16" then
      error(fmt('%s: expected autocast "bf16", "f16" or false, got %s', fname, tostring(opts.autocast)), 4)
    end
    o.autocast = dt
  end
  return o
end

-- Text output: pieces decoded per token, stop strings found across pieces,
-- and a stream that never shows text a stop string later cuts.
local Output = {}
Output.__index = Output

local function new_output(tok, o)
  local hold = 0
  for _, s in ipairs(o.stop) do hold = math.max(hold, #s - 1) end
  return setmetatable({tok = tok, stop = o.stop, stream = o.stream, hold = hold, text = tok and "" or nil,
    streamed = 0}, Output)
end

-- Append id's text; true when a stop string ends the text. The stream
-- hears of every token (with the text it makes visible) until then.
function Output:add(id)
  if not self.tok then
    if self.stream then self.stream(nil, id) end
    return false
  end
  local piece = self.tok:decode({id})
  local from = math.max(1, #self.text - self.hold + 1)
  self.text = self.text .. piece
  for _, s in ipairs(self.stop) do
    local at = self.text:find(s, from, true)
    if at then
      self.text = self.text:sub(1, at - 1)
      return true
    end
  end
  self:flush(#self.text - self.hold, id)
  return false
end

-- Stream the text up to byte `upto` that is not streamed yet (id: the token
-- that made it visible; nil for the held-back rest at the end).
function Output:flush(upto, id)
  if not self.stream then return end
  upto = math.max(upto, self.streamed)
  if id == nil and upto == self.streamed then return end
  self.stream(self.text:sub(self.streamed + 1, upto), id)
  self.streamed = upto
end

local function run(model, tok, prompt, opts)
  local fname = "ember.generate"
  check_model(fname, model)
  if tok ~= nil and (type(tok) ~= "table" and type(tok) ~= "userdata") then
    error(fmt("%s: expected a tokenizer (or nil with a prompt of ids) as argument 2, got %s", fname, type(tok)), 3)
  end
  local o = check_generate_opts(fname, model, tok, opts)
  local vocab, ctx = model.vocab_size, model.context_length
  local ids = prompt_ids(fname, tok, prompt, o.start, vocab)
  if #ids >= ctx then
    error(fmt("%s: the prompt has %d tokens, the model's context_length is %d (at most %d leaves room to generate)",
      fname, #ids, ctx, ctx - 1), 3)
  end
  -- ids the tokenizer cannot decode are never sampled
  local n_sample = vocab
  if tok ~= nil and type(tok.vocab_size) == "function" then n_sample = math.min(vocab, tok:vocab_size()) end
  local device = model.lm_head.weight.device
  local rng = {seed = o.seed, offset = 0}
  local out = new_output(tok, o)
  local info = {prompt_ids = ids, ids = {}, prompt_tokens = #ids, graph = false, cache = o.cache}

  local kv, dec
  if o.cache then
    local max_len = math.min(ctx, #ids + o.max_tokens)
    kv = ember.nn.KVCache(model, {batch = 1, max_len = max_len, dtype = o.autocast or model.lm_head.weight.dtype})
    dec = new_decoder(model, kv, o)
  end
  local all = table.move(ids, 1, #ids, 1, {})        -- prompt + generated (the uncached path feeds it all)
  local function forward_all()
    local x = ember.tensor({all}, {dtype = "i64", device = device})
    local function f() return model(x) end
    return ember.no_grad(function()
      if o.autocast then return ember.autocast(o.autocast, f) end
      return f()
    end)
  end
  local function next_id(logits)                     -- logits (1, T, V) -> (1, 1) ids on the device
    local last = logits:select(1, logits.shape[2] - 1)
    if n_sample < vocab then last = last:narrow(-1, 0, n_sample) end
    return sample_with(rng, last, o.temperature, o.top_k, o.top_p)
  end

  local clock = ember.core.clock
  local t0 = clock()
  local finish = "length"
  local ok, err = pcall(function()
    if o.max_tokens == 0 then return end
    local logits = o.cache and dec:forward(ember.tensor({ids}, {dtype = "i64", device = device})) or forward_all()
    local t_decode
    while true do
      local id_t = next_id(logits)
      local id = id_t:item()
      if not t_decode then t_decode = M.end_prefill(info, dec, o.max_tokens > 1, t0) end   -- the first token
      info.ids[#info.ids + 1] = id
      all[#all + 1] = id
      if o.eos and id == o.eos then finish = "eos" break end
      if out:add(id) then finish = "stop" break end
      if #info.ids >= o.max_tokens then finish = "length" break end
      if #all >= ctx then finish = "context" break end
      logits = o.cache and dec:step(id_t) or forward_all()
    end
    info.decode_s = clock() - t_decode
  end)
  if dec then dec:close() end
  if not ok then error(err, 0) end
  if out.text then out:flush(#out.text) end
  info.finish_reason = finish
  info.generated_tokens = #info.ids
  info.prefill_s = info.prefill_s or 0
  info.decode_s = info.decode_s or 0
  info.prefill_tokens_per_s = info.prefill_s > 0 and #ids / info.prefill_s or nil
  local n_decode = #info.ids - 1
  info.decode_tokens_per_s = n_decode > 0 and info.decode_s > 0 and n_decode / info.decode_s or nil
  return out.text, info
end

-- ---------------------------------------------------------------------------
-- checkpoints (the layout scripts/train.lua writes)

local CONFIG_KEYS = {"vocab_size", "context_length", "d_model", "d_ff", "num_layers", "num_heads",
  "rope_theta", "eps"}

--- Load a checkpoint folder: DIR/model.safetensors (the model's state_dict,
-- with safetensors metadata `config` = the TransformerLM config as JSON and
-- `step`) and DIR/tokenizer.json (tok:save).
-- @tparam string dir
-- @tparam[opt] table opts `device` ("cpu"), `dtype` (weights' dtype, "f32"),
--   `tokenizer` (another tokenizer.json, or false for none), `attn_impl`
-- @return model (in eval mode), tokenizer (or nil), metadata {config =, step =, ...}
function M.load(dir, opts)
  local fname = "ember.generate.load"
  if type(dir) ~= "string" then error(fmt("%s: expected a checkpoint folder (string), got %s", fname, type(dir)), 2) end
  opts = util.check_opts(fname, opts, 3)
  for k in pairs(opts) do
    if k ~= "device" and k ~= "dtype" and k ~= "tokenizer" and k ~= "attn_impl" then
      error(fmt("%s: unknown option '%s' (expected device, dtype, tokenizer, attn_impl)", fname, tostring(k)), 2)
    end
  end
  -- a checkpoint folder, or a train.lua run folder (its latest checkpoint)
  local okr, resolved = pcall(require("ember.checkpoint").resolve, dir, fname)
  if not okr then error(strip_where(resolved), 2) end
  dir = resolved
  local path = dir .. "/model.safetensors"
  local ok, sd, meta = pcall(ember.load, path)
  if not ok then error(fmt("%s: cannot read the checkpoint: %s", fname, tostring(sd)), 2) end
  if type(meta) ~= "table" or type(meta.config) ~= "string" then
    error(fmt("%s: %s has no 'config' metadata (the TransformerLM config as JSON)", fname, path), 2)
  end
  local cjson = require "cjson"
  local okj, cfg_json = pcall(cjson.decode, meta.config)
  if not okj or type(cfg_json) ~= "table" then
    error(fmt("%s: %s: the 'config' metadata is not a JSON object: %s", fname, path, tostring(cfg_json)), 2)
  end
  local cfg = {}
  for _, k in ipairs(CONFIG_KEYS) do
    local v = cfg_json[k]
    if type(v) == "number" and math.tointeger(v) and k ~= "eps" then v = math.tointeger(v) end
    cfg[k] = v
  end
  cfg.device, cfg.attn_impl = opts.device, opts.attn_impl
  local okm, model = pcall(ember.nn.TransformerLM, cfg)
  if not okm then error(fmt("%s: %s: bad config: %s", fname, path, strip_where(model)), 2) end
  local okl, lerr = pcall(model.load_state_dict, model, sd)
  if not okl then error(fmt("%s: %s: %s", fname, path, strip_where(lerr)), 2) end
  if opts.dtype then model:to(opts.dtype) end
  model:eval()
  local tok
  local tok_path = opts.tokenizer == nil and (dir .. "/tokenizer.json") or opts.tokenizer
  if tok_path then
    local okt, t = pcall(ember.tokenizer.load, tok_path)
    if not okt then error(fmt("%s: cannot read the tokenizer: %s", fname, tostring(t)), 2) end
    tok = t
  end
  local info = {config = cfg_json, step = tonumber(meta.step)}
  for k, v in pairs(meta) do if info[k] == nil then info[k] = v end end
  return model, tok, info
end

setmetatable(M, {__call = function(_, model, tok, prompt, opts)
  local text, info = run(model, tok, prompt, opts)   -- not a tail call: error levels count this frame
  return text, info
end})

return M
