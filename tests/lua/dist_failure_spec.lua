-- dist_failure_spec.lua — failures inside collectives end the whole run with
-- an error naming the rank, within seconds, never a hang: a rank that raises
-- while the others wait in an all_reduce, one killed with SIGKILL, a
-- collective-size mismatch (the order check), a rank that never arrives
-- (EMBER_DIST_TIMEOUT), and a script that ends without destroy().
-- Each case runs `ember launch --nproc 2|3` on a small script (CPU, MPI).

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local EMBER = H.EMBER
local HAVE_MPIRUN = H.have("mpirun")

-- launch(nproc, script text, env) --> stdout, stderr, ok, seconds
local function launch(nproc, script, env)
  local out, err, status, seconds = H.ember({"launch", "--nproc", tostring(nproc), H.temp_file(script)}, {
    env = env, wrap = "timeout 300",
    unset = {"EMBER_RANK", "EMBER_LAUNCH_DIR", "EMBER_DIST_CHECK", "EMBER_DIST_TIMEOUT"}})
  return out, err, status == 0, seconds
end

local function summary(err)
  local s = err:match("(ember launch: rank[^\n]*)")
  assert.is_truthy(s, "no 'ember launch: rank ...' summary line in:\n" .. err)
  return s
end

local PRELUDE = [[
local ember = require "ember"
local dist = ember.dist
dist.init()
local rank = dist.rank()
for _ = 1, 3 do dist.all_reduce(ember.ones(8)) end
]]

local function launching(name, fn)
  if HAVE_MPIRUN then it(name, fn) else pending(name .. " (no mpirun on PATH)") end
end

describe("ember.dist failures end the run", function()
  setup(function()
    assert(io.open(EMBER, "rb"), "no executable at " .. EMBER .. " (set EMBER_BUILD)"):close()
  end)
  after_each(H.remove_temps)

  launching("a rank that raises while the others wait in an all_reduce", function()
    local _, err, ok, secs = launch(3, PRELUDE .. [[
if rank == 1 then error("boom on purpose") end
dist.all_reduce(ember.ones(8))
]])
    assert.is_false(ok)
    local s = summary(err)
    assert.truthy(s:find("rank 1 ", 1, true), s)
    assert.truthy(s:find("boom on purpose", 1, true), s)
    assert.is_true(secs < 60, "took " .. secs .. " s")
  end)

  launching("a rank killed with SIGKILL while the others wait in an all_reduce", function()
    local _, err, ok, secs = launch(2, PRELUDE .. [[
if rank == 1 then
  local pid = io.open('/proc/self/stat'):read('n')
  os.execute("kill -9 " .. pid)
end
dist.all_reduce(ember.ones(8))
]])
    assert.is_false(ok)
    local s = summary(err)
    assert.truthy(s:find("rank 1 ", 1, true), s)
    assert.truthy(s:find("SIGKILL", 1, true) or s:find("signal 9", 1, true), s)
    assert.is_true(secs < 60, "took " .. secs .. " s")
  end)

  launching("a collective-size mismatch names both ranks' calls and the call site", function()
    local _, err, ok, secs = launch(3, PRELUDE .. [[
dist.all_reduce(ember.ones(rank == 2 and 5 or 8))
]])
    assert.is_false(ok)
    local s = summary(err)
    assert.truthy(s:find("collective mismatch: rank 2 called all_reduce(f32, 5 elements", 1, true), s)
    assert.truthy(s:find("rank 0 called all_reduce(f32, 8 elements", 1, true), s)
    assert.truthy(s:find("as collective #3 at ", 1, true), s)
    assert.is_true(secs < 60, "took " .. secs .. " s")
  end)

  launching("a rank that never arrives: the others time out after EMBER_DIST_TIMEOUT", function()
    local _, err, ok, secs = launch(2, PRELUDE .. [[
if rank == 1 then os.execute("sleep 120") end
dist.all_reduce(ember.ones(8))
]], {EMBER_DIST_TIMEOUT = "3"})
    assert.is_false(ok)
    local s = summary(err)
    assert.truthy(s:find("rank 0 ", 1, true), s)
    assert.truthy(s:find("timed out after 3 s", 1, true), s)
    assert.truthy(s:find("all_reduce #3 at ", 1, true), s)
    assert.is_true(secs < 60, "took " .. secs .. " s (the sleeping rank must be stopped)")
  end)

  launching("init's timeout option and a bad EMBER_DIST_TIMEOUT", function()
    local _, err, ok = launch(2, [[
local ember = require "ember"
ember.dist.init()
]], {EMBER_DIST_TIMEOUT = "soon"})
    assert.is_false(ok)
    assert.truthy(summary(err):find('EMBER_DIST_TIMEOUT must be a positive number of seconds, got "soon"', 1, true))
  end)

  launching("a script that ends without destroy() exits cleanly on every rank", function()
    local out, err, ok = launch(3, PRELUDE .. [[
print("done " .. rank)
]])
    assert.is_true(ok, err)
    for r = 0, 2 do assert.truthy(out:find("done " .. r, 1, true), out) end
    assert.falsy(err:find("finalize", 1, true), err)
  end)

  launching("destroy() then init() again is refused clearly", function()
    local out, err, ok = launch(2, PRELUDE .. [[
dist.destroy()
assert(not dist.is_initialized())
local ok2, e = pcall(dist.init)
print(ok2, e)
]])
    assert.is_true(ok, err)
    assert.truthy(out:find("MPI starts once per process", 1, true), out)
  end)
end)
