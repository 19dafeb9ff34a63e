-- checkpoint_spec.lua — ember.checkpoint: the folder layout other tools read
-- (model.safetensors with config/step metadata, tokenizer.json), atomic
-- replacement, run folders with checkpoints/latest, load_model.
local ember = require "ember"
local cjson = require "cjson"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local ckpt = ember.checkpoint
local nn, optim, F = ember.nn, ember.optim, ember.nn.functional

local function tiny()
  ember.manual_seed(1)
  local cfg = nn.configs.tiny{vocab_size = 50, context_length = 16}
  return nn.TransformerLM(cfg), cfg
end

-- a model and an optimizer one step in, so the optimizer has state
local function trained()
  local model, cfg = tiny()
  local opt = optim.AdamW(model:parameters(), {lr = 1e-2})
  local x = ember.randint(0, 50, {2, 9})
  F.cross_entropy(model(x:narrow(1, 0, 8)), x:narrow(1, 1, 8)):backward()
  opt:step()
  return model, cfg, opt, x:narrow(1, 0, 8)
end

describe("ember.checkpoint", function()
  after_each(function() H.remove_temps() end)

  it("writes model.safetensors with the TransformerLM config and step as metadata, and reads it back", function()
    local model, cfg, opt, x = trained()
    local dir = H.tmpdir() .. "/ck"
    ckpt.write(dir, {model = model, config = cfg, step = 3, optimizer = opt:state_dict(),
      state = {lr = 0.1 + 0.2, big = "9007199254740993", n = 7}})
    local sd, meta = ember.load(dir .. "/model.safetensors")
    assert.are.equal("3", meta.step)
    local mc = cjson.decode(meta.config)
    local keys = {}
    for k in pairs(mc) do keys[#keys + 1] = k end
    table.sort(keys)
    assert.same({"context_length", "d_ff", "d_model", "num_heads", "num_layers", "rope_theta", "vocab_size"}, keys)
    for _, k in ipairs(ckpt.CONFIG_KEYS) do assert.are.equal(cfg[k], mc[k], k) end
    for name, t in pairs(model:state_dict()) do assert.same(t:tolist(), sd[name]:tolist(), name) end

    local c = ckpt.load(dir)
    assert.are.equal(3, c.step)
    assert.are.equal(0.1 + 0.2, c.state.lr)                -- all the digits (cjson writes 14)
    assert.are.equal("9007199254740993", c.state.big)
    assert.are.equal(7, c.state.n)
    assert.are.equal(1, c.optimizer.state[1].step)
    assert.is_nil(c.tokenizer)

    local rng = ember.get_rng_state()
    local m2, cfg2, meta2 = ckpt.load_model(dir)
    assert.same(rng, ember.get_rng_state())             -- building the model drew its init: restored
    assert.are.equal("3", meta2.step)
    assert.are.equal(cfg.d_model, cfg2.d_model)
    assert.are.equal(0, H.maxdiff(model(x), m2(x)))
  end)

  it("copies the tokenizer (a tokenizer.json path or an ember.tokenizer)", function()
    local model, cfg = tiny()
    local dir = H.tmpdir()
    local json = H.temp_file('{"not": "checked here"}', ".json")
    ckpt.write(dir .. "/a", {model = model, config = cfg, step = 0, tokenizer = json})
    assert.are.equal('{"not": "checked here"}', H.slurp(dir .. "/a/tokenizer.json"))
    if ember.tokenizer.available() then
      local tok = ember.tokenizer.train_text({"a b a b c"}, {vocab_size = 260})
      ckpt.write(dir .. "/b", {model = model, config = cfg, step = 0, tokenizer = tok})
      assert.are.equal(tok:vocab_size(), ember.tokenizer.load(ckpt.load(dir .. "/b").tokenizer):vocab_size())
    end
  end)

  it("replaces a folder only once the new one is complete; a failed write leaves the old one", function()
    local model, cfg = tiny()
    local dir = H.tmpdir() .. "/ck"
    ckpt.write(dir, {model = model, config = cfg, step = 1})
    ckpt.write(dir, {model = model, config = cfg, step = 2})
    assert.are.equal(2, ckpt.load(dir).step)
    assert.is_false(ckpt.exists(dir .. ".tmp"))
    assert.is_false(ckpt.exists(dir .. ".old"))
    assert.has_error(function()
      ckpt.write(dir, {model = model, config = cfg, step = 3, tokenizer = "/nonexistent/tok.json"})
    end, "ember.checkpoint.write: cannot read the tokenizer '/nonexistent/tok.json'")
    assert.are.equal(2, ckpt.load(dir).step)
    assert.is_false(ckpt.exists(dir .. ".tmp"))
  end)

  it("keeps run folders as checkpoints/step_N with latest, pruning all but `keep`", function()
    local model, cfg = tiny()
    local run = H.tmpdir()
    for step = 1, 3 do ckpt.save_run(run, step, {model = model, config = cfg}, {keep = 2}) end
    assert.same({"step_00000002", "step_00000003"}, ckpt.list(run))
    assert.are.equal(run .. "/checkpoints/step_00000003", ckpt.latest(run))
    assert.are.equal(run .. "/checkpoints/step_00000003", ckpt.resolve(run))
    assert.are.equal(3, ckpt.load(run).step)
    local dir4 = ckpt.save_run(run, 4, {model = model, config = cfg})   -- keep = 1 by default
    assert.same({"step_00000004"}, ckpt.list(run))
    assert.are.equal(dir4, ckpt.run_step_dir(run, 4))   -- what other ranks name without being told
    assert(os.execute("mkdir -p " .. H.q(run .. "/checkpoints/step_00000009.tmp")))   -- a killed write
    ckpt.save_run(run, 5, {model = model, config = cfg}, {keep = 0})
    assert.same({"step_00000004", "step_00000005"}, ckpt.list(run))
    assert.is_false(ckpt.exists(run .. "/checkpoints/step_00000009.tmp"))
  end)

  it("says what it looked for when a folder is not a checkpoint", function()
    local empty = H.tmpdir()
    assert.has_error(function() ckpt.load_model(empty) end,
      "ember.checkpoint.load_model: expected a checkpoint folder (with model.safetensors) or a run folder " ..
      "(with checkpoints/latest), got '" .. empty .. "'")
    assert.error_matches(function() ckpt.load_model(empty, {devcie = "cpu"}) end,
      "ember.checkpoint.load_model: unknown option 'devcie' (expected: device, dtype)", 1, true)
    local model = tiny()
    assert.has_error(function() ckpt.write(empty .. "/x", {model = model, config = {}, step = 1}) end,
      "ember.checkpoint: expected config.vocab_size to be a number, got nil")
  end)
end)
