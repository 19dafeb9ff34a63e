-- generate_script_spec.lua — a checkpoint folder in train.lua's layout
-- (model.safetensors with `config` JSON and `step` metadata, tokenizer.json),
-- built here from a tokenizer and a tiny model trained on a short text, read
-- back by ember.generate.load, and scripts/generate.lua run on it end to end.
local ember = require "ember"
local cjson = require "cjson"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local nn, F, optim = ember.nn, ember.nn.functional, ember.optim

local SCRIPT = "scripts/generate.lua"
local TEXT = "the quick brown fox jumps over the lazy dog. a bird sings in the old tree by the river. "
local have_tok = ember.tokenizer.available()

-- A tokenizer and a TransformerLM that has learnt TEXT by heart (60 AdamW
-- steps, well under a second), saved in train.lua's layout into dir.
local function build_checkpoint(dir)
  local tok = ember.tokenizer.train_text({TEXT:rep(4)}, {vocab_size = 300, special_tokens = {"<|endoftext|>"}})
  local tokens = ember.tensor(tok:encode(TEXT:rep(20)), {dtype = "i64"})
  ember.manual_seed(0)
  local cfg = {vocab_size = tok:vocab_size(), context_length = 32, d_model = 32, d_ff = 64, num_layers = 2,
    num_heads = 2, rope_theta = 10000}
  local model = nn.TransformerLM(cfg)
  local opt = optim.AdamW(model:parameters(), {lr = 1e-2, weight_decay = 0})
  for _ = 1, 60 do
    local x, y = ember.data.get_batch(tokens, 8, 24)
    opt:zero_grad()
    F.cross_entropy(model(x), y):backward()
    opt:step()
  end
  ember.save(dir .. "/model.safetensors", model:state_dict(), {metadata = {config = cjson.encode(cfg), step = 60}})
  tok:save(dir .. "/tokenizer.json")
  return model, tok
end

local function run(args)
  local argv = {"run", SCRIPT}
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  return H.ember(argv)
end

