-- tokenize_spec.lua — scripts/tokenize.lua: the .npy it writes holds exactly
-- the ids of encoding each document, with the end-of-text id between
-- documents, and the validation split is the corpus' tail.
local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local T = ember.tokenizer
local EOT = "<|endoftext|>"

local function tokenize(args)
  local argv = {"run", "scripts/tokenize.lua"}
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  return H.ember(argv)
end

-- a fortune file: documents of 1-4 lines of seeded random words, each followed by a line "%"
local function fortunes(n)
  local words = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "while", "birds",
                 "sang", "in", "tall", "green", "trees", "under", "sky", "don't", "42", "é"}
  local rng = 17
  local function rand(k) rng = (rng * 1103515245 + 12345) % 2147483648 return rng % k + 1 end
  local docs, parts = {}, {}
  for i = 1, n do
    local lines = {}
    for l = 1, rand(4) do
      local w = {}
      for j = 1, rand(8) + 2 do w[j] = words[rand(#words)] end
      lines[l] = table.concat(w, " ") .. "\n"
    end
    docs[i] = table.concat(lines)
    parts[#parts + 1] = docs[i] .. "%\n"
  end
  return docs, table.concat(parts)
end

-- ids of docs[first..last] encoded one by one, eot between them
local function expected(tok, docs, first, last)
  local ids, eot = {}, tok:id_of(EOT)
  for i = first, last do
    if i > first then ids[#ids + 1] = eot end
    for _, id in ipairs(tok:encode(docs[i])) do ids[#ids + 1] = id end
  end
  return ids
end

local function ids_of(path) return ember.data.open(path):to("i64"):tolist() end

local describe_if = T.available() and describe or pending

describe_if("scripts/tokenize.lua", function()
  after_each(function() H.remove_temps() end)

  it("trains a tokenizer, puts <|endoftext|> between '%' documents and sends the tail to validation", function()
    local docs, text = fortunes(60)
    local dir = H.tmpdir()
    local input = H.spit(dir .. "/fortunes.txt", text)
    local out, err, status = tokenize({input, "--train-tokenizer", dir .. "/tok.json", "--vocab-size", "300",
      "--doc-sep", "%", "--val-fraction", "0.2", "--out", dir .. "/f.npy", "--threads", "1"})
    assert.are.equal(0, status, err)
    assert.truthy(err:find("prepare: ", 1, true), err)           -- the progress lines
    assert.truthy(err:find("MB/s", 1, true), err)
    -- the validation set starts at the first document starting at or after 80% of the bytes
    local split_at, offset, first_val = math.ceil(0.8 * #text), 0, nil
    for i, d in ipairs(docs) do
      if not first_val and offset >= split_at then first_val = i end
      offset = offset + #d + 2                                    -- + "%\n"
    end
    local tok = T.load(dir .. "/tok.json")
    assert.is_number(tok:id_of(EOT))
    assert.same(expected(tok, docs, 1, first_val - 1), ids_of(dir .. "/f.npy"))
    assert.same(expected(tok, docs, first_val, #docs), ids_of(dir .. "/f.val.npy"))
    assert.are.equal("u16", ember.data.open(dir .. "/f.npy").dtype)
    assert.truthy(out:find(dir .. "/f.npy: ", 1, true), out)
    assert.is_nil(H.slurp(dir .. "/f.npy.prep.train.txt"))       -- the prepared text is gone
  end)

  it("loads a tokenizer and joins input files as documents; one file alone is encoded whole", function()
    local dir = H.tmpdir()
    local docs = {"first file,\nwith two lines\n", "second file: don't stop\n"}
    local a, b = H.spit(dir .. "/a.txt", docs[1]), H.spit(dir .. "/b.txt", docs[2])
    local tok = T.train_text({docs[1] .. docs[2]}, {vocab_size = 280, special_tokens = {EOT}})
    tok:save(dir .. "/tok.json")
    local _, err, status = tokenize({a, b, "--tokenizer", dir .. "/tok.json", "--out", dir .. "/ab.npy",
      "--val", b, "--quiet"})
    assert.are.equal(0, status, err)
    assert.same(expected(tok, docs, 1, 2), ids_of(dir .. "/ab.npy"))
    assert.same(tok:encode(docs[2]), ids_of(dir .. "/ab.val.npy"))
    _, err, status = tokenize({a, "--tokenizer", dir .. "/tok.json", "--out", dir .. "/a.npy", "--quiet"})
    assert.are.equal(0, status, err)
    assert.same(tok:encode(docs[1]), ids_of(dir .. "/a.npy"))
  end)

  it("splits at blank lines with --doc-sep blank", function()
    local dir = H.tmpdir()
    local input = H.spit(dir .. "/in.txt", "para one\nline two\n\n\npara two\n  \npara three\n")
    local tok = T.train_text({"para one line two"}, {vocab_size = 270, special_tokens = {EOT}})
    tok:save(dir .. "/tok.json")
    local _, err, status = tokenize({input, "--tokenizer", dir .. "/tok.json", "--doc-sep", "blank",
      "--out", dir .. "/p.npy", "--quiet"})
    assert.are.equal(0, status, err)
    assert.same(expected(tok, {"para one\nline two\n", "para two\n", "para three\n"}, 1, 3), ids_of(dir .. "/p.npy"))
  end)

  it("says what is wrong: no tokenizer, a tokenizer without the end-of-text token, no validation document", function()
    local dir = H.tmpdir()
    local input = H.spit(dir .. "/in.txt", "one document only\n")
    local _, err, status = tokenize({input, "--out", dir .. "/x.npy"})
    assert.are.equal(2, status)
    assert.are.equal("tokenize.lua: expected exactly one of --tokenizer FILE, --vocab FILE --merges FILE, " ..
      "--train-tokenizer FILE\n", err)
    local tok = T.train_text({"one document only"}, {vocab_size = 260})
    tok:save(dir .. "/tok.json")
    _, err, status = tokenize({input, input, "--tokenizer", dir .. "/tok.json", "--out", dir .. "/x.npy"})
    assert.are.equal(1, status)
    assert.truthy(err:find('the tokenizer has no special token "<|endoftext|>" to put between documents', 1, true),
      err)
    _, err, status = tokenize({input, "--train-tokenizer", dir .. "/t2.json", "--vocab-size", "260",
      "--val-fraction", "0.5", "--out", dir .. "/x.npy", "--quiet"})
    assert.are.equal(1, status)
    assert.truthy(err:find("--val-fraction 0.5 left no document for validation (1 in all)", 1, true), err)
    assert.is_nil(H.slurp(dir .. "/x.npy"))                      -- nothing half-written
  end)
end)
