-- launch_spec.lua — `ember launch` driven as a user drives it: N ranks of a
-- plain-Lua script through mpirun, the first-failure summary, the command
-- line it refuses, and the rank environment under mpirun/srun by hand.
--
-- Run from the repository root:  EMBER_BUILD=$PWD/build busted tests/lua/launch_spec.lua
-- Needs Open MPI's mpirun (cases that start ranks are pending without it).
-- Failing ranks fail within a second; the others would sleep 60 s, so the
-- elapsed-time checks show the launcher stops them.

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local EMBER = H.EMBER
local HAVE_MPIRUN = H.have("mpirun")
local q, temp = H.q, H.temp_file

-- ember(args, {env=, wrap=}) --> stdout, stderr, status, seconds; run as a
-- user runs it outside any launch (no inherited rank or launch dir)
local function ember(args, opts)
  opts = opts or {}
  return H.ember(args, {env = opts.env, wrap = opts.wrap, unset = {"EMBER_RANK", "EMBER_LAUNCH_DIR"}})
end

--- The one "ember launch: " summary line of stderr (there must be exactly one).
local function one_summary(err)
  local summary = H.lines_matching(err, "^ember launch: ")
  assert.equals(1, #summary, err)
  return summary[1]
end

-- What every failing case shares: rank 0 sleeps for 60 s unless stopped.
local SLEEP_REST = "for _ = 1, 300 do os.execute('sleep 0.2') end\n"
local MY_PID = "local pid = io.open('/proc/self/stat'):read('n')\n"

--- A script whose rank 0 leaves `record` as its failure record in the launch
-- dir at once, while rank 1 fails with "boom" 0.3 s later.
local function record_then_boom(record)
  return ([[
local dir = os.getenv("EMBER_LAUNCH_DIR")
if os.getenv("EMBER_RANK") == "0" then
  local f = io.open(dir .. "/rank0.fail", "w")
  f:write(%q)
  f:close()
else
  os.execute("sleep 0.3")
  error("boom")
end
]]):format(record) .. SLEEP_REST
end

local function launching(name, fn)
  if HAVE_MPIRUN then it(name, fn) else pending(name .. " (no mpirun on PATH)") end
end

describe("ember launch", function()
  setup(function()
    assert(io.open(EMBER, "rb"), "no executable at " .. EMBER .. " (set EMBER_BUILD)"):close()
  end)

  after_each(H.remove_temps)

  describe("ranks that succeed", function()
    local show = [[
print(("rank=%s size=%s local=%s args=%s"):format(os.getenv("EMBER_RANK"),
  os.getenv("EMBER_WORLD_SIZE"), os.getenv("EMBER_LOCAL_RANK"), table.concat({...}, ",")))
]]

    for _, n in ipairs({ 2, 3 }) do
      launching("runs " .. n .. " ranks, each with its EMBER_RANK, EMBER_WORLD_SIZE, EMBER_LOCAL_RANK", function()
        local script = temp(show, ".lua")
        local out, err, status = ember({ "launch", "--nproc", tostring(n), script, "a", "b c" })
        assert.equals(0, status, err)
        local seen = {}
        for line in out:gmatch("[^\n]+") do seen[#seen + 1] = line end
        table.sort(seen)
        assert.equals(n, #seen, out)
        for r = 0, n - 1 do
          assert.equals(("rank=%d size=%d local=%d args=a,b c"):format(r, n, r), seen[r + 1])
        end
      end)
    end

    launching("exports --backend and --timeout, and a launch dir it removes at the end", function()
      local script = temp([[
local dir = os.getenv("EMBER_LAUNCH_DIR")
local probe = io.open(dir .. "/probe" .. os.getenv("EMBER_RANK"), "w")
print(os.getenv("EMBER_DIST_BACKEND"), os.getenv("EMBER_DIST_TIMEOUT"), dir, probe ~= nil)
]], ".lua")
      local out, err, status = ember({ "launch", "--nproc", "2", "--backend", "mpi",
                                       "--timeout", "45", script })
      assert.equals(0, status, err)
      local backend, timeout, dir, writable = out:match("^(%S+)\t(%S+)\t(%S+)\t(%S+)\n")
      assert.equals("mpi", backend)
      assert.equals("45", timeout)
      assert.equals("true", writable)
      assert.is_nil(io.open(dir, "rb"), "the launch dir " .. dir .. " is still there")
    end)

    launching("prefixes each line with the rank under --tag-output", function()
      local script = temp("print('hello ' .. os.getenv('EMBER_RANK'))\n", ".lua")
      local out, err, status = ember({ "launch", "--nproc", "2", "--tag-output", script })
      assert.equals(0, status, err)
      assert.matches("%[%d+,0%]<stdout>:%s*hello 0", out)
      assert.matches("%[%d+,1%]<stdout>:%s*hello 1", out)
    end)
  end)

  describe("the first failure", function()
    launching("names rank 1, its Lua error and traceback, in one summary line, and stops rank 0", function()
      local script = temp("if os.getenv('EMBER_RANK') == '1' then error('boom') end\n" .. SLEEP_REST, ".lua")
      local _, err, status, seconds = ember({ "launch", "--nproc", "2", script })
      assert.equals(1, status)
      assert.is_true(seconds < 30, "took " .. seconds .. " s: rank 0 was not stopped")
      assert.matches("^ember launch: rank 1 %(host %S+, pid %d+%) failed first: .*:1: boom$", one_summary(err))
      local after = err:match("failed first: [^\n]*\n(.*)$")
      assert.matches("^  stack traceback:\n  \t%[C%]: in function 'error'", after)
      assert.is_nil(err:find("Primary job", 1, true), "mpirun's abort box was not replaced")
    end)

    launching("with 3 ranks, names the failing rank and stops both others", function()
      local script = temp("if os.getenv('EMBER_RANK') == '2' then error('boom on two') end\n" .. SLEEP_REST, ".lua")
      local _, err, status, seconds = ember({ "launch", "--nproc", "3", script })
      assert.equals(1, status)
      assert.is_true(seconds < 30, "took " .. seconds .. " s")
      local summary = one_summary(err)
      assert.matches("^ember launch: rank 2 .* failed first: .*boom on two$", summary)
    end)

    launching("names a rank killed by SIGKILL (no record: mpirun's report)", function()
      local script = temp("if os.getenv('EMBER_RANK') == '1' then\n" .. MY_PID ..
                          "os.execute('kill -9 ' .. pid) end\n" .. SLEEP_REST, ".lua")
      local _, err, status, seconds = ember({ "launch", "--nproc", "2", script })
      assert.equals(1, status)
      assert.is_true(seconds < 30, "took " .. seconds .. " s")
      local summary = one_summary(err)
      assert.matches("^ember launch: rank 1 .*failed first: killed by signal 9 %(SIGKILL%)$", summary)
    end)

    launching("names a rank that called os.exit(3) with its exit status", function()
      local script = temp("if os.getenv('EMBER_RANK') == '1' then os.exit(3) end\n" .. SLEEP_REST, ".lua")
      local _, err, status, seconds = ember({ "launch", "--nproc", "3", script })
      assert.equals(1, status)
      assert.is_true(seconds < 30, "took " .. seconds .. " s")
      local summary = one_summary(err)
      assert.matches("^ember launch: rank 1 .*failed first: exit status 3$", summary)
    end)

    launching("records a fatal signal in the rank (SIGSEGV): host, pid and signal name", function()
      local script = temp("if os.getenv('EMBER_RANK') == '1' then\n" .. MY_PID ..
                          "print(pid) io.stdout:flush() os.execute('kill -SEGV ' .. pid) end\n" ..
                          SLEEP_REST, ".lua")
      local out, err, status = ember({ "launch", "--nproc", "2", script })
      assert.equals(1, status)
      local pid = assert(out:match("(%d+)\n"), out)
      local summary = one_summary(err)
      assert.equals(("ember launch: rank 1 (host %s, pid %s) failed first: killed by signal 11 (SIGSEGV)")
                      :format(summary:match("host (%S+),"), pid), summary)
    end)

    launching("never names a 'terminated' record, even an earlier one", function()
      local script = temp(record_then_boom("1 0 otherhost 42 terminated\nstopped by mpirun, not a failure"), ".lua")
      local _, err, status = ember({ "launch", "--nproc", "2", script })
      assert.equals(1, status)
      local summary = one_summary(err)
      assert.matches("^ember launch: rank 1 .*boom$", summary)
      assert.is_nil(err:find("not a failure", 1, true))
    end)

    launching("names the earliest record, and what mpirun noticed when that differs", function()
      local script = temp(record_then_boom("1000 0 otherhost 42 timeout\nallreduce waited 30 s\nfor rank 1"), ".lua")
      local _, err, status = ember({ "launch", "--nproc", "2", script })
      assert.equals(1, status)
      local summary = one_summary(err)
      assert.equals("ember launch: rank 0 (host otherhost, pid 42) failed first: allreduce waited 30 s",
                    summary)
      assert.truthy(err:find("failed first: allreduce waited 30 s\n  for rank 1\n" ..
                             "  (mpirun noticed rank 1 first: exit status 1)\n", 1, true), err)
    end)

    it("reads Open MPI 5's wording of mpirun's boxes and shows a box it cannot read", function()
      -- a stand-in mpirun that prints what prterun prints when rank 2 dies
      local bin = H.tmpdir()
      local rule = ("-"):rep(74)
      local fake = H.spit(bin .. "/mpirun", table.concat({
        "#!/bin/sh\ncat >&2 <<'EOF'\nrank 0 says hi\n", rule, "\n",
        "prterun noticed that process rank 2 with PID 4242 on node nodeB exited on\n",
        "signal 11 (Segmentation fault).\n", rule, "\n", rule, "\n",
        "Something else went wrong that the launcher cannot read.\n", rule, "\nEOF\nexit 1\n"}))
      os.execute("chmod +x " .. q(fake))
      local script = temp("print(1)", ".lua")
      local _, err, status = ember({ "launch", "--nproc", "3", script },
                                   { wrap = "env PATH=" .. q(bin .. ":" .. os.getenv("PATH")) })
      assert.equals(1, status)
      assert.truthy(err:find("rank 0 says hi\n", 1, true), err)
      assert.truthy(err:find(rule .. "\nSomething else went wrong that the launcher cannot read.\n" ..
                             rule .. "\n", 1, true), err)
      assert.is_nil(err:find("prterun noticed", 1, true), err)
      assert.equals("ember launch: rank 2 (host nodeB, pid 4242) failed first: killed by signal 11 (SIGSEGV)",
                    H.lines_matching(err, "^ember launch: ")[1])
    end)

    -- A Ctrl-C normally goes to the ranks (launch_interrupt_spec.lua); before
    -- every rank has left its pid (here: removed it) it stops mpirun, as
    -- SIGTERM always does.
    launching("SIGTERM, and Ctrl-C before the ranks registered, stop mpirun and the ranks: status 143 and 130", function()
      local script = temp("os.remove(os.getenv('EMBER_LAUNCH_DIR') .. '/rank' .. os.getenv('EMBER_RANK') .. '.pid')\n" ..
                          "print('ready') io.stdout:flush()\n" .. SLEEP_REST, ".lua")
      for sig, expected in pairs({ INT = 130, TERM = 143 }) do
        local out = H.temp()
        local p = io.popen(("env -u EMBER_RANK -u EMBER_LAUNCH_DIR %s launch --nproc 2 %s >%s 2>&1 & pid=$!; " ..
                            "for i in $(seq 1200); do [ \"$(grep -c ready %s)\" -ge 2 ] && break; sleep 0.1; done; " ..
                            "t=$(date +%%s); kill -%s $pid; wait $pid; echo $? $(( $(date +%%s) - t ))")
                           :format(q(EMBER), q(script), q(out), q(out), sig))
        local rc, seconds = p:read("n", "n")
        p:close()
        assert.equals(expected, rc, H.slurp(out))
        assert.is_true(seconds < 30, seconds .. " s after the signal") -- the ranks would sleep 60 s
        assert.truthy(H.slurp(out):find("stopped by SIG" .. sig .. "; mpirun and the ranks were stopped", 1, true))
        -- mpirun and the ranks are gone: no `ember run` of this script is
        -- left ("[e]" keeps the pattern from matching this shell's own line)
        local ps = io.popen("pgrep -f " .. q("[e]mber run " .. script) .. " | wc -l")
        local left = tonumber(ps:read("l"))
        ps:close()
        assert.equals(0, left)
      end
    end)
  end)

  describe("the command line", function()
    local function refuses(args, expected)
      local out, err, status = ember(args)
      assert.equals(2, status)
      assert.equals("", out)
      assert.truthy(err:find(expected, 1, true), "stderr lacks '" .. expected .. "':\n" .. err)
      assert.truthy(err:find("ember launch --help", 1, true))
    end

    it("refuses --nproc 0, --nproc x and a missing --nproc", function()
      local script = temp("print(1)", ".lua")
      refuses({ "launch", "--nproc", "0", script }, "--nproc expects a positive integer (the number of ranks), got '0'")
      refuses({ "launch", "--nproc=x", script }, "got 'x'")
      refuses({ "launch", script }, "--nproc N is required")
      refuses({ "launch", "--nproc" }, "option '--nproc' needs a value")
    end)

    it("refuses an unknown option, a bad backend or timeout, naming what it expected", function()
      local script = temp("print(1)", ".lua")
      refuses({ "launch", "--nproc", "2", "--bogus", script }, "unknown option '--bogus' (expected --nproc")
      refuses({ "launch", "--nproc", "2", "--backend", "gloo", script }, "--backend expects auto, nccl or mpi, got 'gloo'")
      refuses({ "launch", "--nproc", "2", "--timeout", "soon", script }, "--timeout expects a positive number of seconds, got 'soon'")
    end)

    it("refuses no script and a script that is not there", function()
      refuses({ "launch", "--nproc", "2" }, "no script given")
      refuses({ "launch", "--nproc", "2", "/nonexistent/train.lua" },
              "cannot read script '/nonexistent/train.lua': No such file or directory")
    end)

    it("says how to get mpirun when it is missing (status 2)", function()
      local script = temp("print(1)", ".lua")
      local out, err, status = ember({ "launch", "--nproc", "2", script }, { env = { PATH = "/nonexistent" } })
      assert.equals(2, status)
      assert.equals("", out)
      assert.equals("ember launch: mpirun not found: install openmpi-bin (make deps)\n", err)
    end)

    it("--help documents the options, mpirun and srun, with examples", function()
      local out, err, status = ember({ "launch", "--help" })
      assert.equals(0, status)
      assert.equals("", err)
      for _, word in ipairs({ "--nproc", "--backend", "--timeout", "--tag-output", "--dry-run",
                              "--mpirun-args", "mpirun", "--hostfile", "srun --mpi=pmix",
                              "EMBER_RANK", "failed first", "examples" }) do
        assert.truthy(out:find(word, 1, true), "help lacks " .. word)
      end
    end)

    launching("--dry-run prints the mpirun line and environment and runs nothing", function()
      local script = temp("print('ran!')", ".lua")
      local out, err, status = ember({ "launch", "--nproc", "3", "--dry-run", "--backend", "nccl",
                                       "--mpirun-args", "--mca btl 'tcp,self'", script, "x y" })
      assert.equals(0, status, err)
      assert.is_nil(out:find("ran!", 1, true))
      assert.truthy(out:find("EMBER_DIST_BACKEND=nccl\n", 1, true), out)
      assert.truthy(out:find("OMPI_MCA_btl_vader_single_copy_mechanism=none", 1, true), out)
      assert.matches("mpirun %-np 3 %-%-oversubscribe %-%-bind%-to none .* %-%-mca btl tcp,self " ..
                     ".*/ember run " .. script:gsub("%p", "%%%0") .. " 'x y'", out)
    end)
  end)
end)

describe("rank environment without the launcher", function()
  local show = "print(os.getenv('EMBER_RANK'), os.getenv('EMBER_WORLD_SIZE'), os.getenv('EMBER_LOCAL_RANK'))"

  after_each(H.remove_temps)

  it("derives EMBER_RANK & co from Slurm's variables (srun)", function()
    local out, err, status = ember({ "-e", show }, {
      wrap = "env -u OMPI_COMM_WORLD_RANK -u PMIX_RANK SLURM_PROCID=3 SLURM_NTASKS=4 SLURM_LOCALID=1" })
    assert.equals(0, status, err)
    assert.equals("3\t4\t1\n", out)
  end)

  it("prefers Open MPI's over Slurm's, and a set EMBER_RANK over both", function()
    local vars = "OMPI_COMM_WORLD_RANK=5 OMPI_COMM_WORLD_SIZE=8 OMPI_COMM_WORLD_LOCAL_RANK=1 " ..
                 "SLURM_PROCID=3 SLURM_NTASKS=4 SLURM_LOCALID=0"
    local out = ember({ "-e", show }, { wrap = "env " .. vars })
    assert.equals("5\t8\t1\n", out)
    out = ember({ "-e", show }, { wrap = "env EMBER_RANK=7 " .. vars })
    assert.equals("7\tnil\tnil\n", out)
  end)

  launching("works under mpirun by hand", function()
    local script = temp(show, ".lua")
    local out, err, status = ember({ "run", script }, {
      wrap = "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " ..
               "OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun -np 2 --oversubscribe" })
    assert.equals(0, status, err)
    local seen = {}
    for line in out:gmatch("[^\n]+") do seen[#seen + 1] = line end
    table.sort(seen)
    assert.same({ "0\t2\t0", "1\t2\t1" }, seen)
  end)

  it("a failing `ember run` leaves a record in EMBER_LAUNCH_DIR: time rank host pid kind, message", function()
    local dir = H.tmpdir()
    local script = temp("error('boom')", ".lua")
    local _, err, status = ember({ "run", script }, { env = { EMBER_LAUNCH_DIR = dir },
                                                      wrap = "env EMBER_RANK=5" })
    local record = H.slurp(dir .. "/rank5.fail")
    assert.equals(1, status)
    assert.truthy(err:find("boom", 1, true))
    assert.is_not_nil(record, "no rank5.fail")
    local ns, host, pid, message = record:match("^(%d+) 5 (%S+) (%d+) error\n(.*)$")
    assert.is_not_nil(ns, record)
    assert.is_true(math.abs(tonumber(ns) / 1e9 - os.time()) < 60)
    assert.is_true(#host > 0 and tonumber(pid) > 0)
    assert.matches("^.*:1: boom\nstack traceback:\n", message)
  end)
end)
