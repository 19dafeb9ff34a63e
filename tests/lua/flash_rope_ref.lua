--- The rope option's two ways, for tests/lua/flash_rope_spec.lua and tests/gpu/flash_rope_spec.lua: o, lse and
-- the three gradients (for the upstream g) of the fused call (F.flash_attention's opts.rope) or the composition
-- (F.rope_qk, then F.flash_attention), on fresh leaves of q0, k0, v0.
local ember = require "ember"
local F = ember.nn.functional

local function leaf(t) local c = t:detach():clone(); c.requires_grad = true; return c end

return function(fused, q0, k0, v0, causal, pos, theta, g)
  local q, k, v = leaf(q0), leaf(k0), leaf(v0)
  local o, lse
  if fused then
    o, lse = F.flash_attention(q, k, v, causal, {rope = {pos = pos, theta = theta}})
  else
    local qr, kr = F.rope_qk(q, k, pos, theta)
    o, lse = F.flash_attention(qr, kr, v, causal)
  end
  (o * g):sum():backward()
  return {o = o, lse = lse, dq = q.grad, dk = k.grad, dv = v.grad}
end
