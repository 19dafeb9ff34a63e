--- ember.sweep_run: one point of a campaign, run as its own process
--   <ember> run SCRIPT ARGS... --json TMPFILE
-- under coreutils `timeout`, so a crash, a hang or an out-of-memory in one
-- configuration is a recorded result and never takes the campaign down.
-- The outcome is classified here (ok, OOM, timeout, crash, error); the
-- campaign loop that calls this is bindings/ember/sweep_cli.lua.
local report = require "ember.report"
local sweep = require "ember.sweep"
local M = {}

-- Seconds to wait after the timeout's SIGTERM before SIGKILL.
M.KILL_AFTER = 10

function M.q(s)
  s = tostring(s)
  if s:match("^[%w%._/=:+,-]+$") then return s end
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

local function sh(cmd)
  local f = io.popen(cmd .. " 2>/dev/null")
  if not f then return nil end
  local out = f:read("a"):gsub("%s+$", "")
  f:close()
  return out ~= "" and out or nil
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return "" end
  local s = f:read("a")
  f:close()
  return s
end

--- Monotonic seconds (ember.core.clock), or whole seconds without the core.
function M.clock()
  local ok, core = pcall(require, "ember.core")
  if ok and core.clock then return core.clock() end
  return os.time()
end

local function looks_like_ember(path)
  return path and path:match("([^/]+)$"):match("^ember") ~= nil
end

--- The ember executable that runs each point: $EMBER_EXE, else the process
-- running this code when it is an ember (so a build-tree ember sweeps with
-- itself), else argv[0] when it names an ember, else `ember` on PATH.
function M.find_exe()
  local env = os.getenv("EMBER_EXE")
  if env and env ~= "" then return env end
  -- popen's shell is our child: its $PPID is this process
  local self = sh("readlink /proc/$PPID/exe")
  if self then self = self:gsub(" %(deleted%)$", "") end
  if looks_like_ember(self) then return self end
  local argv0 = arg and arg[-1]
  if type(argv0) == "string" and argv0:find("/") and looks_like_ember(argv0) then
    return sh("readlink -f " .. M.q(argv0)) or argv0
  end
  return "ember"
end

