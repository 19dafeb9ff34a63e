-- Helpers shared by the CPU and GPU memory-history specs
-- (tests/lua/memory_spec.lua, tests/gpu/memory_spec.lua): temporary files
-- removed by remove_temps(), reading files, shell quoting and commands, and
-- picking trace events.
local U = {}

local temps = {}

--- A fresh temporary path ending in `suffix`, removed by U.remove_temps().
function U.temp(suffix)
  local p = os.tmpname()
  os.remove(p)
  p = p .. suffix
  temps[#temps + 1] = p
  return p
end

function U.remove_temps()
  for _, p in ipairs(temps) do os.remove(p) end
  temps = {}
end

function U.slurp(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

function U.q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

--- Run a shell command: its output (stdout and stderr) and whether it succeeded.
function U.sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  local ok = p:close()
  return out, ok
end

--- Events of the trace that match every field of `want`.
function U.find(trace, want)
  local out = {}
  for _, e in ipairs(trace) do
    local ok = true
    for k, v in pairs(want) do if e[k] ~= v then ok = false break end end
    if ok then out[#out + 1] = e end
  end
  return out
end

return U
