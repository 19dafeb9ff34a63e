--- ember.sweep_cli: `ember sweep CAMPAIGN.lua` (bindings/cli/ember_main.c
-- calls main(arg)). Runs every point of a campaign that has no result yet,
-- one process each, appending to OUTDIR/results.jsonl, and rewrites the
-- CSV, Markdown and SVG reports at the end. docs/sweeps.md is the manual.
local argparse = require "argparse"
local report = require "ember.report"
local sweep = require "ember.sweep"
local runner = require "ember.sweep_run"
local sweep_report = require "ember.sweep_report"
local M = {}

local function parser()
  local p = argparse("ember sweep",
    "Run a campaign: every combination of its axes' values through one script, each in its own " ..
    "process with a timeout. Results are appended to OUTDIR/results.jsonl; points that already " ..
    "have one are skipped, so an interrupted campaign resumes where it stopped. At the end " ..
    "results.csv, results.md and one SVG per plot are written. Format: docs/sweeps.md.")
  p:help_max_width(100)
  p:epilog("Examples:\n" ..
    "   ember sweep examples/sweep_campaign.lua                  run (or resume) a campaign\n" ..
    "   ember sweep scripts/campaigns/model_sizes.lua --dry-run  list points, states, commands\n" ..
    "   ember sweep C.lua --filter model=xl,2.7b --force         rerun some points\n" ..
    "   ember sweep --report C.lua                               rewrite CSV/Markdown/SVG only")
  p:argument("campaign", "Campaign file: a Lua file returning a table (docs/sweeps.md).")
  p:option("--out", "Output folder (default: sweeps/<campaign name>).")
    :argname("<dir>")
  p:flag("--dry-run", "List the points, their state and commands; run nothing, write nothing.")
  p:flag("--report", "Only rewrite results.csv, results.md and the plots from results.jsonl.")
  p:option("--filter", "Only points with these axis values (AXIS=V[,V...]; repeatable, all must match).")
    :count("*"):argname("<axis=values>")
  p:flag("--force", "Rerun points that already have a result.")
  p:flag("--retry-failed", "Rerun points whose last run failed (crash, timeout, error); " ..
    "by default they are kept and skipped like finished ones.")
  p:option("--timeout", "Seconds per point, overriding the campaign's (0: none).")
    :argname("<seconds>")
  return p
end

local function fail(msg, status)
  io.stderr:write("ember sweep: ", msg, "\n")
  return status or 2
end

