--- ember.nn.RotaryEmbedding: rotary position embedding (engine/ops/rope.c),
-- no parameters. The positions 0..T-1 are cached per (T, device), so a
-- forward pass builds them once, not once per layer.
-- @module ember.nn.rope

local F = require "ember.functional"
local util = require "ember.util"
local module = require "ember.nn.module"

local fmt = string.format
local CTOR_LEVEL = module.CTOR_LEVEL

--- Rotary position embedding over heads of size d_head (no parameters).
-- forward(x (..., T, d_head), pos) with pos an integer tensor (T), default
-- 0..T-1 on x's device.
-- @type RotaryEmbedding
local RotaryEmbedding = module.Module:extend("RotaryEmbedding")

function RotaryEmbedding:__init(d_head, opts)
  util.check_positive_int("ember.nn.RotaryEmbedding", "d_head", d_head, CTOR_LEVEL)
  if d_head % 2 ~= 0 then
    error("ember.nn.RotaryEmbedding: expected an even d_head, got " .. d_head, 3)
  end
  opts = util.check_opts("ember.nn.RotaryEmbedding", opts, CTOR_LEVEL)
  self.d_head, self.theta, self.max_len = d_head, opts.theta or 10000, opts.max_len
  self._pos_cache = {}
end

--- Positions 0..T-1 on device, cached per (T, device).
function RotaryEmbedding:positions(T, device)
  if self.max_len and T > self.max_len then
    error(fmt("ember.nn.RotaryEmbedding: sequence length %d exceeds max_len %d", T,
      self.max_len), 2)
  end
  local key = tostring(device) .. "/" .. T
  local pos = self._pos_cache[key]
  if pos == nil then
    pos = F.positions(T, device)
    self._pos_cache[key] = pos
  end
  return pos
end

--- x rotated; with k as well, (x, k) rotated together as rotate_qk does (one
-- node, one launch), so a caller going through the module call keeps its
-- hooks and the profiler's module path.
function RotaryEmbedding:forward(x, pos, k)
  if k ~= nil then return self:rotate_qk(x, k, pos) end
  local shape = x.shape
  if shape[#shape] ~= self.d_head then
    error(fmt("ember.nn.RotaryEmbedding: expected last dim %d (d_head), got shape %s",
      self.d_head, util.shape_str(shape)), 2)
  end
  pos = pos or self:positions(shape[#shape - 1], x.device)
  return F.rope(x, pos, self.theta)
end

--- q and k rotated together (F.rope_qk: one autograd node, and on CUDA one
-- launch each way); pos as forward's, from q's T.
function RotaryEmbedding:rotate_qk(q, k, pos)
  local qs, ks = q.shape, k.shape
  if qs[#qs] ~= self.d_head or ks[#ks] ~= self.d_head then
    error(fmt("ember.nn.RotaryEmbedding: expected last dim %d (d_head), got shapes %s and %s",
      self.d_head, util.shape_str(qs), util.shape_str(ks)), 2)
  end
  pos = pos or self:positions(qs[#qs - 1], q.device)
  return F.rope_qk(q, k, pos, self.theta)
end

function RotaryEmbedding:extra_repr()
  return fmt("d_head=%d, theta=%s", self.d_head, util.float_repr(self.theta))
end

return RotaryEmbedding
