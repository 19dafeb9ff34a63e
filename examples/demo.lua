--- The README's main job (`make demo`): a language model trained from text to
-- samples, end to end, on the default device.
--
--   1. corpus:    Debian's fortunes (English text; `make deps` installs the
--                 package), one document per fortune, <|endoftext|> between;
--                 every 20th fortune goes to the validation split
--   2. tokenizer: byte-level BPE trained on the training split (ember.tokenizer)
--   3. tokens:    both splits encoded to uint16 .npy files (tok:encode_file)
--   4. training:  ember.trainer (the loop behind scripts/train.lua): AdamW,
--                 cosine schedule, checkpoints, JSON-lines log, SVG loss curve
--   5. samples:   ember.generate from the final checkpoint, with a KV cache
--
--   ember run examples/demo.lua [--device cpu|cuda] [--steps N] [--out runs/demo] [--fresh]
--
-- A second run finds the finished checkpoint and only samples (--fresh starts
-- over). The CPU model is sized for 2 cores (a few minutes); on a GPU the
-- model is larger and trains longer in about the same time.
local ember = require "ember"
local argparse = require "argparse"
local trainer = require "ember.trainer"
local checkpoint = require "ember.checkpoint"

local fmt = string.format

local parser = argparse("demo.lua", "Tokenize Debian's fortunes, train a small LM on them, print samples.")
parser:option("--device", "cpu or cuda (default: cuda when available).")
parser:option("--corpus", "A folder of fortune files, or one text file (default: $EMBER_DEMO_CORPUS, " ..
  "else /usr/share/games/fortunes).")
parser:option("--out", "Working folder: corpus, tokenizer, tokens, the run.", "runs/demo")
parser:option("--steps", "Training steps (default: 300 on the CPU, 600 on CUDA: about 5 passes over the corpus, past which the model overfits)."):convert(math.tointeger)
parser:option("--samples", "Samples to print at the end.", "3"):convert(math.tointeger)
parser:flag("--fresh", "Start over: retrain the tokenizer and the model even if --out has them.")
local args = parser:parse(arg)

local device = args.device or (ember.cuda.is_available() and "cuda" or "cpu")
if device ~= "cpu" and device ~= "cuda" then parser:error("--device: expected cpu or cuda, got " .. device) end
if device == "cuda" and not ember.cuda.is_available() then
  parser:error("--device cuda: no CUDA device is available in this build or machine")
end

-- Model and schedule per device: 2 CPU cores must show progress within the
-- first minute; a GPU trains a wider, deeper model on longer windows.
local SIZES = {
  cpu = {d_model = 128, d_ff = 384, layers = 4, heads = 4, context = 128, batch = 8, steps = 300,
         lr = 3e-3, log_every = 10, eval_every = 100},
  cuda = {d_model = 384, d_ff = 1024, layers = 6, heads = 6, context = 256, batch = 32, steps = 600,
          lr = 2e-3, log_every = 50, eval_every = 200},
}
local size = SIZES[device]
local steps = args.steps or size.steps
if steps < 1 then parser:error("--steps: expected a positive integer, got " .. tostring(args.steps)) end
local VOCAB, EOT = 2048, "<|endoftext|>"

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

local function mkdir_p(dir)
  local ok = os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "'")
  if not ok then error("demo: cannot create the folder " .. dir, 0) end
end

-- Fortune files shipped by Debian's fortunes and fortunes-min packages
-- (a fixed list, so the corpus does not depend on directory order).
local FORTUNE_FILES = {"art", "computers", "cookie", "debian", "definitions", "disclaimer", "drugs",
  "education", "ethnic", "food", "fortunes", "goedel", "humorists", "kids", "knghtbrd", "law", "linux",
  "linuxcookie", "literature", "love", "magic", "medicine", "men-women", "miscellaneous", "news",
  "paradoxum", "people", "perl", "pets", "platitudes", "politics", "pratchett", "riddles", "science",
  "songs-poems", "sports", "startrek", "tao", "translate-me", "wisdom", "work", "zippy"}