--- Where the campaign's script is: as given (relative to the working
-- directory), else next to the campaign file, else at the root of the
-- campaign file's git checkout. Returns path, or nil and the places tried.
function M.resolve_script(c)
  local s = c.script
  if s:sub(1, 1) == "/" then return exists(s) and s or nil, {s} end
  local tried = {s}
  if exists(s) then return s, tried end
  local dir = c.source and c.source:match("^(.*)/[^/]*$") or "."
  local candidates = {dir .. "/" .. s}
  local root = sh("git -C " .. M.q(dir) .. " rev-parse --show-toplevel")
  if root then candidates[#candidates + 1] = root .. "/" .. s end
  for _, p in ipairs(candidates) do
    tried[#tried + 1] = p
    if exists(p) then return p, tried end
  end
  return nil, tried
end

--- The command a person would type to reproduce the point (no JSON file).
function M.display_command(c, point)
  local parts = {"ember", "run", M.q(c.script)}
  for _, a in ipairs(point.args) do parts[#parts + 1] = M.q(a) end
  return table.concat(parts, " ")
end

local function shell_command(c, point, o)
  local parts = {}
  local env = {}
  for k, v in pairs(c.env) do env[#env + 1] = k .. "=" .. M.q(v) end
  table.sort(env)
  if #env > 0 then parts[1] = "env " .. table.concat(env, " ") end
  if o.timeout then
    parts[#parts + 1] = ("timeout --foreground -k %d %s"):format(M.KILL_AFTER, sweep.value_string(o.timeout))
  end
  parts[#parts + 1] = M.q(o.exe) .. " run " .. M.q(o.script)
  for _, a in ipairs(point.args) do parts[#parts + 1] = M.q(a) end
  if c.json_flag:sub(-1) == "=" then parts[#parts + 1] = M.q(c.json_flag .. o.json)
  else parts[#parts + 1] = M.q(c.json_flag) .. " " .. M.q(o.json) end
  return table.concat(parts, " ") .. " </dev/null >" .. M.q(o.stdout) .. " 2>" .. M.q(o.stderr)
end

local function last_lines(text, n, max_chars)
  local lines = {}
  for line in text:gmatch("[^\n]+") do
    if line:match("%S") then lines[#lines + 1] = line end
  end
  local tail = table.concat(lines, "\n", math.max(1, #lines - n + 1))
  if #tail > max_chars then tail = "..." .. tail:sub(-max_chars) end
  return tail
end

local SIGNALS = {[2] = "SIGINT", [6] = "SIGABRT", [9] = "SIGKILL", [11] = "SIGSEGV", [15] = "SIGTERM",
                 [7] = "SIGBUS", [8] = "SIGFPE"}

--- A script's own status as a campaign status: "OOM" for status OOM/oom or
-- oom = true, "ok" for ok or none, anything else as it is.
function M.script_status(rec)
  if rec.oom == true then return "OOM" end
  local s = rec.status
  if s == nil or report.missing(s) then return "ok" end
  s = tostring(s)
  if s:lower() == "oom" then return "OOM" end
  if s:lower() == "ok" then return "ok" end
  return s
end

--- Classifies a finished process. `kind`, `code` are os.execute's "exit" or
-- "signal" and the number; `lines` the JSON records the script wrote.
-- Returns {status=, error=, interrupted=}, status for the point as a whole
-- (the records keep their own when the script wrote some).
function M.classify(kind, code, lines, stderr, wall, timeout)
  if (kind == "signal" and code == 2) or (kind == "exit" and code == 130)
     or last_lines(stderr, 1, 200):match("interrupted!$") then
    return {status = "interrupted", interrupted = true, error = "interrupted (Ctrl-C)"}
  end
  if kind == "exit" and timeout and (code == 124 or (code == 137 and wall >= timeout)) then
    return {status = "timeout", error = ("no result after %s s (timeout)"):format(sweep.value_string(timeout))}
  end
  if #lines > 0 then return {status = "ok"} end
  local at = stderr:lower():find("out of memory", 1, true)
  if at then
    local from = (stderr:sub(1, at):match(".*\n()") or 1)
    return {status = "OOM", error = stderr:sub(from):match("[^\n]*")}
  end
  if kind == "signal" or code ~= 0 then
    local how = kind == "signal" and ("killed by signal %d%s"):format(code, SIGNALS[code] and
      (" (" .. SIGNALS[code] .. ")") or "") or ("exit status %d"):format(code)
    if kind == "exit" and code > 128 then
      how = how .. (SIGNALS[code - 128] and (" (" .. SIGNALS[code - 128] .. ")") or "")
    end
    -- the message, not the Lua traceback under it
    local tail = last_lines(stderr:gsub("\nstack traceback:\n.*", ""), 8, 1200)
    return {status = "crash", error = how .. (tail ~= "" and (": " .. tail) or ", nothing on stderr")}
  end
  return {status = "error", error = "exited 0 without writing a JSON line (does the script take " ..
    "the campaign's json_flag?)"}
end

--- A file name for a point's log: "model=xl_context=512".
function M.safe_name(label)
  return (label:gsub(" ", "_"):gsub("[^%w%._=%-]", "-"))
end

--- Runs one point. o = {exe=, script= (resolved path), outdir=, timeout=
-- (seconds or nil)}. Returns the outcome {status=, error=, wall_s=,
-- exit_code=, interrupted=, lines = {script JSON records}, log=}.
function M.run_point(c, point, o)
  local tmp = {json = os.tmpname(), stdout = os.tmpname(), stderr = os.tmpname()}
  local opts = {exe = o.exe, script = o.script, timeout = o.timeout, json = tmp.json,
                stdout = tmp.stdout, stderr = tmp.stderr}
  local cmd = shell_command(c, point, opts)
  local t0 = M.clock()
  local _, kind, code = os.execute(cmd)
  local wall = M.clock() - t0
  local lines, problems = report.read_jsonl(tmp.json)
  lines, problems = lines or {}, problems or {}
  local out, err = slurp(tmp.stdout), slurp(tmp.stderr)
  for _, p in pairs(tmp) do os.remove(p) end
  local outcome = M.classify(kind, code, lines, err, wall, o.timeout)
  outcome.wall_s, outcome.exit_code, outcome.lines = wall, kind == "exit" and code or 128 + code, lines
  outcome.problems = problems
  -- the log: the exact command, both streams, and what the sweep made of them
  local log_rel = "logs/" .. M.safe_name(point.label) .. ".log"
  local f = io.open(o.outdir .. "/" .. log_rel, "wb")
  if f then
    f:write("$ ", cmd, "\n", out, out:match("\n$") and "" or "\n", "--- stderr ---\n", err,
      err:match("\n$") and "" or "\n", ("--- %s, %s %d, %.1f s ---\n"):format(outcome.status,
      kind == "signal" and "signal" or "exit", code, wall))
    for _, p in ipairs(problems) do f:write(p, "\n") end
    f:close()
    outcome.log = log_rel
  end
  return outcome
end

return M
