-- train_spec.lua (GPU) — ember.trainer on CUDA: a resumed run equals a
-- straight one bit for bit (f32 and bf16 autocast, eager and with the step
-- captured as a CUDA graph), the graph replays train as the eager steps do,
-- and ember.data.Loader feeds the GPU through pinned memory the CPU's batches.
local ember = require "ember"
local cjson = require "cjson"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../lua/helpers.lua")

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local VOCAB, STEPS = 512, 8

local function corpus()
  local dir = H.tmpdir()
  ember.manual_seed(7)
  ember.save_npy(dir .. "/train.npy", ember.randint(0, VOCAB, {50000}):to("u16"))
  ember.save_npy(dir .. "/val.npy", ember.randint(0, VOCAB, {5000}):to("u16"))
  return dir
end

local function run(dir, name, extra)
  local o = {train = dir .. "/train.npy", val = dir .. "/val.npy", vocab = VOCAB, model = "tiny", context = 64,
    batch = 8, steps = STEPS, lr = 3e-3, log_every = 3, eval_every = 4, ckpt_every = 0, device = "cuda",
    out = dir .. "/" .. name, quiet = true}
  for k, v in pairs(extra or {}) do o[k] = v end
  return ember.trainer.run(o)
end

local function losses(run_dir)
  local out = {}
  for line in io.lines(run_dir .. "/log.jsonl") do
    local r = cjson.decode(line)
    if r.loss then out[r.step] = r.loss end
  end
  return out
end

local function same_run(a, b, what)
  local la, lb = losses(a), losses(b)
  for step = 1, STEPS do
    assert.is_number(lb[step], what .. ": step " .. step .. " missing")
    assert.are.equal(la[step], lb[step], ("%s: loss of step %d"):format(what, step))
  end
  local f = ("/checkpoints/step_%08d/"):format(STEPS)
  for _, file in ipairs({"model.safetensors", "optimizer.safetensors"}) do
    assert.is_true(H.slurp(a .. f .. file) == H.slurp(b .. f .. file), what .. ": " .. file .. " differs")
  end
  assert.are_not.equal(la[1], la[STEPS], what .. ": the loss did not move")
end

describe("ember.trainer on CUDA", function()
  after_each(function() H.remove_temps() end)

  for _, precision in ipairs({"f32", "bf16"}) do
    it("resumes bit for bit in " .. precision .. ": 8 steps straight equal 4, resume, 4", function()
      local dir = corpus()
      run(dir, "straight", {precision = precision, grad_accum = 2})
      run(dir, "split", {precision = precision, grad_accum = 2, steps = STEPS // 2, decay_steps = STEPS})
      ember.trainer.run({resume = dir .. "/split", steps = STEPS, quiet = true})
      same_run(dir .. "/straight", dir .. "/split", precision)
    end)
  end

  it("with graph = true replays train as eager steps and resume bit for bit (grad accumulation 2)", function()
    local dir = corpus()
    run(dir, "eager", {precision = "bf16", grad_accum = 2})
    run(dir, "graph", {precision = "bf16", grad_accum = 2, graph = true})
    same_run(dir .. "/eager", dir .. "/graph", "graph vs eager")
    run(dir, "gsplit", {precision = "bf16", grad_accum = 2, graph = true, steps = 3, decay_steps = STEPS})
    ember.trainer.run({resume = dir .. "/gsplit", steps = STEPS, quiet = true})
    same_run(dir .. "/graph", dir .. "/gsplit", "graph resumed")
  end)
end)

describe("ember.data.Loader on CUDA", function()
  it("stages the CPU's batches through pinned memory into the device slots", function()
    local tokens = ember.randint(0, 50257, {100000}):to("u16")
    for _, order in ipairs({"random", "sequential"}) do
      local cpu = ember.data.Loader(tokens, {batch = 16, context = 128, seed = 3, order = order})
      local gpu = ember.data.Loader(tokens, {batch = 16, context = 128, seed = 3, order = order, device = "cuda",
        slots = 2})
      assert.is_true(gpu.pinned ~= nil and gpu.pinned[1]:is_pinned())
      for i = 1, 7 do                     -- more calls than pinned buffers: each is reused after its copy ran
        local xc, yc = cpu:next()
        local xg, yg = gpu:next()
        assert.are.equal("cuda:0", xg.device)
        assert.same(xc:tolist(), xg:cpu():tolist(), order .. " x, batch " .. i)
        assert.same(yc:tolist(), yg:cpu():tolist(), order .. " y, batch " .. i)
      end
    end
  end)
end)
