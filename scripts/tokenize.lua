--- Turn text files into the token arrays scripts/train.lua reads: train a
-- byte-level BPE tokenizer on them (or load one), then stream every input
-- through the encoder into a 1-D .npy of ids (uint16 when the vocabulary has
-- at most 65536 ids, else int32: Ember has no uint32), with an optional
-- validation split, and the end-of-text token between documents.
--
--   ember run scripts/tokenize.lua corpus.txt --train-tokenizer tok.json --vocab-size 8000 \
--     --out data/train.npy --val-fraction 0.01          # + data/train.val.npy
--   ember run scripts/tokenize.lua fortunes/* --tokenizer tok.json --doc-sep '%' --out data/f.npy
--   ember run scripts/tokenize.lua web.txt --vocab vocab.json --merges merges.txt --out web.npy   # GPT-2's
--
-- Documents (--doc-sep): `file` (default) each input file is one; `blank` a
-- blank line ends one; `none` no documents, the text is concatenated as is;
-- any other string: a line equal to it ends one (fortune files: '%').
-- Separator lines are dropped and --eot (a special token of the tokenizer)
-- goes between documents. --val-fraction F sends the tail of the corpus to
-- the validation file, from the first document that starts at or after
-- (1 - F) of the input bytes (with --doc-sep none, the first line).
--
-- Larger than memory: the inputs are read line by line (or in 1 MB chunks
-- with --doc-sep file/none) into a prepared text beside the output when
-- documents are joined or split, and encoded by tok:encode_file, which
-- streams in rounds of --chunk-mb per thread. Output files are written
-- atomically (a failed run leaves none). Progress on stderr: MB done, MB/s,
-- tokens.
local ember = require "ember"
local argparse = require "argparse"
local T = ember.tokenizer

local parser = argparse("tokenize.lua", "Tokenize text files into .npy token arrays for scripts/train.lua.")
parser:argument("inputs", "Text files (UTF-8 or any bytes).", nil):args("+")
parser:option("--out", "The training tokens (.npy).", "tokens.npy")
parser:option("--tokenizer", "Load Ember's tokenizer JSON (tok:save).")
parser:option("--vocab", "GPT-2's vocab.json (with --merges).")
parser:option("--merges", "GPT-2's merges.txt (with --vocab).")
parser:option("--train-tokenizer", "Train a tokenizer on the training text and save it here (JSON).")
parser:option("--vocab-size", "Vocabulary size of --train-tokenizer.", "8000"):convert(math.tointeger)
parser:option("--special", "Special tokens of --train-tokenizer besides --eot (comma list).", "")
parser:option("--eot", "The end-of-text special token put between documents.", "<|endoftext|>")
parser:option("--doc-sep", "What separates documents: file, blank, none, or a separator line (e.g. '%').",
  "file")
parser:option("--val-fraction", "Send this tail fraction of the corpus to the validation file.")
  :convert(tonumber)
parser:option("--val", "Validation text files (instead of --val-fraction)."):args("+")
parser:option("--val-out", "The validation tokens (default: --out with .val.npy).")
parser:option("--threads", "Encoder threads (0: every core).", "0"):convert(math.tointeger)
parser:option("--chunk-mb", "MB of text per thread per round.", "4"):convert(tonumber)
parser:flag("--quiet", "No progress lines.")
local args = parser:parse(arg)

local function fail(msg)
  io.stderr:write("tokenize.lua: ", msg, "\n")
  os.exit(2)
end

-- ---------------------------------------------------------------------------
-- options

local loaders = (args.tokenizer and 1 or 0) + ((args.vocab or args.merges) and 1 or 0) +
  (args.train_tokenizer and 1 or 0)
if loaders ~= 1 then
  fail("expected exactly one of --tokenizer FILE, --vocab FILE --merges FILE, --train-tokenizer FILE")
end
if (args.vocab == nil) ~= (args.merges == nil) then fail("--vocab and --merges go together (GPT-2's two files)") end
if args.val_fraction and args.val then fail("expected --val-fraction or --val, not both") end
if args.val_fraction and not (args.val_fraction > 0 and args.val_fraction < 1) then
  fail(("expected --val-fraction in (0, 1), got %s"):format(args.val_fraction))
end
if not args.vocab_size or args.vocab_size < 257 then fail("expected --vocab-size >= 257") end
if not args.threads or args.threads < 0 then fail("expected --threads >= 0") end
if not args.chunk_mb or args.chunk_mb <= 0 then fail("expected --chunk-mb > 0") end
local mode = args.doc_sep
local eot = mode ~= "none" and args.eot or nil
local val_out = args.val_out or (args.out:gsub("%.npy$", "") .. ".val.npy")
if args.val_out == nil and val_out == args.out then fail("expected --val-out (it would be --out)") end
local want_val = args.val_fraction ~= nil or args.val ~= nil

local function size_of(path)
  local f, err = io.open(path, "rb")
  if not f then fail(("cannot open input '%s': %s"):format(path, tostring(err))) end
  local n = f:seek("end")
  f:close()
  return n
end
local total_bytes = 0
for _, p in ipairs(args.inputs) do total_bytes = total_bytes + size_of(p) end
for _, p in ipairs(args.val or {}) do size_of(p) end

-- ---------------------------------------------------------------------------
-- progress

local clock = ember.core.clock
local function progress(label, total)
  if args.quiet then return nil end
  local t0, last = clock(), -1
  return function(done, tot, tokens)
    tot = tot or total
    local now = clock()
    if now - last < 0.25 and done < tot then return end
    last = now
    local rate = done / 1e6 / math.max(now - t0, 1e-9)
    io.stderr:write(("\r%s: %.2f / %.2f MB (%3.0f%%), %.1f MB/s%s   "):format(label, done / 1e6, tot / 1e6,
      tot > 0 and 100 * done / tot or 100, rate, tokens and (", %d tokens"):format(tokens) or ""))
    io.stderr:flush()
  end
end
local function progress_end() if not args.quiet then io.stderr:write("\n") end end

-- ---------------------------------------------------------------------------
-- documents: the inputs rewritten with --eot between documents (and split)

local temps = {}
local function temp_path(what)
  local p = args.out .. ".prep." .. what .. ".txt"
  temps[#temps + 1] = p
  return p
end
local function remove_temps() for _, p in ipairs(temps) do os.remove(p) end end

-- Copy `files` into sinks.train (and sinks.val from the byte `split_at` on,
-- at a document start), `eot` between documents. Returns document counts.
local function prepare(files, sinks, split_at, label)
  local bytes_total = 0
  for _, p in ipairs(files) do bytes_total = bytes_total + size_of(p) end
  local show = progress(label, bytes_total)
  local offset, cur = 0, "train"
  local docs = {train = 0, val = 0}
  local function start_doc(at)
    if sinks.val and cur == "train" and at >= split_at then cur = "val" end
    if docs[cur] > 0 and eot then sinks[cur]:write(eot) end
    docs[cur] = docs[cur] + 1
  end
  for _, path in ipairs(files) do
    local f = assert(io.open(path, "rb"))
    if mode == "file" or (mode == "none" and not sinks.val) then
      local first = true
      while true do
        local chunk = f:read(1 << 20)
        if not chunk then break end
        if first then start_doc(offset) first = false end
        sinks[cur]:write(chunk)
        offset = offset + #chunk
        if show then show(offset) end
      end
    else
      local in_doc = false
      for line in f:lines("L") do
        local body = line:gsub("\r?\n$", "")
        local is_sep = (mode == "blank" and body:match("^%s*$") ~= nil) or (mode ~= "blank" and mode ~= "none" and
          body == mode)
        if is_sep then
          in_doc = false
        else
          if not in_doc or mode == "none" then start_doc(offset) in_doc = true end
          sinks[cur]:write(line)
        end
        offset = offset + #line
        if show and offset % (1 << 20) < #line then show(offset) end
      end
    end
    f:close()
  end
  if show then show(bytes_total) progress_end() end
  return docs
end

-- ---------------------------------------------------------------------------
-- the run

local function run()
  local t_start = clock()
  local need_prep = args.val_fraction ~= nil or #args.inputs > 1 or (mode ~= "file" and mode ~= "none")
  local train_text, val_text = args.inputs[1], nil

  -- a loaded tokenizer must know --eot before any work
  local tok
  if args.tokenizer then tok = T.load(args.tokenizer)
  elseif args.vocab then tok = T.from_gpt2(args.vocab, args.merges) end
  local function check_eot(t)
    if eot and not t:id_of(eot) then
      error(("the tokenizer has no special token %q to put between documents: give --eot, " ..
             "or --doc-sep none"):format(eot), 0)
    end
  end
  if tok then check_eot(tok) end

  if need_prep then
    train_text = temp_path("train")
    local sinks = {train = assert(io.open(train_text, "wb"))}
    if args.val_fraction then
      val_text = temp_path("val")
      sinks.val = assert(io.open(val_text, "wb"))
    end
    local split_at = math.ceil((1 - (args.val_fraction or 0)) * total_bytes)
    local docs = prepare(args.inputs, sinks, split_at, "prepare")
    for _, s in pairs(sinks) do s:close() end
    if docs.train == 0 then error("no document for training (is the input empty?)", 0) end
    if args.val_fraction and docs.val == 0 then
      error(("--val-fraction %g left no document for validation (%d in all): use a larger fraction, " ..
             "--doc-sep blank/none, or --val FILE"):format(args.val_fraction, docs.train), 0)
    end
    if not args.quiet then
      io.stderr:write(("prepare: %d training document(s)%s\n"):format(docs.train,
        args.val_fraction and (", %d validation document(s)"):format(docs.val) or ""))
    end
  end
  if args.val then
    if #args.val > 1 or (mode ~= "file" and mode ~= "none") then
      val_text = temp_path("val")
      local sink = assert(io.open(val_text, "wb"))
      prepare(args.val, {train = sink}, math.huge, "prepare val")
      sink:close()
    else
      val_text = args.val[1]
    end
  end

  if args.train_tokenizer then
    local special = {}
    if eot then special[1] = eot end
    for s in args.special:gmatch("[^,]+") do if s ~= eot then special[#special + 1] = s end end
    if not args.quiet then
      io.stderr:write(("train tokenizer: vocab %d on %.2f MB ...\n"):format(args.vocab_size, size_of(train_text) / 1e6))
    end
    local t0 = clock()
    tok = T.train({train_text}, {vocab_size = args.vocab_size, special_tokens = special, threads = args.threads})
    tok:save(args.train_tokenizer)
    if not args.quiet then
      io.stderr:write(("train tokenizer: %d ids in %.1f s -> %s\n"):format(tok:vocab_size(), clock() - t0,
        args.train_tokenizer))
    end
  end

  local function encode(text, out, label)
    local n = tok:encode_file(text, out, {progress = progress(label) or false, threads = args.threads,
      chunk_bytes = math.floor(args.chunk_mb * 2 ^ 20)})
    if not args.quiet then progress_end() end
    local dtype = ember.data.open(out).dtype
    print(("%s: %d tokens (%s, %.2f bytes/token) from %.2f MB"):format(out, n, dtype == "u16" and "uint16" or
      "int32", n > 0 and size_of(text) / n or 0, size_of(text) / 1e6))
    return n
  end
  encode(train_text, args.out, "encode train")
  if val_text then encode(val_text, val_out, "encode val") end
  print(("tokenizer: %d ids%s; %.1f s in all"):format(tok:vocab_size(),
    eot and (", %q = %d between documents"):format(eot, tok:id_of(eot)) or "", clock() - t_start))
end

local ok, err = pcall(run)
remove_temps()
if not ok then
  if not args.quiet then io.stderr:write("\n") end
  io.stderr:write("tokenize.lua: ", tostring(err), "\n")
  os.exit(tostring(err):find("interrupted!", 1, true) and 130 or 1)
end
