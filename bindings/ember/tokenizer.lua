--- ember.tokenizer: byte-level BPE (GPT-2 semantics) over engine/data's C
-- tokenizer. Training, encoding, decoding and the file formats are C
-- (bindings/lua/lua_tokenizer.c); this module names them.
--
--   local tok = ember.tokenizer.train({"corpus.txt"}, {vocab_size = 1000, special_tokens = {"<|endoftext|>"}})
--   local ids = tok:encode("text")          --> Lua array of 0-based ids
--   tok:decode(ids)                          --> the bytes; {errors = "replace"} gives U+FFFD for invalid UTF-8
--   tok:vocab_size() ; tok:save("tok.json") ; ember.tokenizer.load("tok.json")
--   ember.tokenizer.from_gpt2("vocab.json", "merges.txt") ; tok:save_gpt2("vocab.json", "merges.txt")
--   tok:encode_file("corpus.txt", "corpus.npy", {progress = true})   --> token count (uint16 .npy when vocab <= 65536)
--   tok:id_of("<|endoftext|>") ; tok:token_of(id) ; tok:special_tokens() ; tok:merges()
--
-- Options: train{vocab_size=, special_tokens=, threads= (0: every core), pattern= (PCRE2;
-- default GPT-2's)}; encode(text, {cache=false}); encode_file(in, out, {progress=true|fn(done,
-- total, tokens), chunk_bytes=, threads=}). docs/tokenizer.md has the formats and figures.
local core = require "ember.core"

local M = {}

M.GPT2_PATTERN = core.tokenizer_gpt2_pattern

--- train({paths}, opts) -> Tokenizer: each file is one document.
M.train = core.tokenizer_train
--- train_text(text or {texts}, opts) -> Tokenizer: each text is one document.
M.train_text = core.tokenizer_train_text
--- load(path) -> Tokenizer from Ember's JSON (tok:save).
M.load = core.tokenizer_load
--- from_gpt2(vocab_json, merges_txt) -> Tokenizer with the files' ids.
M.from_gpt2 = core.tokenizer_from_gpt2
--- pretokenize(text, {special_tokens=, pattern=}) -> the pieces BPE merges within.
M.pretokenize = core.tokenizer_pretokenize
--- available() -> true, or false and why (a build without PCRE2).
M.available = core.tokenizer_available

return M
