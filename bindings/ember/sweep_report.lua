--- ember.sweep_report: a campaign's human outputs, regenerated from its
-- results.jsonl at the end of every run and by `ember sweep --report`:
-- results.csv, results.md (table, provenance, failures, the commands that
-- regenerate it) and one SVG per plot spec. The JSON lines stay the source
-- of truth; everything here can be deleted and rebuilt.
local report = require "ember.report"
local sweep = require "ember.sweep"
local M = {}

--- The records to report: the latest run of every grid point that has one,
-- in grid order (points skip() excludes are left out).
function M.rows(points, latest)
  local rows = {}
  for _, p in ipairs(points) do
    if not p.skip then
      for _, r in ipairs(latest[p.key] or {}) do rows[#rows + 1] = r end
    end
  end
  return rows
end

local function counts(rows, field)
  local n, order = {}, {}
  for _, r in ipairs(rows) do
    local v = r[field]
    if not report.missing(v) then
      v = tostring(v)
      if not n[v] then order[#order + 1] = v end
      n[v] = (n[v] or 0) + 1
    end
  end
  local parts = {}
  for i, v in ipairs(order) do parts[i] = #order > 1 and ("%s (%d)"):format(v, n[v]) or v end
  return #parts > 0 and table.concat(parts, "; ") or "unknown"
end

local function date_range(rows)
  local lo, hi
  for _, r in ipairs(rows) do
    if type(r.date) == "string" then
      if not lo or r.date < lo then lo = r.date end
      if not hi or r.date > hi then hi = r.date end
    end
  end
  if not lo then return "unknown" end
  return lo == hi and lo or (lo .. " to " .. hi)
end

local function plot_file(p, i, used)
  local name = p.file
  if not name then
    name = type(p.y) == "string" and type(p.x) == "string" and (p.y .. "_vs_" .. p.x) or ("plot" .. i)
    name = name:gsub("[^%w%._%-]", "_") .. ".svg"
  end
  if used[name] then name = name:gsub("%.svg$", "") .. "_" .. i .. ".svg" end
  used[name] = true
  return name
end

local function plot_rows(p, rows)
  local out = {}
  for _, r in ipairs(rows) do
    local keep = true
    if type(p.where) == "function" then keep = p.where(r)
    elseif type(p.where) == "table" then
      for k, v in pairs(p.where) do
        if sweep.value_string(r[k]) ~= sweep.value_string(v) then keep = false end
      end
    end
    if keep then out[#out + 1] = r end
  end
  if p.rows then out = p.rows(out) end
  return out
end

--- The shell words that rerun this report ("ember sweep --report C --out D").
function M.commands(c, o)
  local q = require("ember.sweep_run").q
  local out = o.out_given and (" --out " .. q(o.outdir)) or ""
  return ("ember sweep --report %s%s"):format(q(c.source or "CAMPAIGN.lua"), out),
         ("ember sweep %s%s"):format(q(c.source or "CAMPAIGN.lua"), out)
end

local function markdown(c, o, points, rows, plots)
  local md = {("# Sweep `%s`"):format(c.name), ""}
  if c.description then md[#md + 1] = c.description md[#md + 1] = "" end
  local fixed = {}
  for i, a in ipairs(c.args) do fixed[i] = sweep.value_string(a) end
  local status_n, failed, in_grid, skipped = {}, {}, 0, 0
  for _, p in ipairs(points) do
    if p.skip then skipped = skipped + 1 else in_grid = in_grid + 1 end
  end
  for _, r in ipairs(rows) do
    local s = tostring(r.status)
    status_n[s] = (status_n[s] or 0) + 1
    if not sweep.DONE[s] then failed[#failed + 1] = r end
  end
  local st = {}
  for _, s in ipairs({"ok", "OOM", "timeout", "crash", "error"}) do
    if status_n[s] then st[#st + 1] = ("%d %s"):format(status_n[s], s) status_n[s] = nil end
  end
  for s, n in pairs(status_n) do st[#st + 1] = ("%d %s"):format(n, s) end
  table.insert(fixed, 1, c.script)
  md[#md + 1] = ("- campaign: `%s` runs `%s` over %s"):format(c.source or c.name,
    table.concat(fixed, " "), (function()
      local ax = {}
      for i, a in ipairs(c.axes) do ax[i] = ("%s (%d)"):format(a.name, #a.values) end
      return table.concat(ax, " × ")
    end)())
  md[#md + 1] = ("- points: %d in the grid%s; %d results: %s"):format(in_grid,
    skipped > 0 and (" (%d more left out by skip())"):format(skipped) or "", #rows,
    #st > 0 and table.concat(st, ", ") or "none yet")
  md[#md + 1] = "- device: " .. counts(rows, "device") ..
    (counts(rows, "driver") ~= "unknown" and (", driver " .. counts(rows, "driver")) or "")
  md[#md + 1] = "- commit: " .. counts(rows, "commit") .. ", ember " .. counts(rows, "ember") ..
    ", host " .. counts(rows, "host")
  md[#md + 1] = "- date: " .. date_range(rows)
  md[#md + 1] = ""
  md[#md + 1] = report.markdown_table(c.table.columns, rows)
  if #plots > 0 then
    md[#md + 1] = "## Plots"
    md[#md + 1] = ""
    for _, p in ipairs(plots) do md[#md + 1] = ("![%s](%s)"):format(p.title, p.file) md[#md + 1] = "" end
  end
  if #failed > 0 then
    md[#md + 1] = "## Failures"
    md[#md + 1] = ""
    for _, r in ipairs(failed) do
      local err = report.missing(r.error) and "" or tostring(r.error):gsub("\n", " ⏎ ")
      if #err > 300 then err = err:sub(1, 300) .. "..." end
      md[#md + 1] = ("- `%s`: **%s** %s%s"):format(tostring(r.point), tostring(r.status), err,
        report.missing(r.log) and "" or (" ([log](%s))"):format(r.log))
    end
    md[#md + 1] = ""
  end
  local regen, rerun = M.commands(c, o)
  md[#md + 1] = "Regenerate this report from results.jsonl: `" .. regen .. "`  "
  md[#md + 1] = "Run the points still missing (finished ones are kept): `" .. rerun .. "`"
  return table.concat(md, "\n") .. "\n"
end

--- Writes results.csv, results.md and the plots into o.outdir; returns the
-- file names written.
function M.write(c, o, points, rows)
  local dir = o.outdir
  local written = {}
  report.write_csv(dir .. "/results.csv", c.table.columns, rows)
  written[#written + 1] = "results.csv"
  local plots, used = {}, {}
  for i, p in ipairs(c.plots) do
    local file = plot_file(p, i, used)
    local title = p.title or (type(p.y) == "string" and type(p.x) == "string" and (p.y .. " vs " .. p.x))
      or ("plot " .. i)
    local svg = report.svg_lines{rows = plot_rows(p, rows), x = p.x, y = p.y, series = p.series,
      facet = p.facet, xlog = p.xlog, ylog = p.ylog, title = title, xlabel = p.xlabel,
      ylabel = p.ylabel, width = p.width, height = p.height, share = p.share,
      panels_per_row = p.panels_per_row}
    report.write_file(dir .. "/" .. file, svg)
    plots[#plots + 1] = {title = title, file = file}
    written[#written + 1] = file
  end
  report.write_file(dir .. "/results.md", markdown(c, o, points, rows, plots))
  table.insert(written, 2, "results.md")
  return written
end

return M