-- The fortunes as documents: a fortune file separates them with lines
-- holding a single '%'. A plain text file is one document per blank-line
-- separated paragraph.
local function read_documents(source)
  local docs, files = {}, 0
  local function add_file(path, sep_line)
    local f = io.open(path, "rb")
    if not f then return end
    files = files + 1
    local text = f:read("a"):gsub("\r\n", "\n")
    f:close()
    local pattern = sep_line and "\n%%\n" or "\n%s*\n"
    local start = 1
    while true do
      local s, e = text:find(pattern, start)
      local doc = text:sub(start, (s or #text + 1) - 1):gsub("^%s+", ""):gsub("%s+$", "")
      if #doc > 0 then docs[#docs + 1] = doc end
      if not s then break end
      start = e + 1
    end
  end
  if exists(source) and not exists(source .. "/fortunes") then
    add_file(source, false)
  else
    for _, name in ipairs(FORTUNE_FILES) do add_file(source .. "/" .. name, true) end
  end
  if #docs == 0 then
    error(fmt("demo: no text found in %s (expected Debian's fortunes there: `sudo apt-get install " ..
      "fortunes`, or pass --corpus FILE)", source), 0)
  end
  return docs, files
end

local out = args.out
mkdir_p(out)
local paths = {train_txt = out .. "/train.txt", val_txt = out .. "/val.txt", tok = out .. "/tok.json",
  train = out .. "/train.npy", val = out .. "/val.npy", run = out .. "/run"}
local t0 = ember.core.clock()
print(fmt("ember demo: device %s, working folder %s", device, out))

-- 1-3: corpus, tokenizer, tokens (kept between runs unless --fresh)
local tok
if args.fresh or not (exists(paths.tok) and exists(paths.train) and exists(paths.val)) then
  local source = args.corpus or os.getenv("EMBER_DEMO_CORPUS") or "/usr/share/games/fortunes"
  local docs, files = read_documents(source)
  local train_docs, val_docs = {}, {}
  for i, d in ipairs(docs) do
    local split = (i % 20 == 0) and val_docs or train_docs
    split[#split + 1] = d
  end
  for name, split in pairs({train_txt = train_docs, val_txt = val_docs}) do
    local f = assert(io.open(paths[name], "wb"))
    f:write(table.concat(split, EOT), EOT)
    f:close()
  end
  local bytes = 0
  for _, d in ipairs(docs) do bytes = bytes + #d end
  print(fmt("[1/5] corpus: %d fortunes from %d files of %s (%.1f MB); %d for training, %d for validation",
    #docs, files, source, bytes / 1e6, #train_docs, #val_docs))
  local t = ember.core.clock()
  tok = ember.tokenizer.train({paths.train_txt}, {vocab_size = VOCAB, special_tokens = {EOT}})
  tok:save(paths.tok)
  print(fmt("[2/5] tokenizer: byte-level BPE, %d tokens, trained in %.1f s -> %s", tok:vocab_size(),
    ember.core.clock() - t, paths.tok))
  t = ember.core.clock()
  local n_train = tok:encode_file(paths.train_txt, paths.train)
  local n_val = tok:encode_file(paths.val_txt, paths.val)
  print(fmt("[3/5] tokens: %d training, %d validation (%.2f bytes a token), encoded in %.1f s", n_train, n_val,
    bytes / (n_train + n_val), ember.core.clock() - t))
else
  tok = ember.tokenizer.load(paths.tok)
  print(fmt("[1-3/5] corpus, tokenizer and tokens found in %s (--fresh redoes them)", out))
end

-- 4: training (a finished run is found and not redone; an interrupted one resumes)
local latest = (not args.fresh) and checkpoint.latest(paths.run) or nil
local run_opts = {train = paths.train, val = paths.val, tokenizer = paths.tok, out = paths.run,
  device = device, model = "tiny", d_model = size.d_model, d_ff = size.d_ff, layers = size.layers,
  heads = size.heads, context = size.context, batch = size.batch, steps = steps, lr = size.lr,
  warmup = math.min(100, steps // 10), weight_decay = 0.1, clip = 1.0, log_every = size.log_every,
  eval_every = size.eval_every, eval_batches = 10, ckpt_every = math.max(100, steps // 4), seed = 0}
if args.fresh then os.execute("rm -rf '" .. paths.run:gsub("'", "'\\''") .. "'") end
local params = ember.nn.count_parameters({vocab_size = tok:vocab_size(), context_length = size.context,
  d_model = size.d_model, d_ff = size.d_ff, num_layers = size.layers, num_heads = size.heads})
print(fmt("[4/5] training: %.2fM parameters (d_model %d, %d layers, %d heads), %d steps of %d x %d tokens%s",
  params / 1e6, size.d_model, size.layers, size.heads, steps, size.batch, size.context,
  latest and (", resuming from " .. latest) or ""))
local summary
if latest then
  summary = trainer.run({resume = latest, steps = steps, device = device, log_every = size.log_every})
else
  summary = trainer.run(run_opts)
end
if summary.interrupted then
  print(fmt("demo: interrupted; the checkpoint %s resumes with `make demo`", tostring(summary.checkpoint)))
  os.exit(130)
end
print(fmt("      loss %.3f (validation %s) after %d steps; checkpoint %s, loss curve %s/loss.svg",
  summary.loss or 0 / 0, summary.val_loss and fmt("%.3f", summary.val_loss) or "n/a", summary.step,
  tostring(summary.checkpoint), paths.run))

-- 5: samples from the checkpoint, as scripts/generate.lua would load it
local model = checkpoint.load_model(summary.checkpoint, {device = device})
model:eval()
local prompts = {"The meaning of life is", "A computer", "Q: Why did the chicken cross the road?\nA:",
  "Love is", "Never"}
print(fmt("[5/5] samples (temperature 0.8, top-p 0.95, up to 60 tokens each):"))
for i = 1, math.min(args.samples, #prompts) do
  local text, info = ember.generate(model, tok, prompts[i], {max_tokens = 60, temperature = 0.8, top_p = 0.95,
    seed = i})
  print(fmt("--- sample %d%s\n%s%s", i, info and info.decode_tokens_per_s and fmt(" (%.0f tokens/s)", info.decode_tokens_per_s)
    or "", prompts[i], text))
end
print(fmt("demo: done in %.0f s. Next: ember run scripts/train.lua --help, ember run scripts/generate.lua --help",
  ember.core.clock() - t0))
