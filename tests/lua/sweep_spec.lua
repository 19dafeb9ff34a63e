-- sweep_spec.lua — campaigns (ember.sweep) and `ember sweep`, driven as a
-- user drives it: a fake script in a temp dir that succeeds, crashes, hangs
-- past a 1-second timeout or runs out of memory, depending on its --case.
-- Each run appends its case to a counter file, so resume and --force are
-- checked by counting processes, not by trusting the sweep's own output.
--
-- Run from the repository root:  EMBER_BUILD=$PWD/build bash tests/run_all.sh
local sweep = require "ember.sweep"
local runner = require "ember.sweep_run"
local report = require "ember.report"

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local EMBER, q, slurp, spit = H.EMBER, H.q, H.slurp, H.spit

local function exists(path) return slurp(path) ~= nil end

-- ember({args...}, cwd) --> stdout, stderr, exit status of `ember ARGS` run in cwd
local function ember(args, cwd) return H.ember(args, {cwd = cwd}) end

local function absolute(path)
  local p = io.popen("cd " .. q(path) .. " && pwd")
  local s = p:read("l")
  p:close()
  return s
end

-- The fake measurement script: `--case` picks what it does.
local FAKE = [[
local case, size, json
for i = 1, #arg do
  if arg[i] == "--case" then case = arg[i + 1] end
  if arg[i] == "--size" then size = tonumber(arg[i + 1]) end
  if arg[i] == "--json" then json = arg[i + 1] end
end
local c = io.open(os.getenv("FAKE_COUNTER"), "a") c:write(case, " ", size, "\n") c:close()
print("fake: case " .. case)
if case == "crash" then error("boom: the kernel exploded") end
if case == "hang" then local t = os.clock() while os.clock() - t < 20 do end end
if case == "oom" then io.stderr:write("out of memory: tried to allocate 80.00 GiB\n") os.exit(1) end
local f = io.open(json, "a")
if case == "jsonoom" then f:write('{"status":"OOM","error":"out of memory in fwd"}\n')
else f:write(('{"status":"ok","ms":%d,"nested":{"k":"v"}}\n'):format(#case * size)) end
f:close()
]]

local CAMPAIGN = [[
return {
  name = "fake",
  script = "fake.lua",
  args = {"--fixed", "1"},
  axes = {
    {name = "case", values = {"a", "crash", "hang", "oom", "jsonoom", "bbb"}},
    {name = "size", values = {1, 2}},
  },
  skip = function(p) return p.size == 2 and p.case ~= "a" and p.case ~= "bbb" and "one size will do" end,
  timeout = 1,
  env = {FAKE_COUNTER = "%s/runs.txt"},
  table = {columns = {"case", "size", "ms", "status"}},
  plots = {{x = "size", y = "ms", series = "case", title = "fake ms"}},
}
]]

-- ---------------------------------------------------------------------------

describe("ember.sweep campaigns", function()
  local base = {script = "s.lua", axes = {{name = "model", values = {"small", "xl"}},
                                           {name = "context", flag = "--ctx", values = {128, 256}}}}
  local function campaign(extra)
    local c = {}
    for k, v in pairs(base) do c[k] = v end
    for k, v in pairs(extra or {}) do c[k] = v end
    return sweep.validate(c, "c.lua", "c.lua")
  end

  it("expands the grid with the first axis slowest and builds each point's arguments", function()
    local pts = sweep.points(campaign{args = {"--steps", 10}})
    assert.equals(4, #pts)
    assert.equals("model=small context=128", pts[1].label)
    assert.equals("model=small context=256", pts[2].label)
    assert.same({"--steps", "10", "--model", "xl", "--ctx", "128"}, pts[3].args)
  end)

  it("passes booleans as a bare flag or nothing, and flag = false as the value alone", function()
    local c = sweep.validate({script = "s.lua", axes = {{name = "graph", values = {false, true}},
      {name = "pos", flag = false, values = {"x"}}}}, "c.lua")
    local pts = sweep.points(c)
    assert.same({"x"}, pts[1].args)
    assert.same({"--graph", "x"}, pts[2].args)
  end)

  it("marks points skip() rejects, with its reason", function()
    local pts = sweep.points(campaign{skip = function(p) return p.model == "xl" and p.context == 256 and "too big" end})
    assert.is_nil(pts[3].skip)
    assert.equals("too big", pts[4].skip)
  end)

  it("fills in defaults: name from the file, --json, a timeout and a table", function()
    local c = campaign()
    assert.equals("c", c.name)
    assert.equals("--json", c.json_flag)
    assert.equals(sweep.DEFAULT_TIMEOUT, c.timeout)
    assert.same({"model", "context", "status"}, {c.table.columns[1], c.table.columns[2], c.table.columns[3]})
  end)

  local bad = {
    {"a non-table", 42, "c.lua: the file: expected to return a campaign table, got number 42"},
    {"no script", {axes = base.axes}, "c.lua: script: expected the path of the script to run (a string), got nothing"},
    {"an axis without values", {script = "s.lua", axes = {{name = "model"}}},
     "c.lua: axes[1] (model).values: expected a non-empty list of values, got nothing"},
    {"an axis with an empty list", {script = "s.lua", axes = {{name = "model", values = {}}}},
     "c.lua: axes[1] (model).values: expected a non-empty list of values, got a table"},
    {"an unknown key", {script = "s.lua", axes = base.axes, axis = {}},
     "c.lua: campaign: unknown key 'axis' (expected one of: args, axes,"},
    {"an unknown axis key", {script = "s.lua", axes = {{name = "m", value = {1}}}},
     "c.lua: axes[1]: unknown key 'value' (expected one of: flag, name, values)"},
    {"a duplicate axis", {script = "s.lua", axes = {{name = "m", values = {1}}, {name = "m", values = {2}}}},
     "c.lua: axes[2].name: expected a name no other axis has, got the string \"m\""},
    {"a bad timeout", {script = "s.lua", axes = base.axes, timeout = "10"},
     "c.lua: timeout: expected seconds per point (a number > 0, or false for none), got the string \"10\""},
    {"a plot without y", {script = "s.lua", axes = base.axes, plots = {{x = "context"}}},
     "c.lua: plots[1].y: expected a field name or a function(row), got nothing"},
  }
  for _, case in ipairs(bad) do
    it("rejects " .. case[1] .. ", saying what it expected and got", function()
      local ok, err = pcall(sweep.validate, case[2], "c.lua", "c.lua")
      assert.is_false(ok)
      assert.equals(case[3], err:sub(1, #case[3]))
    end)
  end

  it("parses --filter against the axes and rejects unknown axes and values", function()
    local c = campaign()
    local f = sweep.parse_filter(c, "model=xl")
    local pts = sweep.points(c)
    assert.is_false(sweep.matches(pts[1], {f}))
    assert.is_true(sweep.matches(pts[3], {f}))
    assert.is_true(sweep.matches(pts[1], {sweep.parse_filter(c, "context=128,256")}))
    assert.has_error(function() sweep.parse_filter(c, "modle=xl") end,
      "--filter modle=xl: no axis 'modle' (axes: model, context)")
    assert.has_error(function() sweep.parse_filter(c, "model=xxl") end,
      "--filter model=xxl: 'xxl' is not a value of axis model (values: small, xl)")
    assert.has_error(function() sweep.parse_filter(c, "model") end,
      "--filter model: expected AXIS=VALUE[,VALUE...]")
  end)

  it("keeps only each point's latest run and calls it done or failed", function()
    local r = function(run, status) return {script = "s.lua", args = {"--a"}, run_id = run, status = status} end
    local latest = sweep.latest({r("1", "crash"), r("2", "ok"), r("2", "OOM")})
    local recs = latest[sweep.key("s.lua", {"--a"})]
    assert.equals(2, #recs)
    assert.equals("done", sweep.state(recs))
    assert.equals("failed", sweep.state(sweep.latest({r("1", "ok"), r("2", "timeout")})[sweep.key("s.lua", {"--a"})]))
    assert.is_nil(sweep.state(nil))
  end)
end)

describe("ember.sweep_run.classify", function()
  it("calls exit 124 under a timeout a timeout", function()
    assert.equals("timeout", runner.classify("exit", 124, {}, "", 1.0, 1).status)
  end)
  it("calls a JSON line ok, whatever the exit status", function()
    assert.equals("ok", runner.classify("exit", 0, {{status = "ok"}}, "", 1, 10).status)
  end)
  it("calls `out of memory` on stderr without a JSON line OOM, keeping the line", function()
    local o = runner.classify("exit", 1, {}, "warming up\nCUDA Out of memory: 2 GiB\n", 1, 10)
    assert.equals("OOM", o.status)
    assert.equals("CUDA Out of memory: 2 GiB", o.error)
  end)
  it("calls a non-zero exit without a JSON line a crash, with stderr's message", function()
    local o = runner.classify("exit", 1, {}, "ember: x.lua:3: boom\nstack traceback:\n\t[C]: in ?\n", 1, 10)
    assert.equals("crash", o.status)
    assert.equals("exit status 1: ember: x.lua:3: boom", o.error)
    assert.matches("SIGSEGV", runner.classify("signal", 11, {}, "", 1, 10).error)
  end)
  it("calls exit 0 without a JSON line an error about json_flag", function()
    local o = runner.classify("exit", 0, {}, "", 1, 10)
    assert.equals("error", o.status)
    assert.matches("json_flag", o.error)
  end)
  it("recognises Ctrl-C", function()
    assert.is_true(runner.classify("exit", 1, {}, "ember: interrupted!", 1, 10).interrupted)
  end)
  it("maps the script's own status: OOM, oom = true, ok", function()
    assert.equals("OOM", runner.script_status({status = "oom"}))
    assert.equals("OOM", runner.script_status({oom = true, status = "ok"}))
    assert.equals("ok", runner.script_status({}))
    assert.equals("error", runner.script_status({status = "error"}))
  end)
end)

describe("ember sweep", function()
  local dir, out, counter

  local function runs()
    local n, list = 0, {}
    for line in (slurp(counter) or ""):gmatch("[^\n]+") do n = n + 1 list[n] = line end
    return n, list
  end

  local function records()
    return report.read_jsonl(out .. "/results.jsonl")
  end

  local function by_point(recs)
    local t = {}
    for _, r in ipairs(recs) do t[r.point] = r end
    return t
  end

  setup(function()
    assert(io.open(EMBER, "rb"), "no executable at " .. EMBER .. " (set EMBER_BUILD)"):close()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. q(dir)))
    dir = absolute(dir)
    out, counter = dir .. "/out", dir .. "/runs.txt"
    spit(dir .. "/fake.lua", FAKE)
    spit(dir .. "/camp.lua", CAMPAIGN:format(dir))
  end)

  teardown(function()
    if dir and dir:match("^/tmp/") and not os.getenv("SWEEP_SPEC_KEEP") then os.execute("rm -rf " .. q(dir)) end
  end)

  it("prints its help with every option", function()
    local o, _, status = ember({"sweep", "--help"})
    assert.equals(0, status)
    for _, word in ipairs({"Usage: ember sweep", "--out", "--dry-run", "--report", "--filter", "--force",
                           "--retry-failed", "--timeout", "docs/sweeps.md"}) do
      assert.truthy(o:find(word, 1, true), "help lacks " .. word)
    end
  end)

  it("lists points and commands with --dry-run, running and writing nothing", function()
    local o, _, status = ember({"sweep", dir .. "/camp.lua", "--out", out, "--dry-run"})
    assert.equals(0, status)
    assert.truthy(o:find("[1/12] case=a size=1", 1, true))
    assert.truthy(o:find("ember run fake.lua --fixed 1 --case a --size 1", 1, true))
    assert.truthy(o:find("skip: one size will do", 1, true))
    assert.truthy(o:find("12 points: 8 to run", 1, true))
    assert.is_false(exists(counter))
    assert.is_false(exists(out .. "/results.jsonl"))
  end)

  it("runs every point, records crash, timeout and OOM, and goes on", function()
    local o, _, status = ember({"sweep", dir .. "/camp.lua", "--out", out})
    assert.equals(1, status)                          -- some points failed
    assert.equals(8, (runs()))                        -- the points after the crash ran too
    local recs, problems = records()
    assert.equals(0, #problems)
    assert.equals(8, #recs)
    local p = by_point(recs)
    assert.equals("ok", p["case=a size=1"].status)
    assert.equals(2, p["case=a size=2"].ms)
    assert.equals("v", p["case=a size=2"]["nested.k"])
    assert.equals("crash", p["case=crash size=1"].status)
    assert.matches("boom: the kernel exploded", p["case=crash size=1"].error)
    assert.equals("timeout", p["case=hang size=1"].status)
    assert.equals("OOM", p["case=oom size=1"].status)
    assert.equals("OOM", p["case=jsonoom size=1"].status)
    assert.equals("out of memory in fwd", p["case=jsonoom size=1"].error)
    assert.equals("ok", p["case=bbb size=2"].status)
    -- every record: campaign, axis values, arguments, status, wall time, runinfo, command
    local r = p["case=bbb size=2"]
    assert.equals("fake", r.campaign)
    assert.equals(2, r.size)
    assert.same({"--fixed", "1", "--case", "bbb", "--size", "2"}, r.args)
    assert.is_number(r.wall_s)
    for _, k in ipairs({"commit", "device", "date", "host", "command", "log"}) do assert.is_string(r[k], k) end
    assert.matches("%[5/8%] case=oom size=1 %.%.%. OOM [%d.]+ s  %(done 5, ok 2, OOM 1, failed 2, ETA ", o)
  end)

  it("writes results.csv, results.md, one SVG per plot and a log per point", function()
    local csv = slurp(out .. "/results.csv")
    assert.truthy(csv:find("case,size,ms,status\r\na,1,1,ok\r\n", 1, true))
    local md = slurp(out .. "/results.md")
    assert.truthy(md:find("| crash   |    1 |     | crash   |", 1, true))
    assert.truthy(md:find("ember sweep --report", 1, true))
    assert.truthy(md:find("commit: ", 1, true))
    assert.truthy(md:find("## Failures", 1, true))
    local svg = slurp(out .. "/ms_vs_size.svg")
    assert.truthy(svg and svg:find("<svg", 1, true))
    assert.truthy(svg:find(">bbb<", 1, true))
    local log = slurp(out .. "/logs/case=crash_size=1.log")
    assert.truthy(log:find("fake: case crash", 1, true))
    assert.truthy(log:find("--- stderr ---", 1, true))
  end)

  it("resumes: a second run starts no process for points with a result", function()
    local o, _, status = ember({"sweep", dir .. "/camp.lua", "--out", out})
    assert.equals(0, status)
    assert.equals(8, (runs()))
    assert.truthy(o:find("6 points already done", 1, true))
    assert.truthy(o:find("2 points failed earlier", 1, true))
  end)

  it("reruns failed points with --retry-failed (only those the filter keeps)", function()
    local _, _, status = ember({"sweep", dir .. "/camp.lua", "--out", out, "--retry-failed", "--filter", "case=crash,a"})
    assert.equals(1, status)
    local n, list = runs()
    assert.equals(9, n)
    assert.equals("crash 1", list[9])
  end)

  it("reruns every kept point with --force, and the report shows the latest run", function()
    local before = #records()
    local _, _, status = ember({"sweep", dir .. "/camp.lua", "--out", out, "--force", "--filter", "case=a,bbb"})
    assert.equals(0, status)
    assert.equals(13, (runs()))
    assert.equals(before + 4, #records())              -- appended, history kept
    local md = slurp(out .. "/results.md")
    local _, rows = md:gsub("\n| a ", "")
    assert.equals(2, rows)                              -- not four: one row per point
  end)

  it("rewrites the reports with --report without running anything", function()
    os.remove(out .. "/results.md")
    os.remove(out .. "/results.csv")
    local o, _, status = ember({"sweep", "--report", dir .. "/camp.lua", "--out", out})
    assert.equals(0, status)
    assert.equals(13, (runs()))
    assert.truthy(exists(out .. "/results.md"))
    assert.truthy(exists(out .. "/results.csv"))
    assert.truthy(o:find("report (8 results)", 1, true))
  end)

  it("survives a truncated last line in results.jsonl, warning about it", function()
    local f = assert(io.open(out .. "/results.jsonl", "ab"))
    f:write('{"campaign":"fake","point":"case=a size=1","sta')
    f:close()
    local _, e, status = ember({"sweep", dir .. "/camp.lua", "--out", out, "--force", "--filter", "case=a", "--filter", "size=1"})
    assert.equals(0, status)
    assert.matches("warning: .*truncated last line skipped", e)
    local recs, problems = records()
    assert.equals(1, #problems)                          -- the cut line, now in the middle
    assert.equals("case=a size=1", recs[#recs].point)   -- the new record is whole
  end)

  it("finds the script relative to the campaign file and runs with a real bench_model", function()
    local ex = out .. "-example"
    local o, e, status = ember({"sweep", "examples/sweep_campaign.lua", "--out", ex,
      "--filter", "mode=fwd", "--filter", "context=16"})
    assert.equals(0, status, o .. e)
    local recs = assert(report.read_jsonl(ex .. "/results.jsonl"))
    assert.equals(1, #recs)
    assert.equals("ok", recs[1].status)
    assert.is_number(recs[1].mean_ms)
    assert.equals("tiny", recs[1]["config.model"])
    assert.truthy(exists(ex .. "/mean_ms_vs_context.svg"))
  end)

  describe("refuses bad input with status 2 and a message", function()
    local cases = {
      {"an unknown option", {"--bogus"}, "unknown option '--bogus'"},
      {"no campaign", {}, "missing argument 'campaign'"},
      {"a filter on no axis", {"--filter", "mode=x"}, "--filter mode=x: no axis 'mode' (axes: case, size)"},
      {"a bad --timeout", {"--timeout", "soon"}, "--timeout: expected seconds >= 0, got soon"},
    }
    for _, c in ipairs(cases) do
      it(c[1], function()
        local args = {"sweep"}
        if c[1] ~= "no campaign" then args[2] = dir .. "/camp.lua" end
        for _, a in ipairs(c[2]) do args[#args + 1] = a end
        local _, e, status = ember(args)
        assert.equals(2, status)
        assert.truthy(e:find("ember sweep: " .. c[3], 1, true), e)
      end)
    end

    it("a campaign file that is not there", function()
      local _, e, status = ember({"sweep", dir .. "/nope.lua"})
      assert.equals(2, status)
      assert.truthy(e:find("cannot load the campaign: cannot open " .. dir .. "/nope.lua", 1, true), e)
    end)

    it("a campaign that returns no table", function()
      spit(dir .. "/bad.lua", "return 'model_sizes'")
      local _, e, status = ember({"sweep", dir .. "/bad.lua"})
      assert.equals(2, status)
      assert.truthy(e:find("bad.lua: the file: expected to return a campaign table, got the string \"model_sizes\"", 1, true), e)
    end)

    it("a campaign whose script does not exist", function()
      spit(dir .. "/noscript.lua", "return {script = 'missing.lua', axes = {{name = 'a', values = {1}}}}")
      local _, e, status = ember({"sweep", dir .. "/noscript.lua", "--out", dir .. "/o2"})
      assert.equals(2, status)
      assert.truthy(e:find("script missing.lua not found (looked at missing.lua, " .. dir .. "/missing.lua", 1, true), e)
    end)
  end)

  it("has shipped campaigns that load and expand", function()
    for name, n in pairs({model_sizes = 120, warmup = 16, attention_grid = 60}) do
      local c = sweep.load("scripts/campaigns/" .. name .. ".lua")
      assert.equals(n, #sweep.points(c), name)
    end
    assert.equals(6, #sweep.points(sweep.load("examples/sweep_campaign.lua")))
  end)
end)
