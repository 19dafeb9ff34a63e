--- ember.runinfo: the facts every result line carries, so a number can be
-- traced to the code, the machine and the moment that produced it.
--   runinfo.collect(device) --> {commit=, device=, driver=, date=, ember=, host=}
-- `device` is "cpu", "cuda" or "cuda:N" (default: cuda when available).
-- EMBER_COMMIT overrides the git lookup (hosts whose checkout has no .git).
local M = {}

--- Run a shell command, return its trimmed output or nil.
function M.sh(cmd)
  local f = io.popen(cmd .. " 2>/dev/null")
  if not f then return nil end
  local out = f:read("a")
  f:close()
  out = out and out:gsub("%s+$", "") or ""
  return out ~= "" and out or nil
end

--- Short git commit of the working directory, "+dirty" when tracked files changed.
function M.git_commit()
  local env = os.getenv("EMBER_COMMIT")
  if env and env ~= "" then return env end
  local c = M.sh("git rev-parse --short HEAD") or "unknown"
  if M.sh("git status --porcelain --untracked-files=no") then c = c .. "+dirty" end
  return c
end

local function cpu_name()
  local f = io.open("/proc/cpuinfo")
  if f then
    for line in f:lines() do
      local m = line:match("^model name%s*:%s*(.+)")
      if m then f:close() return "cpu (" .. m .. ")" end
    end
    f:close()
  end
  return "cpu"
end

local function gpu_index(device)
  return tonumber(device:match("^cuda:(%d+)")) or 0
end

--- Human name of a device: "NVIDIA H100 80GB HBM3", "cpu (AMD EPYC ...)".
function M.device_name(device)
  if not device:match("^cuda") then return cpu_name() end
  local ok, ember = pcall(require, "ember")
  if ok and ember.cuda and ember.cuda.get_device_name then
    local ok2, name = pcall(ember.cuda.get_device_name, gpu_index(device))
    if ok2 and name then return name end
  end
  return M.sh(("nvidia-smi --query-gpu=name --format=csv,noheader -i %d"):format(gpu_index(device)))
    or "cuda (unknown)"
end

--- NVIDIA driver version, or nil on a CPU device.
function M.driver_version(device)
  if not device:match("^cuda") then return nil end
  return M.sh(("nvidia-smi --query-gpu=driver_version --format=csv,noheader -i %d")
    :format(gpu_index(device)))
end

local cache = {}

--- All facts for `device`, computed once per device per process.
function M.collect(device)
  if device == nil then
    local ok, ember = pcall(require, "ember")
    device = (ok and ember.cuda and ember.cuda.is_available()) and "cuda" or "cpu"
  end
  if not cache[device] then
    local ok, ember = pcall(require, "ember")
    cache[device] = {
      commit = M.git_commit(), device = M.device_name(device), driver = M.driver_version(device),
      ember = ok and ember.version or nil, host = M.sh("hostname"),
    }
  end
  local r = {}
  for k, v in pairs(cache[device]) do r[k] = v end
  r.date = os.date("!%Y-%m-%dT%H:%M:%SZ")
  return r
end

return M
