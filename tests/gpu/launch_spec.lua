-- launch_spec.lua (GPU) — EMBER_CUDA_LAUNCH (kernels/launch.cuh): the kernels em_launch serves give the
-- same bits launched through the driver's cuLaunchKernel (driver) as through cudaLaunchKernel (runtime),
-- eagerly and replayed from a graph (launch_ref.lua's cases, each mode in a child process: the switch is
-- read once); an unknown value is an error naming the two accepted ones.
local ember = require "ember"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local exe = (os.getenv("EMBER_BUILD") or "./build") .. "/ember"

local function child(mode)
  local pipe = io.popen("EMBER_CUDA_LAUNCH=" .. mode .. " " .. exe .. " run " .. here .. "launch_ref.lua 2>&1")
  local out = pipe:read("a")
  pipe:close()
  local got = {}
  for name, text in out:gmatch("([^\n]-): ([^\n]*)") do got[name] = text end   -- names may hold ':' (a:add_)
  return got, out
end

describe("EMBER_CUDA_LAUNCH", function()
  it("driver gives the runtime's bits for every kernel launched through em_launch", function()
    local rt, rt_out = child("runtime")
    local drv, drv_out = child("driver")
    local n = 0
    for _, c in ipairs(dofile(here .. "launch_ref.lua").cases("cpu")) do   -- the names (CPU: no graph case)
      assert.is_not_nil(rt[c[1]], "the runtime child printed no '" .. c[1] .. "': " .. rt_out:sub(1, 400))
      assert.is_not_nil(drv[c[1]], "the driver child printed no '" .. c[1] .. "': " .. drv_out:sub(1, 400))
      assert.are.equal(rt[c[1]], drv[c[1]], c[1])
      n = n + 1
    end
    assert.are.equal(20, n)
    local g = "graph replay of add, gelu, fill_"
    assert.is_not_nil(drv[g], drv_out:sub(1, 400))
    assert.are.equal(rt[g], drv[g], g)
    assert.are.equal(("%a"):format(3), rt["a + b 1 element"])   -- the children computed something
  end)

  it("rejects an unknown value, naming both accepted ones", function()
    local pipe = io.popen("EMBER_CUDA_LAUNCH=cubin " .. exe ..
      " -e 'local e = require \"ember\"; print(pcall(function() local a = e.ones(1, {device = \"cuda\"}); return a + a end))' 2>&1")
    local out = pipe:read("a")
    pipe:close()
    assert.matches("false", out, 1, true)
    assert.matches("expected EMBER_CUDA_LAUNCH to be runtime or driver, got 'cubin'", out, 1, true)
  end)
end)
