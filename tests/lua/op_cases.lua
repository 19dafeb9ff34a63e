-- op_cases.lua — the op-test registry (ggml's test-backend-ops is the
-- model): one entry per differentiable op case, and one or more perf shapes
-- per op, shared by every mode that iterates "all the ops" (STYLE.md: one
-- op-test registry). Three modes read it:
--   grad  tests/lua/gradcheck_spec.lua: every case's gradients against
--         central finite differences, f64 on the CPU (CI);
--   eval  tests/gpu/op_cases_spec.lua: every case on CUDA in f32, bf16 and
--         f16 against the same inputs in f64 on the CPU (make test-gpu);
--   perf  scripts/bench_ops.lua: every perf entry timed, with GB/s or TF/s
--         and the fraction of the device's peak.
-- The cases live in op_cases/<family>.lua (FAMILIES below); a new op joins by
-- adding its cases and a perf entry there (or a new family file).
--
--   local cases = dofile("tests/lua/op_cases.lua")
--   for _, c in ipairs(cases) do
--     local inputs = cases.make_inputs(c, {dtype = "f64", device = "cpu"})
--     local y = c.fn(table.unpack(inputs))
--   end
--   for _, p in ipairs(cases.perf) do ... end
--
-- case(name, op, fn, inputs [, gradcheck [, extra]]):
--   name       what the case checks, read as a test title (unique)
--   op         the API op it covers (gradcheck_spec checks that every
--              differentiable op of the API has at least one case)
--   fn         function(inputs...) -> tensor
--   inputs     function(T) -> list of inputs, built with the factory T below
--              so that dtype/device/requires_grad come from the caller
--   gradcheck  optional tolerances for ember.autograd.gradcheck
--   extra      optional table:
--                cuda_dtypes = {...}  the dtypes the eval mode runs on CUDA
--                  when not all of f32, bf16 and f16 apply (flash attention
--                  has no f32 kernel)
--                grad = false  an op without a gradient (sort's indices,
--                  nonzero, randperm, comparisons): the eval mode compares
--                  its forward, the grad mode leaves it out
--                dtypes = {...}  the float dtypes the eval mode runs on CUDA
--                  for an op whose inputs are not floats (alias of cuda_dtypes)
-- perf(op, name, fn, inputs [, o]): a timing shape for bench_ops.lua; fn and
--   inputs as for case (inputs built without requires_grad unless
--   o.backward). o:
--     flops     function(inputs, out) -> floating-point operations (matmul,
--               attention): the figure is TF/s against the peak compute
--     bytes     function(inputs, out) -> bytes the op must move at least;
--               default: every tensor input read once + the output written
--               once. The figure is GB/s against the peak memory bandwidth
--     backward  true: time forward + backward (out:backward(ones)) as well
--     bwd_bytes function(inputs, out) -> bytes the backward must move at
--               least: bench_ops.lua reports GB/s of (fwd+bwd - fwd) too
--     dtypes    the dtypes to time (default {"f32", "bf16"})
--     device    "cpu" or "cuda": time the entry only there (default: both)
--     torch     the same op as a PyTorch expression over the inputs a, b, c,
--               d (torch and F = torch.nn.functional in scope), timed beside
--               ours by bench_ops.lua --torch, e.g. "F.softmax(a, -1)"
-- Inputs avoid kinks: abs/relu/clamp/maximum/max inputs are kept at least
-- 0.1 away from their non-differentiable points (eps is 1e-6), and
-- sqrt/log/div see values bounded away from 0.

local ember = require "ember"
local F = ember.nn.functional

local cases = {perf = {}}

-- the family files, in the order their cases run
local FAMILIES = {"elementwise", "reduce", "matmul", "nn", "attention", "shape",
  "random", "loss", "indexing", "sort", "shape_math",   -- issue 12
}

local function case(name, op, fn, inputs, gradcheck, extra)
  extra = extra or {}
  cases[#cases + 1] = {name = name, op = op, fn = fn, inputs = inputs, gradcheck = gradcheck,
                       cuda_dtypes = extra.cuda_dtypes or extra.dtypes, grad = extra.grad ~= false}
end

local function perf(op, name, fn, inputs, o)
  o = o or {}
  cases.perf[#cases.perf + 1] = {op = op, name = name, fn = fn, inputs = inputs, flops = o.flops,
                                 bytes = o.bytes, bwd_bytes = o.bwd_bytes, backward = o.backward, dtypes = o.dtypes, device = o.device,
                                 torch = o.torch}
