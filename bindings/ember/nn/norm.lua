--- ember.nn.RMSNorm (torch/nn/modules/normalization.py): one fused F.rmsnorm
-- call, computed in f32 whatever the input dtype (engine/ops/norm.c).
-- @module ember.nn.norm

local core = require "ember.core"
local util = require "ember.util"
local F = require "ember.functional"
local module = require "ember.nn.module"

--- x / sqrt(mean(x²) + eps) * weight over the last dim, in f32; weight ones.
-- opts.out_dtype (also the field `out_dtype`): y in that float dtype, as
-- F.rmsnorm's {out_dtype}; "autocast": the autocast region's dtype while one
-- is active (y then goes only to linears, which would cast it anyway),
-- unchanged outside one. nil (default): y as F.rmsnorm gives it.
-- @type RMSNorm
local RMSNorm = module.Module:extend("RMSNorm")

function RMSNorm:__init(d, opts)
  opts = module.init_norm(self, "ember.nn.RMSNorm", d, opts)
  local od = opts.out_dtype
  if od ~= nil and od ~= "autocast" and not util.FLOAT_DTYPES[util.DTYPES[od] or false] then
    error(("ember.nn.RMSNorm: expected out_dtype to be a float dtype (f32, f64, bf16, f16) or \"autocast\", " ..
      "got %s"):format(tostring(od)), module.CTOR_LEVEL)
  end
  self.out_dtype = od
end

local OPTS = {}   -- one {out_dtype = dt} table per dtype, not one per call
local function norm_opts(od)
  if od == "autocast" then od = core.autocast_dtype() end
  if od == nil then return nil end
  local o = OPTS[od]
  if not o then o = {out_dtype = od}; OPTS[od] = o end
  return o
end

--- norm(x), or with a residual r: s = x + r and norm(s), returned as s, y
-- (F.add_rmsnorm: the add fused into the norm's kernel).
function RMSNorm:forward(x, r)
  local o = norm_opts(self.out_dtype)
  if r ~= nil then return F.add_rmsnorm(x, r, self.weight, self.eps, o) end
  return F.rmsnorm(x, self.weight, self.eps, o)
end

RMSNorm.extra_repr = module.norm_repr

return RMSNorm
