-- train_spec.lua — scripts/train.lua and ember.trainer on the CPU: a resumed
-- run equals a straight one bit for bit, Ctrl-C writes a checkpoint that
-- resumes, options from a config file and flags, gradient accumulation.
-- A tiny model on a few thousand random tokens: each run is a fraction of a second.
local ember = require "ember"
local cjson = require "cjson"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local trainer, ckpt = ember.trainer, ember.checkpoint

local VOCAB = 64

-- train.npy / val.npy of random ids in a fresh folder
local function corpus()
  local dir = H.tmpdir()
  ember.manual_seed(123)
  ember.save_npy(dir .. "/train.npy", ember.randint(0, VOCAB, {6000}):to("u16"))
  ember.save_npy(dir .. "/val.npy", ember.randint(0, VOCAB, {1500}):to("u16"))
  return dir
end

local function common(dir)
  return {"--train", dir .. "/train.npy", "--val", dir .. "/val.npy", "--vocab", tostring(VOCAB), "--model", "tiny",
          "--context", "16", "--batch", "3", "--grad-accum", "2", "--lr", "3e-3", "--eval-every", "4",
          "--log-every", "3"}
end

local function train(args, opts)
  local argv = {"run", "scripts/train.lua"}
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  return H.ember(argv, opts)
end

