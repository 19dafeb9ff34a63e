--- ember.cuda: device queries, and (with the CUDA backend) streams, events,
-- memory statistics and graph capture. Without a GPU every query answers
-- "none" and everything else raises a clear error.
local core = require "ember.core"

local cuda = {
  is_available = core.cuda_is_available,
  device_count = core.cuda_device_count,
  is_compiled = core.cuda_compiled,
}

local function no_cuda(name)
  return function()
    error(("ember.cuda.%s: no CUDA device is available%s"):format(name,
      core.cuda_compiled() and "" or " (this build has no CUDA backend)"), 2)
  end
end
for _, name in ipairs {"synchronize", "memory_allocated", "max_memory_allocated",
                       "reset_peak_memory_stats", "graph", "set_device"} do
  cuda[name] = core["cuda_" .. name] or no_cuda(name)
end

return cuda
