--- Mixed precision and backend switches: ember.autocast(dtype, fn) and
-- ember.backends. The CUDA backend work fills these in.
local core = require "ember.core"
local M = {backends = {}}

--- ember.autocast("bf16", fn, ...) runs fn with autocast on (see ember/autocast.h).
function M.autocast(dtype, fn, ...)
  if not core.autocast_enter then
    error("ember.autocast: not available in this build yet", 2)
  end
  core.autocast_enter(dtype)
  local res = table.pack(pcall(fn, ...))
  core.autocast_exit()
  if not res[1] then error(res[2], 0) end
  return table.unpack(res, 2, res.n)
end

--- ember.backends.tf32(on): allow TF32 for f32 matmuls on CUDA (off by default).
function M.backends.tf32(on)
  if core.cuda_set_allow_tf32 then return core.cuda_set_allow_tf32(on) end
  error("ember.backends.tf32: this build has no CUDA backend", 2)
end

return M