end

---------------------------------------------------------------------------
-- the input factory
---------------------------------------------------------------------------

local function numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

-- T: builds inputs on CPU in f64, then converts to the requested dtype/device.
-- Float inputs are leaves with requires_grad (unless o.requires_grad == false);
-- integer/bool inputs (ids, targets, masks) never require grad.
local function factory(o)
  o = o or {}
  local dtype, device = o.dtype or "f64", o.device or "cpu"
  local rg = o.requires_grad ~= false
  local T = {}

  local function leaf(t64) return ember.tensor(t64, {dtype = dtype, device = device, requires_grad = rg}) end
  local function from_list(list, shape)
    return ember.tensor(list, {dtype = "f64"}):view(shape)
  end

  --- standard normal leaf
  function T.randn(shape) return leaf(ember.randn(shape, {dtype = "f64"})) end
  --- uniform in [lo, hi)
  function T.uniform(shape, lo, hi)
    return leaf(ember.rand(shape, {dtype = "f64"}) * (hi - lo) + lo)
  end
  --- normal values pushed at least `gap` away from every point in `points`
  function T.away(shape, points, gap)
    local v = ember.randn(numel(shape), {dtype = "f64"}):tolist()
    for i, x in ipairs(v) do
      for _ = 1, #points do          -- repeat: moving off one point may land near another
        for _, p in ipairs(points) do
          if math.abs(x - p) < gap then x = p + (x >= p and gap or -gap) * 1.5 end
        end
      end
      v[i] = x
    end
    return leaf(from_list(v, shape))
  end
  --- values at least `spacing` apart (no ties for max/min), in shuffled order
  function T.distinct(shape, spacing)
    local n = numel(shape)
    local p = 7
    while n % p == 0 or p % n == 0 do p = p + 2 end   -- a step coprime with n
    local noise = ember.rand(n, {dtype = "f64"}):tolist()
    local v = {}
    for k = 0, n - 1 do
      v[k + 1] = ((k * p) % n - n / 2) * spacing + (noise[k + 1] - 0.5) * spacing * 0.3
    end
    return leaf(from_list(v, shape))
  end
  --- a leaf with these exact values
  function T.values(list, shape) return leaf(from_list(list, shape or {#list})) end
  --- a standard normal leaf in f32 whatever the working dtype: an f32 master
  -- weight beside bf16 activations, as autocast runs them (perf entries)
  function T.randn_f32(shape)
    return ember.tensor(ember.randn(shape, {dtype = "f64"}), {dtype = "f32", device = device, requires_grad = rg})
  end
  --- a float tensor of the working dtype that does not require grad
  function T.const(shape) return ember.randn(shape, {dtype = "f64"}):to({dtype = dtype, device = device}) end
  --- integer ids in [0, n) (i64)
  function T.ids(shape, n) return ember.randint(0, n, shape):to(device) end
  --- an i64 tensor with these exact values
  function T.long(list) return ember.tensor(list, {dtype = "i64"}):to(device) end
  --- positions 0..n-1 (i64)
  function T.positions(n) return ember.arange(n):to(device) end
  --- a bool mask with about half the entries set
  function T.mask(shape) return ember.rand(shape):lt(0.5):to(device) end
  return T
end

-- Deterministic seed per case (so adding a case does not change the others).
local function seed_of(name)
  local h = 5381
  for i = 1, #name do h = (h * 33 + name:byte(i)) % 2147483647 end
  return h
end

---------------------------------------------------------------------------
-- the families
---------------------------------------------------------------------------

local here = debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "./"
for _, family in ipairs(FAMILIES) do
  -- a family may return {[perf entry name] = PyTorch expression} for entries
  -- registered without one (a name that matches no entry is an error)
  local torch = dofile(here .. "op_cases/" .. family .. ".lua")(case, perf, ember, F)
  for name, expr in pairs(torch or {}) do
    local found = false
    for _, p in ipairs(cases.perf) do
      if p.name == name then p.torch, found = p.torch or expr, true end
    end
    if not found then error(("op_cases/%s.lua: torch expression for no perf entry: %s"):format(family, name)) end
  end
end

---------------------------------------------------------------------------
-- access
---------------------------------------------------------------------------

--- Build case c's inputs: seeded by its name, dtype/device/requires_grad from o.
function cases.make_inputs(c, o)
  ember.manual_seed(seed_of(c.name))
  return c.inputs(factory(o))
end

cases.factory = factory
cases.seed_of = seed_of

return cases