local function cat(a, b)
  local out = {}
  for _, x in ipairs(a) do out[#out + 1] = x end
  for _, x in ipairs(b) do out[#out + 1] = x end
  return out
end

-- {step = record} of the per-step lines of a run's log (eval lines left out)
local function steps_of(run)
  local by = {}
  for line in H.slurp(run .. "/log.jsonl"):gmatch("[^\n]+") do
    local r = cjson.decode(line)
    if r.loss then
      assert.is_nil(by[r.step], "step " .. r.step .. " logged twice")
      by[r.step] = r
    end
  end
  return by
end

describe("scripts/train.lua", function()
  after_each(function() H.remove_temps() end)

  it("resumes bit for bit: 10 steps straight equal 5 steps, --resume, 5 more", function()
    local dir = corpus()
    local a, b = dir .. "/a", dir .. "/b"
    local _, err, status = train(cat(common(dir), {"--steps", "10", "--ckpt-every", "4", "--out", a}))
    assert.are.equal(0, status, err)
    -- the same schedule (--decay-steps 10), stopped at 5
    _, err, status = train(cat(common(dir), {"--steps", "5", "--decay-steps", "10", "--ckpt-every", "4", "--out", b}))
    assert.are.equal(0, status, err)
    local out
    out, err, status = train({"--resume", b, "--steps", "10"})
    assert.are.equal(0, status, err)
    assert.truthy(out:find("resumed from " .. b .. "/checkpoints/step_00000005 at step 5", 1, true), out)

    local sa, sb = steps_of(a), steps_of(b)
    for step = 1, 10 do
      assert.is_table(sb[step], "step " .. step .. " missing from the resumed run's log")
      assert.are.equal(sa[step].loss, sb[step].loss, "loss of step " .. step)   -- exact: all digits logged
      assert.are.equal(sa[step].lr, sb[step].lr, "lr of step " .. step)
      assert.are.equal(sa[step].grad_norm, sb[step].grad_norm, "grad norm of step " .. step)
    end
    for _, f in ipairs({"model.safetensors", "optimizer.safetensors"}) do
      local fa, fb = H.slurp(a .. "/checkpoints/step_00000010/" .. f), H.slurp(b .. "/checkpoints/step_00000010/" .. f)
      assert.is_string(fa, f)
      assert.is_true(fa == fb, f .. " differs between the straight and the resumed run")
    end
    -- and training did something: the loss moved
    assert.are_not.equal(sa[1].loss, sa[10].loss)
    assert.is_string(H.slurp(b .. "/loss.svg"))
  end)

  it("--overlap-optimizer gives the bits of the plain step (clip 0 and exact clip); --clip-mode previous differs", function()
    local dir = corpus()
    local function run(out, extra)
      local _, err, status = train(cat(cat(common(dir), {"--steps", "6", "--out", dir .. "/" .. out}), extra))
      assert.are.equal(0, status, err)
      return steps_of(dir .. "/" .. out)
    end
    for _, clip in ipairs {"0", "0.05"} do
      local plain = run("p" .. clip, {"--clip", clip})
      local over = run("o" .. clip, {"--clip", clip, "--overlap-optimizer"})
      for step = 1, 6 do
        assert.are.equal(plain[step].loss, over[step].loss, "loss of step " .. step .. ", clip " .. clip)
        assert.are.equal(plain[step].grad_norm, over[step].grad_norm, "norm of step " .. step .. ", clip " .. clip)
      end
    end
    local exact = run("e", {"--clip", "0.05", "--overlap-optimizer"})
    local prev = run("v", {"--clip", "0.05", "--overlap-optimizer", "--clip-mode", "previous"})
    -- step 1 clips by its own norm in both (summed in another order: per-parameter f32 slots)
    assert.is_true(math.abs(exact[1].grad_norm - prev[1].grad_norm) <= 1e-6 * exact[1].grad_norm,
      exact[1].grad_norm .. " vs " .. prev[1].grad_norm)
    assert.are_not.equal(exact[3].loss, prev[3].loss)       -- then by the previous step's
  end)

  it("on Ctrl-C finishes the step, writes a checkpoint, says how to resume, and the resume continues", function()
    local dir = corpus()
    local run = dir .. "/run"
    local argv = {"run", "scripts/train.lua"}
    for _, a in ipairs(cat(common(dir), {"--steps", "100000", "--log-every", "1", "--out", run})) do
      argv[#argv + 1] = H.q(a)
    end
    local outf = H.temp()
    -- start, wait for step 3 in the log (at most 60 s), SIGINT, wait for the exit status
    local p = io.popen(("env -u LUA_INIT %s %s >%s 2>&1 & pid=$!; i=0; " ..
      "while [ $i -lt 600 ] && ! grep -q '\"step\":3,' %s 2>/dev/null; do sleep 0.1; i=$((i+1)); done; " ..
      "kill -INT $pid; wait $pid; echo $?"):format(H.q(H.EMBER), table.concat(argv, " "), H.q(outf),
      H.q(run .. "/log.jsonl")))
    local status = tonumber(p:read("l"))
    p:close()
    local out = H.slurp(outf)
    assert.are.equal(130, status, out)
    local stopped = tonumber(out:match("interrupted at step (%d+) %(Ctrl%-C%)"))
    assert.is_number(stopped, out)
    assert.truthy(out:find("resume with: ember run scripts/train.lua --resume " .. run, 1, true), out)
    assert.is_nil(out:find("stack traceback", 1, true), out)

    local model, cfg, meta = ckpt.load_model(run)
    assert.are.equal(tostring(stopped), meta.step)
    assert.are.equal(VOCAB, cfg.vocab_size)
    assert.are.equal(16, cfg.context_length)
    local logits = model(ember.randint(0, VOCAB, {1, 16}))
    assert.same({1, 16, VOCAB}, logits.shape)

    local _, err
    _, err, status = train({"--resume", run, "--steps", tostring(stopped + 2), "--log-every", "1"})
    assert.are.equal(0, status, err)
    local s = steps_of(run)
    for step = 1, stopped + 2 do assert.is_table(s[step], "step " .. step .. " missing") end
    assert.is_nil(s[stopped + 3])
    assert.are.equal(string.format("step_%08d", stopped + 2), H.slurp(run .. "/checkpoints/latest"):match("%S+"))
  end)

  it("refuses bad options with exit status 2 and one line", function()
    local dir = corpus()
    local _, err, status = train(cat(common(dir), {"--steps", "0"}))
    assert.are.equal(2, status)
    assert.are.equal("train.lua: expected steps >= 1, got 0\n", err)
    _, err, status = train({"--vocab", "64"})
    assert.are.equal(2, status)
    assert.are.equal("train.lua: expected train = a .npy of token ids (--train FILE)\n", err)
    local out
    out, _, status = train({"--help"})
    assert.are.equal(0, status)
    for _, flag in ipairs({"--resume", "--grad-accum", "--graph", "--ddp", "--zero", "--config", "--eval-every"}) do
      assert.truthy(out:find(flag, 1, true), flag)
    end
  end)
end)

describe("ember.trainer", function()
  after_each(function() H.remove_temps() end)

  it("takes options from a JSON or Lua config file, flags over the file", function()
    local dir = corpus()
    local json = H.temp_file(cjson.encode({train = dir .. "/train.npy", vocab = VOCAB, model = "tiny",
      ["grad-accum"] = 3, steps = 50, lr = 1e-3}), ".json")
    local cfg = trainer.resolve({config = json, steps = 7})
    assert.are.equal(7, cfg.steps)
    assert.are.equal(3, cfg.grad_accum)
    assert.are.equal(1e-3, cfg.lr)
    assert.are.equal(1e-3 / 10, cfg.min_lr)          -- derived
    assert.are.equal(64, cfg.d_model)                 -- from the tiny preset
    local lua = H.temp_file(("return {train = %q, vocab = %d, model = 'tiny', batch = 5}"):format(
      dir .. "/train.npy", VOCAB), ".lua")
    assert.are.equal(5, trainer.resolve({config = lua}).batch)
    assert.has_error(function() trainer.resolve({config = H.temp_file('{"stpes": 3}', ".json")}) end)
    assert.error_matches(function() trainer.resolve({config = H.temp_file('{"stpes": 3}', ".json")}) end,
      "unknown option 'stpes'", 1, true)
    assert.error_matches(function() trainer.resolve({train = "x.npy", vocab = VOCAB, batch = "many"}) end,
      "ember.trainer: options: expected batch to be an integer, got many", 1, true)
  end)

  it("keeps a resumed run's model and refuses to start over a run folder", function()
    local dir = corpus()
    local run = dir .. "/run"
    trainer.run({train = dir .. "/train.npy", vocab = VOCAB, model = "tiny", context = 8, batch = 2, steps = 2,
      out = run, quiet = true})
    assert.error_matches(function() trainer.resolve({resume = run, d_model = 32}) end,
      "ember.trainer: a resumed run keeps its model: d_model is 64 in '" .. run ..
      "/checkpoints/step_00000002', got 32", 1, true)
    assert.error_matches(function()
      trainer.run({train = dir .. "/train.npy", vocab = VOCAB, model = "tiny", context = 8, batch = 2, steps = 2,
        out = run, quiet = true})
    end, "already holds a run", 1, true)
  end)

  it("reports the validation loss of the last step in its summary, taken once", function()
    local dir = corpus()
    local s = trainer.run({train = dir .. "/train.npy", val = dir .. "/val.npy", vocab = VOCAB, model = "tiny",
      context = 8, batch = 2, steps = 4, eval_every = 2, eval_batches = 2, out = dir .. "/run", quiet = true})
    local evals = {}
    for line in io.lines(dir .. "/run/log.jsonl") do
      local r = cjson.decode(line)
      if r.val_loss then evals[#evals + 1] = r end
    end
    assert.are.equal(2, #evals)                 -- steps 2 and 4; no second evaluation at the end
    assert.are.equal(4, evals[2].step)
    assert.are.equal(evals[2].val_loss, s.val_loss)
  end)

  it("accumulates gradients: 2 micro-batches of 4 train as one batch of 8 (the same windows)", function()
    -- Philox gives 4 draws per counter block, so two draws of 4 starts take
    -- the numbers one draw of 8 takes: the same windows in the same order
    local dir = corpus()
    local function run(batch, accum, out)
      trainer.run({train = dir .. "/train.npy", vocab = VOCAB, model = "tiny", context = 16, batch = batch,
        grad_accum = accum, steps = 4, lr = 3e-3, log_every = 2, out = dir .. "/" .. out, quiet = true})
      return steps_of(dir .. "/" .. out)
    end
    local one, two = run(8, 1, "one"), run(4, 2, "two")
    for step = 1, 4 do
      -- the same data and the same mean; only the order of the f32 sums differs
      H.assert_close({two[step].loss}, {one[step].loss}, 1e-5, 0, "loss of step " .. step)
      H.assert_close({two[step].grad_norm}, {one[step].grad_norm}, 1e-4, 0, "grad norm of step " .. step)
    end
    assert.are_not.equal(one[1].loss, one[4].loss)
  end)
end)
