--- The tokenizer's speed: training time (pre-tokenisation + merges) and
-- encode throughput, per thread count, on a corpus file or a synthetic one.
--
--   ember run scripts/bench_tokenizer.lua --corpus corpus.txt --vocab 10000 --threads 1,2
--   ember run scripts/bench_tokenizer.lua --mb 20 --json results.jsonl   # synthetic Zipf text
local ember = require "ember"
local argparse = require "argparse"
local runinfo = require "ember.runinfo"

local parser = argparse("bench_tokenizer.lua", "Byte-level BPE: train time and encode MB/s per thread count.")
parser:option("--corpus", "A text file (default: a synthetic Zipf-distributed corpus of --mb MB).")
parser:option("--mb", "Size of the synthetic corpus in MB.", "10"):convert(tonumber)
parser:option("--vocab", "Vocabulary size.", "10000"):convert(math.tointeger)
parser:option("--threads", "Comma-separated thread counts.", "1,2")
parser:option("--special", "A special token (also put between the synthetic corpus's documents).", "<|endoftext|>")
parser:option("--json", "Append one JSON line per thread count to this file.")
parser:flag("--no-train", "Only encode (with a tokenizer trained on the first MB).")
local args = parser:parse(arg)

local threads = {}
for t in args.threads:gmatch("%d+") do threads[#threads + 1] = tonumber(t) end

-- A synthetic corpus: words of 1-10 letters drawn from a Zipf law over a
-- 50k-word lexicon, punctuation, numbers, line breaks, documents separated by
-- the special token. Deterministic.
local function synthetic(path, mb)
  local seed = 12345
  local function rand() seed = (seed * 1103515245 + 12345) % 2147483648 return seed / 2147483648 end
  local letters = "etaoinshrdlcumwfgypbvkjxqz"
  local lexicon = {}
  for i = 1, 50000 do
    local n, w = 1 + math.floor(rand() * rand() * 10), {}
    for k = 1, n do
      local j = math.floor(rand() ^ 2 * 26) + 1
      w[k] = letters:sub(j, j)
    end
    lexicon[i] = table.concat(w)
  end
  local f = assert(io.open(path, "wb"))
  local bytes, parts, target = 0, {}, mb * 1e6
  while bytes < target do
    local r = rand()
    local w = lexicon[math.floor(1 / (r * 0.9999 + 0.0001)) % 50000 + 1]
    if rand() < 0.05 then w = w:sub(1, 1):upper() .. w:sub(2) end
    local sep = rand()
    local s = sep < 0.02 and (w .. ".\n") or sep < 0.06 and (w .. ", ") or sep < 0.07 and (tostring(math.floor(rand() * 2000)) .. " ")
              or sep < 0.0705 and (w .. ".\n" .. args.special) or (w .. " ")
    parts[#parts + 1] = s
    bytes = bytes + #s
    if #parts >= 4096 then f:write(table.concat(parts)) parts = {} end
  end
  f:write(table.concat(parts))
  f:close()
end

local corpus = args.corpus
if not corpus then
  corpus = os.tmpname()
  synthetic(corpus, args.mb)
end
local f = assert(io.open(corpus, "rb"))
local size = f:seek("end")
f:close()

local facts = runinfo.collect("cpu")
local config = {corpus = args.corpus or ("synthetic " .. args.mb .. " MB"), bytes = size, vocab_size = args.vocab,
                special = args.special}
print(("device: %s   commit: %s   date: %s"):format(facts.device, facts.commit, facts.date))
print(("corpus: %s (%.1f MB), vocab_size %d, special %s"):format(config.corpus, size / 1e6, args.vocab, args.special))
print(("%8s %12s %14s %14s %10s"):format("threads", "train s", "train MB/s", "encode MB/s", "tokens"))

local T = ember.tokenizer
local small
if args.no_train then
  local g = assert(io.open(corpus, "rb"))
  small = T.train_text(g:read(1 << 20), {vocab_size = args.vocab, special_tokens = {args.special}})
  g:close()
end
local out = os.tmpname() .. ".npy"
for _, nt in ipairs(threads) do
  local tok, train_s = small, nil
  if not args.no_train then
    collectgarbage()
    local t0 = ember.clock()
    tok = T.train({corpus}, {vocab_size = args.vocab, special_tokens = {args.special}, threads = nt})
    train_s = ember.clock() - t0
  end
  local t0 = ember.clock()
  local n = tok:encode_file(corpus, out, {threads = nt})
  local enc_s = ember.clock() - t0
  print(("%8d %12s %14s %14.1f %10d"):format(nt, train_s and ("%.2f"):format(train_s) or "-",
        train_s and ("%.1f"):format(size / 1e6 / train_s) or "-", size / 1e6 / enc_s, n))
  if args.json then
    local cjson = require "cjson"
    local j = assert(io.open(args.json, "a"))
    j:write(cjson.encode({bench = "tokenizer", commit = facts.commit, device = facts.device, date = facts.date,
                          config = config, threads = nt, train_s = train_s or cjson.null, encode_s = enc_s,
                          encode_mb_s = size / 1e6 / enc_s, tokens = n, bytes_per_token = size / n}), "\n")
    j:close()
  end
end
os.remove(out)
if not args.corpus then os.remove(corpus) end
