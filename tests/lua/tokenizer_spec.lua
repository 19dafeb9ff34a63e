-- tokenizer_spec.lua — ember.tokenizer (byte-level BPE): pre-tokenisation
-- against a Lua transcription of GPT-2's pattern, training against a naive
-- Lua BPE trainer, round trips (ASCII, CJK, Arabic, accents, emoji, invalid
-- bytes), special tokens, the cache, streaming encode_file, both file formats
-- and the errors corrupt files give.
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/tokenizer_spec.lua

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local T = ember.tokenizer

local EOT = "<|endoftext|>"

-- Seeded pseudo-random text from a word list (deterministic across runs).
local function rng(seed)
  local s = seed
  return function(n)
    s = (s * 1103515245 + 12345) % 2147483648
    return s % n + 1
  end
end

local WORDS = {"the", "cat", "sat", "on", "mat", "it's", "they're", "we'll", "hello", "world", "token",
               "tokens", "tokenizer", "123", "4567", "a", "an", "and", "or", "!", "?!", "...", "(x)", "don't",
               "low", "lower", "lowest", "new", "newer", "widest", "wide"}
local SEPS = {" ", " ", " ", " ", "  ", "\n", "\n\n", "\t", " \n "}

local function corpus(seed, nwords, words, seps)
  local r, out = rng(seed), {}
  words, seps = words or WORDS, seps or SEPS
  for i = 1, nwords do
    out[#out + 1] = words[r(#words)]
    out[#out + 1] = seps[r(#seps)]
  end
  return table.concat(out)
end

local MULTI = "naïve café résumé Ünïcödé — 東京は日本の首都です。你好，世界！ " ..
              "مرحبا بالعالم، كيف حالك؟ Привет, мир! 🙂🚀👩‍👩‍👧 ½ ² ٣ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \u{00A0}nbsp\r\n"

-- GPT-2's pattern for ASCII text, transcribed to Lua patterns.
local CONTRACTIONS = {"'s", "'d", "'m", "'t", "'ll", "'ve", "'re"}
local function ref_pretokenize(s)
  local out, i, n = {}, 1, #s
  while i <= n do
    local m
    for _, c in ipairs(CONTRACTIONS) do
      if s:sub(i, i + #c - 1) == c then m = c break end
    end
    m = m or s:match("^ ?%a+", i) or s:match("^ ?%d+", i) or s:match("^ ?[^%s%w]+", i)
    if not m then
      local ws = assert(s:match("^%s+", i))
      -- \s+(?!\S): a run followed by a non-space leaves its last space to the next piece
      if i + #ws - 1 < n and #ws > 1 then m = ws:sub(1, -2) else m = ws end
    end
    out[#out + 1] = m
    i = i + #m
  end
  return out
end

-- The naive trainer: recount every pair of every word each step; the best pair
-- is the highest count, then the greatest (bytes_a, bytes_b); equal bytes are
-- one symbol. Stops when the vocabulary holds `size` distinct byte strings.
local function ref_train(texts, size, specials)
  local counts = {}
  for _, text in ipairs(texts) do
    for _, p in ipairs(T.pretokenize(text, {special_tokens = specials})) do
      local is_special = false
      for _, s in ipairs(specials or {}) do if p == s then is_special = true end end
      if not is_special then counts[p] = (counts[p] or 0) + 1 end
    end
  end
  local words = {}
  for w, c in pairs(counts) do
    local syms = {}
    for k = 1, #w do syms[k] = w:sub(k, k) end
    words[#words + 1] = {syms = syms, count = c}
  end
  local vocab, nvocab, merges = {}, 256, {}
  for b = 0, 255 do vocab[string.char(b)] = true end
  while nvocab < size - #(specials or {}) do
    local pc = {}
    for _, w in ipairs(words) do
      for k = 1, #w.syms - 1 do
        local key = w.syms[k] .. "\0" .. w.syms[k + 1]
        local e = pc[key]
        if not e then e = {a = w.syms[k], b = w.syms[k + 1], n = 0}; pc[key] = e end
        e.n = e.n + w.count
      end
    end
    local best
    for _, e in pairs(pc) do
      if not best or e.n > best.n or (e.n == best.n and (e.a > best.a or (e.a == best.a and e.b > best.b))) then best = e end
    end
    if not best then break end
    merges[#merges + 1] = {best.a, best.b}
    local c = best.a .. best.b
    if not vocab[c] then vocab[c] = true; nvocab = nvocab + 1 end
    for _, w in ipairs(words) do
      local s, out, k = w.syms, {}, 1
      while k <= #s do
        if k < #s and s[k] == best.a and s[k + 1] == best.b then out[#out + 1] = c; k = k + 2
        else out[#out + 1] = s[k]; k = k + 1 end
      end
      w.syms = out
    end
  end
  return merges
end

local function same_list(a, b)
  if #a ~= #b then return false, ("lengths %d and %d"):format(#a, #b) end
  for i = 1, #a do
    if a[i] ~= b[i] then return false, ("position %d: %s vs %s"):format(i, tostring(a[i]), tostring(b[i])) end
  end
  return true
end

local function assert_same(a, b, what)
  local ok, why = same_list(a, b)
  assert(ok, (what or "lists") .. " differ: " .. tostring(why))
end

local function write(path, s) H.spit(path, s) return path end

describe("ember.tokenizer", function()
  if not T.available() then
    pending("this build has no PCRE2: " .. select(2, T.available()))
    return
  end
  teardown(function() H.remove_temps() end)

  local text = corpus(1, 3000) .. EOT .. corpus(2, 1500) .. MULTI:rep(3) .. EOT
  local tok = T.train_text(text, {vocab_size = 400, special_tokens = {EOT}})

  describe("pre-tokenisation", function()
    it("cuts ASCII text as GPT-2's pattern does", function()
      local s = corpus(3, 2000, nil, {" ", "  ", "   ", "\n", "\n\n", "\t", " \n ", "\n  ", "", ",", "'"})
      assert_same(T.pretokenize(s), ref_pretokenize(s), "pieces")
    end)

    it("gives a special token its own piece and never cuts it", function()
      local p = T.pretokenize("a" .. EOT .. "b " .. EOT .. EOT, {special_tokens = {EOT}})
      assert.same({"a", EOT, "b", " ", EOT, EOT}, p)
    end)

    it("keeps letters of any script together and splits numbers from letters", function()
      assert.same({"東京は日本の首都です", "。", "你好"}, T.pretokenize("東京は日本の首都です。你好"))
      assert.same({"مرحبا", " بالعالم"}, T.pretokenize("مرحبا بالعالم"))
      assert.same({"abc", "123", " ½²", ",", " x"}, T.pretokenize("abc123 ½², x"))
    end)
  end)

  describe("training", function()
    for _, size in ipairs({257, 270, 300, 350}) do
      it("learns the same merges as a naive reference trainer (vocab_size " .. size .. ")", function()
        local docs = {corpus(10 + size, 400), "low lower lowest newer newest widest " .. EOT .. " wide " .. MULTI}
        local t = T.train_text(docs, {vocab_size = size, special_tokens = {EOT}})
        local got, want = t:merges(), ref_train(docs, size, {EOT})
        assert.are.equal(#want, #got)
        for i = 1, #want do
          assert(got[i][1] == want[i][1] and got[i][2] == want[i][2],
                 ("merge %d: got (%q, %q), reference (%q, %q)"):format(i, got[i][1], got[i][2], want[i][1], want[i][2]))
        end
        assert.are.equal(size, t:vocab_size())
      end)
    end

    it("breaks ties by the greatest pair of byte strings", function()
      -- "ab" and "cd" both appear twice: (c, d) > (a, b)
      local t = T.train_text("ab cd ab cd", {vocab_size = 257})
      assert.same({{"c", "d"}}, t:merges())
    end)

    it("gives the same tokenizer for any thread count", function()
      local big = corpus(7, 60000)   -- ~330 KB: several work items
      local a = T.train_text(big, {vocab_size = 320, threads = 1})
      local b = T.train_text(big, {vocab_size = 320, threads = 2})
      local c = T.train_text(big, {vocab_size = 320, threads = 5})
      assert.same(a:merges(), b:merges())
      assert.same(a:merges(), c:merges())
    end)

    it("trains from files, each a document", function()
      local f1, f2 = write(H.temp(".txt"), corpus(4, 300)), write(H.temp(".txt"), MULTI)
      local t = T.train({f1, f2}, {vocab_size = 300, special_tokens = {EOT}})
      local ref = T.train_text({H.slurp(f1), H.slurp(f2)}, {vocab_size = 300, special_tokens = {EOT}})
      assert.same(ref:merges(), t:merges())
      assert.are.equal(299, t:id_of(EOT))
    end)

    it("never learns across or into a special token", function()
      local t = T.train_text(("x" .. EOT):rep(200), {vocab_size = 300, special_tokens = {EOT}})
      assert.same({}, t:merges())                 -- only single x's are left between the specials
      for _, m in ipairs(tok:merges()) do
        assert.is_nil((m[1] .. m[2]):find("<|", 1, true), "a merge reached into a special token")
      end
    end)

    it("refuses a vocab_size below the bytes and the special tokens", function()
      local ok, err = pcall(T.train_text, "abc", {vocab_size = 100, special_tokens = {EOT, "<|pad|>"}})
      assert.is_false(ok)
      assert.matches("ember.tokenizer.train_text: expected vocab_size >= 256 + #special_tokens (258), got 100", err, 1, true)
      ok, err = pcall(T.train, {"/nonexistent/corpus.txt"}, {vocab_size = 300})
      assert.matches("ember.tokenizer.train: cannot open '/nonexistent/corpus.txt'", err, 1, true)
      ok, err = pcall(T.train, {"x"}, {vocab_size = 300, vocab = 3})
      assert.matches("unknown option 'vocab'", err, 1, true)
    end)
  end)

  describe("encode and decode", function()
    for name, s in pairs({ascii = corpus(5, 200), multilingual = MULTI, emoji = "🙂🚀 👩‍👩‍👧 🇫🇷 ok 🙂",
                          empty = "", specials = EOT .. "a" .. EOT .. EOT .. " b" .. EOT}) do
      it("round-trips " .. name .. " text", function()
        assert.are.equal(s, tok:decode(tok:encode(s)))
      end)
    end

    it("round-trips bytes that are not UTF-8", function()
      local s = "ok \xff\xfe caf\xc3 \xe2\x82 end\x80"
      assert.are.equal(s, tok:decode(tok:encode(s)))
    end)

    it("encodes a special token as its one id, wherever it stands", function()
      local id = tok:id_of(EOT)
      assert.are.equal(399, id)
      assert.same({id}, tok:encode(EOT))
      local ids = tok:encode("the" .. EOT .. "cat")
      local n = 0
      for _, x in ipairs(ids) do if x == id then n = n + 1 end end
      assert.are.equal(1, n)
      assert.are.equal(EOT, tok:token_of(id))
      assert.is_true(tok:is_special(id))
      assert.same({[EOT] = id}, tok:special_tokens())
      assert.is_nil(tok:id_of("<|nope|>"))
    end)

    it("prefers the longest special token at a position", function()
      local t = T.train_text("a b", {vocab_size = 258, special_tokens = {"<|a|>", "<|a|><|b|>"}})
      assert.same({257}, t:encode("<|a|><|b|>"))
      assert.same({256, 256}, t:encode("<|a|><|a|>"))
    end)

    it("gives the same ids with and without the cache", function()
      local s = corpus(6, 3000) .. MULTI
      local with = tok:encode(s)
      assert_same(tok:encode(s, {cache = false}), with, "ids")
      tok:set_cache(3)                            -- cleared again and again
      assert_same(tok:encode(s), with, "ids (small cache)")
      tok:set_cache(65536)
    end)

    it("applies merges by rank as the training segmented the words", function()
      local t = T.train_text("low low low lower lowest", {vocab_size = 262})
      local ids = t:encode("low")
      assert.are.equal(1, #ids)
      assert.are.equal("low", t:token_of(ids[1]))
    end)

    it("merges short and long pre-tokens as a naive by-rank encoder does", function()
      local t = T.train_text(corpus(11, 2000, {"ab", "aab", "abb", "ba", "aaaa", "bab"}, {"", "", " "}), {vocab_size = 300})
      local rank = {}
      for r, m in ipairs(t:merges()) do rank[m[1] .. "\0" .. m[2]] = rank[m[1] .. "\0" .. m[2]] or r end
      local function ref(word)                    -- the lowest rank, then the leftmost, until none applies
        local s = {}
        for k = 1, #word do s[k] = word:sub(k, k) end
        while true do
          local best, at
          for k = 1, #s - 1 do
            local r = rank[s[k] .. "\0" .. s[k + 1]]
            if r and (not best or r < best) then best, at = r, k end
          end
          if not best then break end
          s[at] = s[at] .. table.remove(s, at + 1)
        end
        local ids = {}
        for k, piece in ipairs(s) do ids[k] = t:id_of(piece) end
        return ids
      end
      local r = rng(5)
      for _, n in ipairs({3, 20, 64, 65, 100, 300, 2000}) do
        local w = {}
        for k = 1, n do w[k] = r(3) == 1 and "b" or "a" end
        w = table.concat(w)
        assert_same(t:encode(w, {cache = false}), ref(w), "ids of a " .. n .. "-byte word")
      end
    end)

    it("replaces invalid UTF-8 as Python's bytes.decode(errors='replace') does", function()
      local function dec(bytes) return tok:decode(tok:encode(bytes), {errors = "replace"}) end
      local R = "\u{FFFD}"
      assert.are.equal("a" .. R .. "b", dec("a\xffb"))
      assert.are.equal(R, dec("\xe2\x82"))                  -- a truncated sequence: one maximal subpart
      assert.are.equal(R .. R .. R, dec("\xed\xa0\x80"))     -- a surrogate
      assert.are.equal(R .. R .. R, dec("\xf0\x80\x80"))     -- an overlong
      assert.are.equal(R .. "A", dec("\xf0\x9f\x99A"))
      assert.are.equal(R .. R, dec("\xc0\xaf"))
      assert.are.equal("é🙂", dec("é🙂"))
      local ok, err = pcall(tok.decode, tok, tok:encode("\xff"), {errors = "strict"})
      assert.matches("invalid UTF-8", err, 1, true)
    end)

    it("names the function and the bad id", function()
      local ok, err = pcall(tok.decode, tok, {1, 2, 400})
      assert.matches("ember.tokenizer.decode: expected ids in [0, 400), got 400 at position 3", err, 1, true)
      ok, err = pcall(tok.decode, tok, {1, "x"})
      assert.matches("ember.tokenizer.decode: expected ids to be integers, got string at position 2", err, 1, true)
      ok, err = pcall(tok.encode, tok, 42)
      assert.matches("ember.tokenizer.encode: expected argument 2 (text) to be a string, got number", err, 1, true)
    end)
  end)

  describe("encode_file", function()
    local s = corpus(8, 4000) .. EOT .. MULTI .. EOT .. "tail  \n\n   " .. EOT .. "x"
    local src = write(H.temp(".txt"), s)
    local want = tok:encode(s)
    for _, cfg in ipairs({{chunk_bytes = 1, threads = 1}, {chunk_bytes = 7, threads = 2}, {chunk_bytes = 64, threads = 3},
                          {chunk_bytes = 4096, threads = 2}, {}}) do
      it(("equals encoding the whole text (chunk_bytes=%s, threads=%s)"):format(cfg.chunk_bytes, cfg.threads), function()
        local out = H.temp(".npy")
        local n = tok:encode_file(src, out, cfg)
        assert.are.equal(#want, n)
        local ids = ember.load_npy(out)
        assert.are.equal("u16", ids.dtype)
        assert_same(ids:tolist(), want, "ids")
      end)
    end

    it("calls a progress function and stops when it raises", function()
      local calls = 0
      tok:encode_file(src, H.temp(".npy"), {chunk_bytes = 1000, threads = 1, progress = function(done, total, n)
        calls = calls + 1
        assert(done <= total)
      end})
      assert(calls >= 10, "progress was called " .. calls .. " times")
      local out = H.temp(".npy")
      local ok, err = pcall(tok.encode_file, tok, src, out, {chunk_bytes = 1000, progress = function() error("enough") end})
      assert.is_false(ok)
      assert.matches("enough", err)
      assert.is_nil(io.open(out))
    end)

    it("names a missing input", function()
      local ok, err = pcall(tok.encode_file, tok, "/nonexistent.txt", H.temp(".npy"))
      assert.matches("ember.tokenizer.encode_file: cannot open '/nonexistent.txt'", err, 1, true)
    end)
  end)

  describe("files", function()
    local sample = corpus(9, 300) .. MULTI .. EOT .. "x y\"z\\w"

    it("saves and loads Ember's JSON", function()
      local p = H.temp(".json")
      tok:save(p)
      local t2 = T.load(p)
      assert.are.equal(tok:vocab_size(), t2:vocab_size())
      assert.same(tok:merges(), t2:merges())
      assert_same(t2:encode(sample), tok:encode(sample), "ids")
      assert.are.equal(tok:pattern(), t2:pattern())
    end)

    it("writes GPT-2's vocab.json and merges.txt and loads them back", function()
      local v, m = H.temp("-vocab.json"), H.temp("-merges.txt")
      tok:save_gpt2(v, m)
      assert.matches('"Ġ', H.slurp(v), 1, true)         -- a space spelled as GPT-2 spells it
      assert.are.equal("#version: 0.2\n", H.slurp(m):sub(1, 14))
      local t2 = T.from_gpt2(v, m)
      assert.are.equal(tok:vocab_size(), t2:vocab_size())
      assert.are.equal(tok:id_of(EOT), t2:id_of(EOT))
      assert_same(t2:encode(sample), tok:encode(sample), "ids")
      assert.are.equal(sample, t2:decode(t2:encode(sample)))
    end)

    it("loads GPT-2 files with GPT-2's own byte ids", function()
      -- ids as GPT-2 numbers them: '!' is 0, bytes in bytes_to_unicode order, merges from 256
      local chars = {}
      for b = 33, 126 do chars[#chars + 1] = utf8.char(b) end
      for b = 161, 172 do chars[#chars + 1] = utf8.char(b) end
      for b = 174, 255 do chars[#chars + 1] = utf8.char(b) end
      for k = 0, 67 do chars[#chars + 1] = utf8.char(256 + k) end
      local entries = {}
      for i, c in ipairs(chars) do entries[#entries + 1] = ('"%s": %d'):format(c == '"' and '\\"' or c == "\\" and "\\\\" or c, i - 1) end
      entries[#entries + 1] = '"Ġt": 256'
      entries[#entries + 1] = '"he": 257'
      entries[#entries + 1] = '"Ġthe": 258'
      entries[#entries + 1] = '"<|endoftext|>": 259'
      local v = write(H.temp(".json"), "{" .. table.concat(entries, ", ") .. "}")
      local m = write(H.temp(".txt"), "#version: 0.2\nĠ t\nh e\nĠt he\n")
      local t = T.from_gpt2(v, m)
      assert.are.equal(260, t:vocab_size())
      assert.same({258, 258, 259}, t:encode(" the the" .. EOT))
      assert.same({chars[1] == "!" and 0}, t:encode("!"))
      assert.are.equal(" the", t:token_of(258))
    end)

    describe("refuses corrupt or inconsistent files", function()
      local function refuses(fn, want)
        local ok, err = pcall(fn)
        assert.is_false(ok, "loaded")
        assert.matches(want, err, 1, true)
      end
      local v, m = H.temp("-vocab.json"), H.temp("-merges.txt")
      tok:save_gpt2(v, m)
      local vocab_text, merges_text = H.slurp(v), H.slurp(m)

      it("not JSON", function()
        local p = write(H.temp(".json"), "{\"format\": ")
        refuses(function() T.load(p) end, "ember.tokenizer.load: '" .. p .. "' is not valid JSON")
      end)
      it("another format", function()
        local p = write(H.temp(".json"), '{"format": "hf", "version": 1}')
        refuses(function() T.load(p) end, "key 'format': expected \"ember.tokenizer\", got \"hf\"")
      end)
      it("a merge of ids outside the vocabulary", function()
        local p = H.temp(".json")
        tok:save(p)
        write(p, (H.slurp(p):gsub('"merges": %[\n    %[%d+, %d+%]', '"merges": [\n    [5, 9999]')))
        refuses(function() T.load(p) end, "key 'merges' item 0: ids [5, 9999] outside [0, 400)")
      end)
      it("a vocab item that is not a byte string", function()
        local p = H.temp(".json")
        tok:save(p)
        write(p, (H.slurp(p):gsub('"vocab": %[\n    "[^"]*"', '"vocab": [\n    "中"')))
        refuses(function() T.load(p) end, "key 'vocab' item 0: character U+4E2D is not one of GPT-2's 256 byte characters")
      end)
      it("a missing byte token", function()
        local p = write(H.temp(".json"), '{"format": "ember.tokenizer", "version": 1, "pattern": "x", ' ..
                        '"special_tokens": {}, "vocab": ["a", "b"], "merges": []}')
        refuses(function() T.load(p) end, "no token for the byte 0x00")
      end)
      it("a vocab.json id used twice", function()
        local bad = write(H.temp(".json"), (vocab_text:gsub(": 1,", ": 0,", 1)))
        refuses(function() T.from_gpt2(bad, m) end, "both have id 0")
      end)
      it("a vocab.json id outside 0..N-1", function()
        local bad = write(H.temp(".json"), (vocab_text:gsub(": 1,", ": 70000,", 1)))
        refuses(function() T.from_gpt2(bad, m) end, "id 70000 outside [0, 400)")
      end)
      it("a merges.txt line without two tokens", function()
        local bad = write(H.temp(".txt"), merges_text .. "abc\n")
        refuses(function() T.from_gpt2(v, bad) end, "'" .. bad .. "': line " .. select(2, merges_text:gsub("\n", "")) + 1 ..
                ": expected two tokens separated by one space, got 'abc'")
      end)
      it("a merges.txt token not in vocab.json", function()
        local bad = write(H.temp(".txt"), "#version: 0.2\nq 中\n")
        refuses(function() T.from_gpt2(v, bad) end, "line 2: token '中' is not in '" .. v .. "'")
      end)
      it("a merge whose result is not in vocab.json", function()
        local bad = write(H.temp(".txt"), "#version: 0.2\nq z\n")
        refuses(function() T.from_gpt2(v, bad) end, "line 2: the merged token 'qz' is not in '" .. v .. "'")
      end)
      it("a missing file", function()
        refuses(function() T.from_gpt2("/nonexistent/vocab.json", m) end,
                "ember.tokenizer.from_gpt2: cannot open '/nonexistent/vocab.json'")
      end)
    end)
  end)
end)