local function duration(s)
  s = math.floor(s + 0.5)
  if s < 60 then return ("%ds"):format(s) end
  if s < 3600 then return ("%dm%02ds"):format(s // 60, s % 60) end
  return ("%dh%02dm"):format(s // 3600, s % 3600 // 60)
end

-- What to do with each point: "run", or why not.
local function plan(points, latest, filters, a)
  local todo, n = {}, {done = 0, failed = 0, skip = 0, filtered = 0}
  for _, p in ipairs(points) do
    local state, status = sweep.state(latest[p.key])
    if p.skip then p.plan = "skip: " .. p.skip n.skip = n.skip + 1
    elseif not sweep.matches(p, filters) then p.plan = "filtered out" n.filtered = n.filtered + 1
    elseif state == "done" and not a.force then p.plan = "done (" .. status .. ")" n.done = n.done + 1
    elseif state == "failed" and not (a.force or a.retry_failed) then
      p.plan = "failed earlier (" .. status .. "; --retry-failed reruns it)"
      n.failed = n.failed + 1
    else
      p.plan = "run"
      todo[#todo + 1] = p
    end
  end
  return todo, n
end

local function load_results(path)
  local f = io.open(path, "rb")
  if not f then return {} end
  f:close()
  local records, problems = report.read_jsonl(path)
  for _, msg in ipairs(problems or {}) do io.stderr:write("ember sweep: warning: ", msg, "\n") end
  return records or {}
end

local function mkdir(path)
  local ok = os.execute("mkdir -p " .. runner.q(path))
  if not ok then error("cannot create the folder " .. path, 0) end
end

-- One record per JSON line the script wrote (one record when it wrote none):
-- its own fields, the outcome, then the point's facts (which win).
local function records_of(c, p, outcome, run_id)
  local config = {campaign = c.name, point = p.label, script = c.script, args = p.args,
                  command = runner.display_command(c, p)}
  for k, v in pairs(p.values) do config[k] = v end
  local lines = #outcome.lines > 0 and outcome.lines or {{}}
  local out = {}
  for i, line in ipairs(lines) do
    local results = {}
    for k, v in pairs(line) do results[k] = v end
    results.status = outcome.status == "ok" and runner.script_status(line) or outcome.status
    if report.missing(line.error) then results.error = outcome.error end
    results.wall_s, results.exit_code = outcome.wall_s, outcome.exit_code
    results.log, results.run_id = outcome.log, run_id
    out[i] = report.record(config, results, c.device)
  end
  return out
end

-- The point's status on the progress line: the worst of its records.
local function point_status(records)
  local s = "ok"
  for _, r in ipairs(records) do
    if not sweep.DONE[r.status] then return r.status end
    if r.status == "OOM" then s = "OOM" end
  end
  return s
end

local function write_reports(c, o, points)
  local latest = sweep.latest(load_results(o.outdir .. "/results.jsonl"))
  local rows = sweep_report.rows(points, latest)
  local files = sweep_report.write(c, o, points, rows)
  for i, f in ipairs(files) do files[i] = o.outdir .. "/" .. f end
  print(("report (%d results): %s"):format(#rows, table.concat(files, ", ")))
end

local function run_points(c, o, todo, total_points)
  local exe = runner.find_exe()
  local timeout = o.timeout
  if timeout and not os.execute("command -v timeout >/dev/null 2>&1") then
    io.stderr:write("ember sweep: warning: no `timeout` command (coreutils): points run without a time limit\n")
    timeout = nil
  end
  mkdir(o.outdir .. "/logs")
  print(("sweep %s: %d points, %d to run, with %s; timeout %s; results in %s/results.jsonl")
    :format(c.name, total_points, #todo, exe, timeout and (sweep.value_string(timeout) .. " s") or "none",
      o.outdir))
  io.stdout:flush()
  local n = {done = 0, ok = 0, OOM = 0, failed = 0}
  local spent = 0
  local run_base = os.date("!%Y%m%dT%H%M%SZ") .. ("-%06x"):format(math.random(0, 0xffffff))
  for k, p in ipairs(todo) do
    io.write(("[%d/%d] %s ... "):format(k, #todo, p.label))
    io.stdout:flush()
    local outcome = runner.run_point(c, p, {exe = exe, script = o.script, outdir = o.outdir, timeout = timeout})
    if outcome.interrupted then
      print("interrupted")
      return n, true
    end
    local recs = records_of(c, p, outcome, run_base .. "-" .. p.index)
    for _, r in ipairs(recs) do report.append_jsonl(o.outdir .. "/results.jsonl", r) end
    local status = point_status(recs)
    n.done, spent = n.done + 1, spent + outcome.wall_s
    if status == "ok" then n.ok = n.ok + 1
    elseif status == "OOM" then n.OOM = n.OOM + 1
    else n.failed = n.failed + 1 end
    local left = #todo - k
    print(("%s %.1f s  (done %d, ok %d,%s failed %d%s)"):format(status, outcome.wall_s, n.done, n.ok,
      n.OOM > 0 and (" OOM %d,"):format(n.OOM) or "", n.failed,
      left > 0 and (", ETA " .. duration(spent / k * left)) or ""))
    if status ~= "ok" and outcome.error then
      local first = tostring(outcome.error):gsub("\n.*", "")
      print(("    %s (%s/%s)"):format(first:sub(1, 200), o.outdir, outcome.log or "logs"))
    end
    io.stdout:flush()
  end
  return n, false
end

local function dry_run(c, points, todo, n, o)
  local width = 0
  for _, p in ipairs(points) do width = math.max(width, #p.label) end
  for _, p in ipairs(points) do
    print(("[%d/%d] %-" .. width .. "s  %s"):format(p.index, #points, p.label, p.plan))
    if p.plan == "run" then print("        " .. runner.display_command(c, p)) end
  end
  print(("%d points: %d to run, %d done, %d failed earlier, %d skipped by skip(), %d filtered out (results: %s)")
    :format(#points, #todo, n.done, n.failed, n.skip, n.filtered, o.outdir .. "/results.jsonl"))
  if not o.script then
    print(("warning: the script %s is not there yet (looked at %s)"):format(c.script, table.concat(o.tried, ", ")))
  end
  return 0
end

function M.main(argv)
  local ok, a = parser():pparse(argv)
  if not ok then return fail(a .. "\nTry 'ember sweep --help' for more information.") end
  local lok, c = pcall(sweep.load, a.campaign)
  if not lok then return fail(tostring(c)) end
  local filters = {}
  for _, spec in ipairs(a.filter or {}) do
    local fok, f = pcall(sweep.parse_filter, c, spec)
    if not fok then return fail(tostring(f)) end
    filters[#filters + 1] = f
  end
  local o = {outdir = a.out or ("sweeps/" .. c.name), out_given = a.out ~= nil, timeout = c.timeout or nil}
  o.outdir = o.outdir:gsub("/+$", "")
  if a.timeout then
    local t = tonumber(a.timeout)
    if not t or t < 0 then return fail("--timeout: expected seconds >= 0, got " .. a.timeout) end
    o.timeout = t > 0 and t or nil
  end
  local pok, points = pcall(sweep.points, c)
  if not pok then return fail(tostring(points)) end
  local results = o.outdir .. "/results.jsonl"

  if a.report then
    if not io.open(results, "rb") then
      return fail(("--report: no results yet (%s does not exist)"):format(results), 1)
    end
    write_reports(c, o, points)
    return 0
  end

  local todo, n = plan(points, sweep.latest(load_results(results)), filters, a)
  o.script, o.tried = runner.resolve_script(c)
  if a.dry_run then return dry_run(c, points, todo, n, o) end
  if not o.script then
    return fail(("%s: script %s not found (looked at %s)"):format(c.source, c.script, table.concat(o.tried, ", ")))
  end
  if n.done > 0 then
    print(("%d points already done in %s: kept (--force reruns them)"):format(n.done, results))
  end
  if n.failed > 0 then
    print(("%d points failed earlier: kept (--retry-failed reruns them)"):format(n.failed))
  end
  local okrun, counts, interrupted = pcall(run_points, c, o, todo, #points)
  if not okrun then return fail(tostring(counts), 1) end
  write_reports(c, o, points)
  if interrupted then return 130 end
  if #todo > 0 then
    print(("sweep %s: ran %d points: %d ok, %d OOM, %d failed"):format(c.name, counts.done, counts.ok,
      counts.OOM, counts.failed))
  end
  return counts.failed > 0 and 1 or 0
end

return M
