-- cli_spec.lua — the `ember` executable, driven as a user drives it: command
-- lines through the shell, output and exit status checked.
--
-- Run from the repository root:  EMBER_BUILD=$PWD/build busted tests/lua/cli_spec.lua
-- EMBER_BUILD defaults to ./build. The scripts here use plain Lua only, so the
-- spec checks the interpreter, not tensor features (one case requires "ember").

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local BUILD, EMBER, q, spit = H.BUILD, H.EMBER, H.q, H.spit

-- a temporary file holding text, removed after each case
local function temp(text, suffix) return spit(H.temp(suffix), text or "") end

-- run({args...}, {stdin=, env={NAME=value}, wrap=}) --> stdout, stderr, status
local run = H.ember

describe("ember executable", function()
  setup(function()
    assert(io.open(EMBER, "rb"), "no executable at " .. EMBER .. " (set EMBER_BUILD)"):close()
  end)

  after_each(H.remove_temps)

  describe("--version and --help", function()
    it("prints the version with the Lua release and the CUDA flag", function()
      local out, _, status = run({ "--version" })
      assert.equals(0, status)
      assert.matches("^ember %d+%.%d+%.%d+ %(Lua 5%.4%.%d+, CUDA o[nf]f?%)\n$", out)
    end)

    it("lists every subcommand and option, with examples", function()
      local out, _, status = run({ "--help" })
      assert.equals(0, status)
      for _, word in ipairs({ "run", "repl", "launch", "sweep", "-e", "-l", "-i", "-E",
                              "-W", "--version", "--help", "examples" }) do
        assert.truthy(out:find(word, 1, true), "help lacks " .. word)
      end
    end)

    it("rejects an unknown option with status 2, naming it", function()
      local out, err, status = run({ "--bogus" })
      assert.equals(2, status)
      assert.equals("", out)
      assert.truthy(err:find("'--bogus'", 1, true))
      assert.truthy(err:find("--help", 1, true))
    end)

    it("rejects -e without code with status 2", function()
      local _, err, status = run({ "-e" })
      assert.equals(2, status)
      assert.truthy(err:find("'-e'", 1, true))
    end)
  end)

  describe("-e, -l and the environment", function()
    it("runs several -e chunks in order", function()
      local out, _, status = run({ "-e", "x = 1 + 1", "-e", "print(x)", "-e", "print('two')" })
      assert.equals(0, status)
      assert.equals("2\ntwo\n", out)
    end)

    it("-l requires a module found through LUA_PATH into a global", function()
      local dir = temp(nil, ".d")
      os.remove(dir)
      assert(os.execute("mkdir " .. q(dir)))
      spit(dir .. "/clitestmod.lua", "return {answer = 42}")
      local out, _, status = run({ "-l", "clitestmod", "-l", "m=clitestmod",
                                   "-e", "print(clitestmod.answer, m.answer)" },
                                 { env = { LUA_PATH = dir .. "/?.lua;;", LUA_PATH_5_4 = dir .. "/?.lua;;" } })
      os.remove(dir .. "/clitestmod.lua")
      os.remove(dir)
      assert.equals(0, status)
      assert.equals("42\t42\n", out)
    end)

    it("runs LUA_INIT first, and -E ignores it", function()
      local out = run({ "-e", "print(x)" }, { env = { LUA_INIT = "x = 7" } })
      assert.equals("7\n", out)
      out = run({ "-E", "-e", "print(x)" }, { env = { LUA_INIT = "x = 7" } })
      assert.equals("nil\n", out)
    end)

    it("finds the ember package without any environment", function()
      local out, err, status = run({ "-e", "print(type(require 'ember'))" },
                                   { wrap = "env -u LUA_PATH -u LUA_PATH_5_4" })
      assert.equals("", err)
      assert.equals(0, status)
      assert.equals("table\n", out)
    end)
  end)

  describe("scripts", function()
    local show_args = "print('n', select('#', ...), ...)\n" ..
                      "for i = -2, #arg do print(i, arg[i]) end\n"

    it("gets arg and ... as stock lua sets them", function()
      local script = temp(show_args, ".lua")
      local out, _, status = run({ script, "a", "b c" })
      assert.equals(0, status)
      assert.equals("n\t2\ta\tb c\n" ..
                    "-2\tnil\n-1\t" .. EMBER .. "\n0\t" .. script .. "\n1\ta\n2\tb c\n", out)
    end)

    it("`ember run script` is the same, with `run` at arg[-1]", function()
      local script = temp(show_args, ".lua")
      local out, _, status = run({ "run", script, "--flag" })
      assert.equals(0, status)
      assert.equals("n\t1\t--flag\n" ..
                    "-2\t" .. EMBER .. "\n-1\trun\n0\t" .. script .. "\n1\t--flag\n", out)
    end)

    it("reads the script from stdin for `-`", function()
      local out, _, status = run({ "-", "x" }, { stdin = "print('stdin', ...)" })
      assert.equals(0, status)
      assert.equals("stdin\tx\n", out)
    end)

    it("reports an error with `ember:`, a traceback and status 1", function()
      local script = temp("local function f() error('boom') end\nf()\n", ".lua")
      local out, err, status = run({ script })
      assert.equals(1, status)
      assert.equals("", out)
      assert.matches("^ember: [^\n]*:1: boom\nstack traceback:\n", err)
      assert.truthy(err:find("in local 'f'", 1, true))
    end)

    it("says clearly that a script file is missing, status 1", function()
      local _, err, status = run({ "no/such/script.lua" })
      assert.equals(1, status)
      assert.matches("^ember: cannot open no/such/script%.lua", err)
    end)

    it("`ember run` without a script is a usage error", function()
      local _, err, status = run({ "run" })
      assert.equals(2, status)
      assert.truthy(err:find("no script", 1, true))
    end)

    it("exits with the status given to os.exit", function()
      local _, _, status = run({ "-e", "os.exit(3)" })
      assert.equals(3, status)
      local script = temp("print('bye')\nos.exit(5)\nprint('not reached')\n", ".lua")
      local out
      out, _, status = run({ script })
      assert.equals(5, status)
      assert.equals("bye\n", out)
    end)

    it("turns SIGINT into the error 'interrupted!'", function()
      -- 2 s: the signal must land after start-up installed the handler, also on a loaded machine
      local _, err, status = run({ "-e", "while true do end" },
                                 { wrap = "timeout --foreground --preserve-status -k 20 -s INT 2" })
      assert.equals(1, status)
      assert.matches("^ember: [^\n]*interrupted!", err)
    end)

    it("records SIGINT instead of raising while a script defers it (ember.util.defer_interrupts)", function()
      local code = "local u = require 'ember.util'; u.defer_interrupts(true); " ..
        "while not u.take_interrupt() do end; print('taken at a safe point'); os.exit(7)"
      -- --foreground: timeout sends SIGINT to the child only (otherwise to its process group too, and a
      -- second SIGINT ends ember by design: status 130); -k 20: a lost signal fails instead of spinning
      local out, err, status = run({ "-e", code }, { wrap = "timeout --foreground --preserve-status -k 20 -s INT 2" })
      assert.equals("taken at a safe point\n", out)
      assert.is_nil(err:find("interrupted!", 1, true), err)
      assert.equals(7, status)
    end)
  end)

  describe("piped REPL", function()
    it("prints an expression's values and survives an error", function()
      local out, err, status = run({ "repl" },
        { stdin = "1 + 1\nerror('boom')\n1, 'a', nil\nprint('alive')\n" })
      assert.equals(0, status)
      assert.equals("2\n1\ta\tnil\nalive\n", out)
      assert.truthy(err:find("boom", 1, true))
      assert.truthy(err:find("stack traceback:", 1, true))
    end)

    it("continues incomplete statements over several lines", function()
      local out, _, status = run({ "repl" }, {
        stdin = "for i = 1, 2 do\n  print(i)\nend\n" ..
                "function add(a,\n b)\n return a + b\nend\nadd(40, 2)\n" })
      assert.equals(0, status)
      assert.equals("1\n2\n42\n", out)
    end)

    it("reports a statement left unfinished at end of input", function()
      local _, err, status = run({ "repl" }, { stdin = "if true then\n" })
      assert.equals(0, status)
      assert.truthy(err:find("<eof>", 1, true))
    end)

    it("runs -e code first and honours os.exit", function()
      local out, _, status = run({ "-e", "y = 5", "-i" }, { stdin = "y\nos.exit(4)\ny + 1\n" })
      assert.equals(4, status)
      assert.equals("5\n", out)
    end)

    it("has `ember` preloaded as a global", function()
      local out, err = run({ "repl" }, { stdin = "type(ember)\n" })
      assert.equals("", err)
      assert.equals("table\n", out)
    end)
  end)

  describe("shared libraries", function()
    -- The dynamic loader run with --inhibit-cache ignores /etc/ld.so.cache (the
    -- ld.so.conf entries) and LD_LIBRARY_PATH is unset: what the binaries need
    -- outside the system dirs must come from their RUNPATH.
    local function interp(path)
      local p = io.popen("readelf -l " .. q(path) .. " 2>/dev/null")
      local text = p:read("a")
      p:close()
      return text:match("program interpreter: ([^%]]+)%]")
    end
    local function needs_cudart(path)
      local p = io.popen("readelf -d " .. q(path) .. " 2>/dev/null")
      local text = p:read("a")
      p:close()
      return text:find("libcudart", 1, true) ~= nil
    end

    for _, bin in ipairs({ "ember", "test_tensor" }) do
      it(bin .. " finds the CUDA libraries without LD_LIBRARY_PATH or the ld.so cache", function()
        local path = BUILD .. "/" .. bin
        if not needs_cudart(path) then pending("a build without CUDA: no CUDA library to find") return end
        local ld = interp(path)
        assert.is_string(ld, "readelf found no program interpreter in " .. path)
        local args = bin == "ember" and " -e 'io.write(ember.version)' >/dev/null" or " >/dev/null"
        local _, _, status = os.execute("env -u LD_LIBRARY_PATH " .. ld .. " --inhibit-cache " .. q(path) ..
          args .. " 2>/dev/null")
        assert.equals(0, status)
      end)
    end

    it("core.so loads into a stock lua5.4 without LD_LIBRARY_PATH or the ld.so cache", function()
      local so = BUILD .. "/lua/ember/core.so"
      if not needs_cudart(so) then pending("a build without CUDA: no CUDA library to find") return end
      local lua = io.popen("command -v lua5.4"):read("l")
      if not lua then pending("no lua5.4 on PATH") return end
      local ld = interp(lua)
      local code = ("package.cpath = %q .. package.cpath; io.write(require('ember.core').version)")
        :format(BUILD .. "/lua/?.so;")
      local p = io.popen("env -u LD_LIBRARY_PATH " .. ld .. " --inhibit-cache " .. q(lua) .. " -e " .. q(code) .. " 2>&1")
      local out = p:read("a")
      p:close()
      assert.equals((run({ "-e", "io.write(ember.version)" })), out)
    end)
  end)

  describe("subcommands written in Lua", function()
    -- (`launch` is C now: tests/lua/launch_spec.lua)
    for _, name in ipairs({ "sweep" }) do
      it("`ember " .. name .. "` runs ember." .. name .. "_cli or says it is missing", function()
        local f = io.open(BUILD .. "/lua/ember/" .. name .. "_cli.lua", "rb")
        if f then -- present in this build: --help must work
          f:close()
          local out, _, status = run({ name, "--help" })
          assert.equals(0, status)
          assert.truthy(out:find(name, 1, true))
        else
          local _, err, status = run({ name })
          assert.equals(2, status)
          assert.truthy(err:find("'" .. name .. "' is not available in this build", 1, true))
        end
      end)
    end
  end)
end)