describe("a checkpoint in train.lua's layout", function()
  local dir, model, tok
  lazy_setup(function()
    if not have_tok then return end
    dir = H.tmpdir()
    model, tok = build_checkpoint(dir)
  end)
  lazy_teardown(function() H.remove_temps() end)

  local function it_tok(name, fn)
    if have_tok then it(name, fn) else pending(name .. " (this build has no tokenizer: PCRE2 missing)") end
  end

  it_tok("loads back with ember.generate.load: the same weights, the tokenizer and the step", function()
    local m2, tok2, meta = ember.generate.load(dir)
    assert.are.equal(60, meta.step)
    assert.are.equal(32, meta.config.context_length)
    local sd = model:state_dict()
    for name, t in pairs(m2:state_dict()) do
      assert.are.equal(0, H.maxdiff(t, sd[name]), name)
    end
    assert.are.same(tok:encode(TEXT), tok2:encode(TEXT))
    assert.are.equal(tok:id_of("<|endoftext|>"), tok2:id_of("<|endoftext|>"))
  end)

  it_tok("continues a prompt from the text it learnt (greedy), as loaded", function()
    local m2, tok2 = ember.generate.load(dir)
    local text, info = ember.generate(m2, tok2, "the quick brown", {max_tokens = 12, temperature = 0})
    assert.are.equal(" fox jumps over the lazy dog.", text:sub(1, 29))
    assert.are.equal("length", info.finish_reason)
  end)

  it_tok("loads bf16 weights on request", function()
    local m2 = ember.generate.load(dir, {dtype = "bf16"})
    assert.are.equal("bf16", m2.lm_head.weight.dtype)
    local text = ember.generate(m2, tok, "a bird sings", {max_tokens = 4, temperature = 0})
    assert.are.equal(" in the old", text:sub(1, 11))
  end)

  it_tok("loads a train.lua run folder: its latest checkpoint", function()
    local run = H.tmpdir()
    assert(os.execute(("mkdir -p %s/checkpoints && cp -r %s %s/checkpoints/step_00000007 && " ..
      "echo step_00000007 > %s/checkpoints/latest"):format(H.q(run), H.q(dir), H.q(run), H.q(run))))
    local m2, tok2 = ember.generate.load(run)
    assert.are.equal(tok:vocab_size(), tok2:vocab_size())
    local a = ember.generate(m2, tok2, "a bird", {max_tokens = 6, temperature = 0})
    assert.are.equal(ember.generate(model, tok, "a bird", {max_tokens = 6, temperature = 0}), a)
  end)

  it_tok("refuses a folder without a model, or a model without its config, naming the file", function()
    local ok, err = pcall(ember.generate.load, dir .. "/nowhere")
    assert.is_false(ok)
    assert.are.equal(("ember.generate.load: expected a checkpoint folder (with model.safetensors) or a run " ..
      "folder (with checkpoints/latest), got '%s/nowhere'"):format(dir), H.strip_where(err))
    local bare = H.tmpdir()
    ember.save(bare .. "/model.safetensors", model:state_dict())
    ok, err = pcall(ember.generate.load, bare)
    assert.is_false(ok)
    assert.are.equal(("ember.generate.load: %s/model.safetensors has no 'config' metadata (the TransformerLM " ..
      "config as JSON)"):format(bare), H.strip_where(err))
    ok, err = pcall(ember.generate.load, dir, {device = "cpu", precision = "bf16"})
    assert.is_false(ok)
    assert.are.equal("ember.generate.load: unknown option 'precision' (expected device, dtype, tokenizer, attn_impl)",
      H.strip_where(err))
  end)

  it_tok("scripts/generate.lua streams the prompt and ember.generate's continuation, tokens/s on stderr", function()
    local want = ember.generate(model, tok, "a bird", {max_tokens = 10, temperature = 0})
    local out, err, status = run({"--checkpoint", dir, "--prompt", "a bird", "--max-tokens", "10",
      "--temperature", "0", "--device", "cpu"})
    assert.are.equal(0, status, err)
    assert.are.equal("a bird" .. want .. "\n", out)
    assert.matches("loaded .* step 60, .*vocab 300, context 32", err)
    assert.matches("sample 1: 10 tokens %(length%); prefill %d+ tokens in [%d.]+ ms %(%d+ tok/s%); " ..
      "decode 9 tokens in [%d.]+ ms %(%d+ tok/s%)", err)
  end)

  it_tok("scripts/generate.lua: several seeded samples, a stop string, --no-cache", function()
    local out, err, status = run({"--checkpoint", dir, "--prompt", "the", "--max-tokens", "12",
      "--temperature", "1", "--top-k", "5", "--top-p", "0.9", "--seed", "7", "--num-samples", "2",
      "--device", "cpu"})
    assert.are.equal(0, status, err)
    local s1 = ember.generate(model, tok, "the", {max_tokens = 12, temperature = 1, top_k = 5, top_p = 0.9, seed = 7})
    local s2 = ember.generate(model, tok, "the", {max_tokens = 12, temperature = 1, top_k = 5, top_p = 0.9, seed = 8})
    assert.are.equal("--- sample 1 (seed 7)\nthe" .. s1 .. "\n--- sample 2 (seed 8)\nthe" .. s2 .. "\n", out)
    out, err, status = run({"--checkpoint", dir, "--prompt", "the quick", "--temperature", "0", "--stop", "lazy",
      "--no-cache", "--device", "cpu"})
    assert.are.equal(0, status, err)
    assert.are.equal("the quick brown fox jumps over the \n", out)
    assert.matches("%(stop%).*no KV cache", err)
  end)

  it_tok("scripts/generate.lua refuses bad options with exit status 2 and a message", function()
    local cases = {
      {{"--prompt", "x"}, "generate.lua: --checkpoint DIR is required"},
      {{"--checkpoint", dir, "--top-p", "0"}, "generate.lua: --top-p must be in (0, 1]"},
      {{"--checkpoint", dir, "--max-tokens=-3"}, "generate.lua: --max-tokens must be an integer >= 0"},
      {{"--checkpoint", dir, "--device", "tpu"}, "generate.lua: --device must be cpu, cuda or cuda:N, got 'tpu'"},
      {{"--checkpoint", dir .. "/missing", "--device", "cpu"}, "generate.lua: ember.generate.load: expected a checkpoint folder (with model.safetensors) or a run folder"},
      {{"--checkpoint", dir, "--device", "cpu", "--prompt", TEXT:rep(3)}, "the prompt has"},
    }
    for _, c in ipairs(cases) do
      local _, err, status = run(c[1])
      assert.are_not.equal(0, status, c[2])
      assert.matches(c[2], err, 1, true)
    end
    local out, _, status = run({"--help"})
    assert.are.equal(0, status)
    for _, flag in ipairs({"--checkpoint", "--tokenizer", "--prompt", "--max-tokens", "--temperature", "--top-k",
        "--top-p", "--seed", "--device", "--precision", "--num-samples", "--no-graph", "--stop"}) do
      assert.matches(flag, out, 1, true)
    end
  end)
end)
