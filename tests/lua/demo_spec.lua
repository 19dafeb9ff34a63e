-- examples/demo.lua (make demo's job) end to end on a small fortune folder:
-- corpus split, tokenizer, tokens, a few training steps, samples; a second
-- run reuses the finished run; bad options are refused.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

-- runs the demo in a child process (CUDA hidden: the CPU sizes); returns its
-- stdout and stderr together, and the exit status
local function demo(args)
  local out, err, code = H.ember({"run", "examples/demo.lua", table.unpack(args)},
    {env = {CUDA_VISIBLE_DEVICES = ""}})
  return out .. err, code
end

-- a fortune folder as Debian ships it: files of '%'-separated fortunes
local function fortunes()
  local dir = H.tmpdir()
  local words = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "from", "home",
    "never", "trust", "computer", "you", "can't", "see", "love", "is", "all", "wise", "man", "said"}
  local seed = 7
  local function rand(n) seed = (seed * 1103515245 + 12345) % 2147483648 return seed % n + 1 end
  for _, name in ipairs({"fortunes", "computers"}) do
    local f = assert(io.open(dir .. "/" .. name, "wb"))
    for i = 1, 1200 do
      local w = {}
      for k = 1, 6 + rand(20) do w[k] = words[rand(#words)] end
      f:write(table.concat(w, " "), ".\n", i % 3 == 0 and "\t\t-- someone\n" or "", "%\n")
    end
    f:close()
  end
  return dir
end

describe("examples/demo.lua", function()
  after_each(H.remove_temps)

  it("tokenizes, trains, checkpoints and samples, then reuses the finished run", function()
    local corpus, out = fortunes(), H.tmpdir()
    local flags = {"--device", "cpu", "--steps", "2", "--samples", "1", "--corpus", corpus, "--out", out}
    local text, code = demo(flags)
    assert.are.equal(0, code, text)
    assert.matches("corpus: 2400 fortunes from 2 files", text, 1, true)
    assert.matches("2280 for training, 120 for validation", text, 1, true)
    assert.matches("tokenizer: byte%-level BPE, %d+ tokens", text)
    assert.matches("train: done, step 2", text, 1, true)
    assert.matches("--- sample 1", text, 1, true)
    for _, f in ipairs({"tok.json", "train.npy", "val.npy", "run/log.jsonl", "run/loss.svg", "run/checkpoints/latest"}) do
      assert.is_truthy(H.slurp(out .. "/" .. f), f)
    end
    -- the validation split is every 20th fortune: no training document in it
    local n_val = select(2, H.slurp(out .. "/val.txt"):gsub("<|endoftext|>", ""))
    assert.are.equal(120, n_val)

    local again, code2 = demo(flags)
    assert.are.equal(0, code2, again)
    assert.matches("found in", again, 1, true)
    assert.matches("nothing to do", again, 1, true)
    assert.matches("--- sample 1", again, 1, true)
  end)

  it("refuses a missing corpus and bad options with one clear line", function()
    local out = H.tmpdir()
    local text, code = demo({"--device", "cpu", "--corpus", out .. "/none", "--out", out})
    assert.are_not.equal(0, code)
    assert.matches("demo: no text found in " .. out .. "/none", text, 1, true)
    text, code = demo({"--device", "tpu", "--out", out})
    assert.are_not.equal(0, code)
    assert.matches("expected cpu or cuda, got tpu", text, 1, true)
    text, code = demo({"--steps", "0", "--device", "cpu", "--out", out})
    assert.are_not.equal(0, code)
    assert.matches("--steps: expected a positive integer", text, 1, true)
  end)
end)
