-- launch_interrupt_spec.lua — Ctrl-C under `ember launch`, sent as a
-- terminal sends it (SIGINT to the launcher; mpirun runs in its own process
-- group, so only the launcher gets it). The launcher passes the first one on
-- to every rank (their pids in EMBER_LAUNCH_DIR/rank<R>.pid): a training run
-- ends the step the ranks agree on, writes its checkpoint and every rank
-- exits 0; the launcher exits 130. A second Ctrl-C stops mpirun and the ranks.
--
-- Not in tests/dist: those specs *are* the ranks of a launch, and this one
-- has to stand outside one to signal it. Run from the repository root:
--   EMBER_BUILD=$PWD/build-cpu build-cpu/ember run $(command -v busted) tests/lua/launch_interrupt_spec.lua
-- Robust on a loaded machine: every wait polls for what it waits for (ranks
-- ready, log lines written) with a deadline of minutes, never a fixed sleep.

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local EMBER = H.EMBER
local q, temp = H.q, H.temp_file
local DEADLINE_S = 180

local function launching(name, fn)
  if H.have("mpirun") then it(name, fn) else pending(name .. " (no mpirun on PATH)") end
end

local function sleep(s) os.execute("sleep " .. s) end

--- Poll cond() every 0.1 s until it is true; an error naming `what` after DEADLINE_S.
local function wait_for(what, cond, job)
  local t0 = os.time()
  while not cond() do
    if os.time() - t0 > DEADLINE_S then
      if job then os.execute("kill -KILL " .. job.pid .. " 2>/dev/null") end
      error(("waited %d s for %s; launcher output:\n%s"):format(DEADLINE_S, what,
        job and H.slurp(job.out) or "?"), 2)
    end
    sleep(0.1)
  end
end

