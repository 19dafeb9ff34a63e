--- ember.runinfo: the facts every result line carries, so a number can be
-- traced to the code, the machine and the moment that produced it.
--   runinfo.collect(device) --> {commit=, device=, driver=, date=, ember=, host=, threads=, blas=}
-- threads: the CPU ops' thread count now (ember.get_num_threads), read at
-- each call since ember.set_num_threads may have changed it.
-- `device` is "cpu", "cuda" or "cuda:N" (default: cuda when available).
-- EMBER_COMMIT overrides the commit lookup (a host whose copy has stale git metadata).
local M = {}

--- Run a shell command, return its trimmed output or nil.
function M.sh(cmd)
  local f = io.popen("(" .. cmd .. ") 2>/dev/null")
  if not f then return nil end
  local out = f:read("a")
  f:close()
  out = out and out:gsub("%s+$", "") or ""
  return out ~= "" and out or nil
end

local function shq(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

--- Ember's commit: EMBER_COMMIT when set; else the short commit of Ember's own
-- source tree (the one this build came from, "+dirty" when tracked files
-- changed); else the commit stamped at build time (an installed ember whose
-- source is gone); else "unknown". Never the repository around the working
-- directory, nor one that merely encloses a copy of Ember's tree.
-- `src` (default: ember.core.source_dir) is for tests.
function M.git_commit(src)
  local env = os.getenv("EMBER_COMMIT")
  if env and env ~= "" then return env end
  if src == nil then
    local ok, core = pcall(require, "ember.core")
    src = ok and type(core) == "table" and core.source_dir or nil
  end
  if src then
    local real = M.sh("cd " .. shq(src) .. " && pwd -P")
    local top = real and M.sh("git -C " .. shq(real) .. " rev-parse --show-toplevel")
    top = top and M.sh("cd " .. shq(top) .. " && pwd -P")
    if real and top == real then
      local c = M.sh("git -C " .. shq(real) .. " rev-parse --short HEAD")
      if c then
        if M.sh("git -C " .. shq(real) .. " status --porcelain --untracked-files=no") then c = c .. "+dirty" end
        return c
      end
    end
  end
  local ok, stamp = pcall(require, "ember.build_stamp")
  if ok and type(stamp) == "table" and type(stamp.commit) == "string" then return stamp.commit end
  return "unknown"
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
  local ok, ember = pcall(require, "ember")
  if ok and ember.get_num_threads then r.threads = ember.get_num_threads() end
  if ok and ember.blas_info then
    local b = ember.blas_info()
    r.blas = "OpenBLAS " .. b.core .. (b.replaced and (" (OpenBLAS chose " .. b.replaced .. ")") or "")
  end
  return r
end

return M
