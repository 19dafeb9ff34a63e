--- ember.autograd: gradient checking by finite differences.
-- gradcheck(fn, inputs, opts) compares the gradients that backward computes
-- for every input that requires grad with central differences of a random
-- projection of fn's output (so any output shape works). Use f64 inputs.
local M = {}

local function flat_view(t) return t:view(-1) end

--- ember.autograd.gradcheck(fn, {x, y, ...}, {eps=1e-6, atol=1e-5, rtol=1e-3, raise=true})
-- Returns true, or false plus a message (raises instead when raise ~= false).
function M.gradcheck(fn, inputs, o)
  local ember = require "ember"
  o = o or {}
  local eps, atol, rtol = o.eps or 1e-6, o.atol or 1e-5, o.rtol or 1e-3
  if type(fn) ~= "function" then error("ember.autograd.gradcheck: expected a function, got " .. type(fn), 2) end
  if type(inputs) ~= "table" then error("ember.autograd.gradcheck: expected a list of inputs, got " .. type(inputs), 2) end
  local function fail(msg)
    if o.raise == false then return false, msg end
    error("ember.autograd.gradcheck: " .. msg, 2)
  end
  for i, x in ipairs(inputs) do
    if ember.is_tensor(x) and x.requires_grad and x.dtype ~= "f64" then
      return fail(("input %d is %s; use f64 inputs for finite differences"):format(i, x.dtype))
    end
    if ember.is_tensor(x) and x.requires_grad and not x:is_contiguous() then
      return fail(("input %d must be contiguous"):format(i))
    end
  end
  local out = fn(table.unpack(inputs))
  if not ember.is_tensor(out) then return fail("fn must return a tensor, got " .. type(out)) end
  local proj = ember.no_grad(function() return ember.randn(out.shape, {dtype = out.dtype}) end)
  local function objective()
    return ember.no_grad(function() return (fn(table.unpack(inputs)) * proj):sum():item() end)
  end
  for _, x in ipairs(inputs) do if ember.is_tensor(x) then x.grad = nil end end
  local loss = (out * proj):sum()
  loss:backward()
  for i, x in ipairs(inputs) do
    if ember.is_tensor(x) and x.requires_grad then
      local analytic = x.grad and x.grad:_flat_values() or nil
      local flat = flat_view(x)
      local values = x:_flat_values()
      for j = 1, #values do
        local cell = flat:narrow(0, j - 1, 1)
        ember.no_grad(function() cell:fill_(values[j] + eps) end)
        local fp = objective()
        ember.no_grad(function() cell:fill_(values[j] - eps) end)
        local fm = objective()
        ember.no_grad(function() cell:fill_(values[j]) end)
        local numeric = (fp - fm) / (2 * eps)
        local a = analytic and analytic[j] or 0
        if math.abs(a - numeric) > atol + rtol * math.abs(numeric) then
          return fail(("gradient mismatch for input %d at flat index %d: analytical %.10g, numerical %.10g")
            :format(i, j - 1, a, numeric))
        end
      end
    end
  end
  return true
end

return M