--- `ember launch ARGS` in the background as a user starts it (no inherited
-- rank or launch dir): {pid = the launcher's, out = its stdout+stderr}.
local function start(args)
  local job = {out = H.temp(), pidf = H.temp(), rcf = H.temp()}
  local words = {}
  for i, a in ipairs(args) do words[i] = q(a) end
  local cmd = ("env -u LUA_INIT -u LUA_INIT_5_4 -u EMBER_RANK -u EMBER_LAUNCH_DIR %s launch %s " ..
               "</dev/null >%s 2>&1 & echo $! >%s; wait $!; echo $? >%s")
              :format(q(EMBER), table.concat(words, " "), q(job.out), q(job.pidf), q(job.rcf))
  assert(os.execute("(" .. cmd .. ") >/dev/null 2>&1 &"))
  wait_for("the launcher's pid", function()
    local p = H.slurp(job.pidf)
    job.pid = p and tonumber(p:match("%d+"))
    return job.pid ~= nil
  end)
  return job
end

--- The launcher's exit status (it must exit within DEADLINE_S) and its output.
local function finish(job)
  wait_for("the launcher to exit", function() return (H.slurp(job.rcf) or ""):match("%d") end, job)
  return tonumber(H.slurp(job.rcf):match("%d+")), H.slurp(job.out)
end

local function count(text, plain)
  local n, at = 0, 1
  while true do
    local s, e = text:find(plain, at, true)
    if not s then return n end
    n, at = n + 1, e + 1
  end
end

--- How many processes run `script` (mpirun's command line names it too).
local function running(script)
  local p = io.popen("pgrep -f " .. q("[e]mber run " .. script) .. " | wc -l")
  local n = tonumber(p:read("l"))
  p:close()
  return n
end

describe("Ctrl-C under ember launch", function()
  setup(function()
    assert(io.open(EMBER, "rb"), "no executable at " .. EMBER .. " (set EMBER_BUILD)"):close()
  end)

  after_each(H.remove_temps)

  it("`ember run` under a launch keeps its pid in rank<R>.pid while it runs (an ember it starts does not " ..
     "replace it) and removes it at exit", function()
    local dir = H.tmpdir()
    local script = temp(([[
assert(os.execute(%q .. " -e 'print(1)' >/dev/null"))
print(io.open('/proc/self/stat'):read('n'), io.open(os.getenv("EMBER_LAUNCH_DIR") .. "/rank5.pid"):read('a'))
]]):format(q(EMBER)), ".lua")
    local out, err, status = H.ember({"run", script}, {env = {EMBER_LAUNCH_DIR = dir}, wrap = "env EMBER_RANK=5"})
    assert.equals(0, status, err)
    local pid, file = out:match("^(%d+)\t(.*)\n$")
    assert.is_not_nil(pid, out)
    assert.equals(pid .. "\n", file)
    assert.is_nil(H.slurp(dir .. "/rank5.pid"))
    local p = io.popen("ls -A " .. q(dir))
    assert.equals("", p:read("a"))   -- no temporary file left either
    p:close()
  end)

  launching("the first Ctrl-C reaches every rank as SIGINT; ranks that exit 0 make status 130", function()
    local script = temp([[
local rank = os.getenv("EMBER_RANK")
print("ready " .. rank) io.stdout:flush()
local ok, err = pcall(function() local t = os.time() while os.time() - t < 120 do end end)
print(("rank %s: %s"):format(rank, ok and "not interrupted" or tostring(err)))
]], ".lua")
    local job = start({"--nproc", "2", script})
    wait_for("both ranks ready", function() return count(H.slurp(job.out) or "", "ready ") == 2 end, job)
    local t0 = os.time()
    os.execute("kill -INT " .. job.pid)
    local rc, out = finish(job)
    assert.equals(130, rc, out)
    assert.is_true(os.time() - t0 < 60, out)
    assert.truthy(out:find("\nrank 0: [^\n]*interrupted!\n"), out)
    assert.truthy(out:find("\nrank 1: [^\n]*interrupted!\n"), out)
    assert.truthy(out:find("ember launch: stopped by SIGINT; every rank stopped on its own and exited 0", 1, true), out)
    assert.equals(0, running(script))
  end)

  launching("a second Ctrl-C stops ranks that defer the first one", function()
    local script = temp([[
require("ember.util").defer_interrupts(true)  -- recorded, never taken
print("ready") io.stdout:flush()
local t = os.time() while os.time() - t < 120 do end
]], ".lua")
    local job = start({"--nproc", "2", script})
    wait_for("both ranks ready", function() return count(H.slurp(job.out) or "", "ready") == 2 end, job)
    os.execute("kill -INT " .. job.pid)
    sleep(1)
    assert.is_true(running(script) >= 2, "the first Ctrl-C ended ranks that defer it")
    local t0 = os.time()
    os.execute("kill -INT " .. job.pid)
    local rc, out = finish(job)
    assert.equals(130, rc, out)
    assert.is_true(os.time() - t0 < 60, out)
    assert.truthy(out:find("ember launch: second stop signal: stopping mpirun and the ranks", 1, true), out)
    assert.equals(0, running(script))
  end)

  launching("a training run stops after the step the ranks agree on, checkpoints, and resumes bit for bit", function()
    local dir = H.tmpdir()
    local ember = require "ember"
    ember.manual_seed(5)
    ember.save_npy(dir .. "/train.npy", ember.randint(0, 64, {8000}):to("u16"))
    local LOG_EVERY = 3   -- the ranks agree on the interrupt flag at the log points
    local common = {"--train", dir .. "/train.npy", "--vocab", "64", "--model", "tiny", "--context", "16",
      "--batch", "4", "--log-every", tostring(LOG_EVERY), "--decay-steps", "100000", "--device", "cpu",
      "--seed", "3"}
    local function train(extra)
      local args = {"--nproc", "2", "scripts/train.lua"}
      for _, a in ipairs(common) do args[#args + 1] = a end
      for _, a in ipairs(extra) do args[#args + 1] = a end
      return start(args)
    end
    local function losses(run)
      local out = {}
      for line in io.lines(run .. "/log.jsonl") do
        local step, loss = line:match('"step":(%d+)'), line:match('"loss":([-%d.eE+]+)')
        if step and loss then out[tonumber(step)] = loss end   -- the text: compared exactly
      end
      return out
    end
    local function lines(path)
      local f = io.open(path)
      if not f then return 0 end
      local n = 0
      for _ in f:lines() do n = n + 1 end
      f:close()
      return n
    end

    local run = dir .. "/run"
    local job = train({"--steps", "1000000", "--out", run})
    wait_for("6 steps in the log", function() return lines(run .. "/log.jsonl") >= 2 * LOG_EVERY end, job)
    os.execute("kill -INT " .. job.pid)
    local rc, out = finish(job)
    assert.equals(130, rc, out)
    assert.truthy(out:find("ember launch: stopped by SIGINT; every rank stopped on its own and exited 0", 1, true), out)

    -- the checkpoint of the step the run stopped after, whole (no .tmp), and nothing logged past it
    local latest = assert(H.slurp(run .. "/checkpoints/latest"), "no checkpoints/latest:\n" .. out)
    local n = tonumber(latest:match("step_(%d+)"))
    assert.is_not_nil(n, latest)
    assert.is_true(n >= 2 * LOG_EVERY and n % LOG_EVERY == 0, "stopped after step " .. n)
    assert.truthy(out:find(("interrupted at step %d (Ctrl-C)"):format(n), 1, true), out)
    assert.truthy(out:find("resume with: ", 1, true), out)
    local ck = ("%s/checkpoints/step_%08d"):format(run, n)
    local state = assert(H.slurp(ck .. "/trainer.json"), "no trainer.json in " .. ck)
    assert.truthy(state:find(('"step":%d[,}]'):format(n)), state)
    assert.is_nil(H.slurp(ck .. ".tmp/trainer.json"))
    local logged = losses(run)
    assert.is_nil(logged[n + 1])
    assert.is_not_nil(logged[n])

    -- resume for 2 more steps; a straight run of n + 2 steps gives the same losses, bit for bit
    local resumed = start({"--nproc", "2", "scripts/train.lua", "--resume", run, "--steps", tostring(n + 2)})
    rc, out = finish(resumed)
    assert.equals(0, rc, out)
    assert.truthy(out:find(("resumed from %s at step %d"):format(ck, n), 1, true), out)
    local straight = train({"--steps", tostring(n + 2), "--out", dir .. "/straight"})
    rc, out = finish(straight)
    assert.equals(0, rc, out)
    local a, b = losses(run), losses(dir .. "/straight")
    for step = n - 1, n + 2 do
      assert.is_not_nil(b[step], "straight run, step " .. step)
      assert.equals(b[step], a[step], "loss of step " .. step)
    end
  end)
end)
