-- amp_toy.lua — the ToyModel of CS336 A2 §1.1.5 (benchmarking_mixed_precision)
-- written with ember.nn, and the dtype report the assignment asks for. Used by
-- scripts/mixed_precision.lua (the study), tests/lua/amp_spec.lua (CPU) and
-- tests/gpu/amp_spec.lua (CUDA); load it with dofile (it is not a package).
--
-- The assignment's model is fc1 → relu → LayerNorm → fc2 (no biases on the
-- linears). ember.nn has no LayerNorm; RMSNorm stands in for it: it is the
-- norm this engine's models use, and autocast treats every norm the same way
-- (computed and returned in f32), as PyTorch's autocast treats layer_norm.
local ember = require "ember"
local nn, F = ember.nn, ember.nn.functional

local M = {}

local ToyModel = nn.Module:extend("ToyModel")
M.ToyModel = ToyModel

function ToyModel:__init(in_features, out_features, opts)
  local o = {bias = false, device = opts and opts.device}
  self.fc1 = nn.Linear(in_features, 10, o)
  self.ln = nn.RMSNorm(10, {device = o.device})
  self.fc2 = nn.Linear(10, out_features, o)
end

-- `seen` (optional table) receives the dtype of each intermediate.
function ToyModel:forward(x, seen)
  local h = self.fc1(x):relu()
  local n = self.ln(h)
  local logits = self.fc2(n)
  if seen then seen.fc1, seen.ln = h.dtype, n.dtype end
  return logits
end

--- The dtype every entry of `list` has, or "mixed".
local function common(list, get)
  local d
  for _, p in ipairs(list) do
    local v = get(p)
    if d == nil then d = v elseif d ~= v then return "mixed" end
  end
  return d
end

--- One forward + backward of ToyModel(20, 5) on `device` under
-- ember.autocast(dtype); returns {parameters=, fc1=, ln=, logits=, loss=,
-- grads=} with dtype names ("mixed" if parameters or grads disagree), and a
-- second table of the parameters one by one: {{name=, dtype=, grad=}, ...}.
function M.dtype_report(device, dtype)
  ember.manual_seed(3)
  local model = ToyModel(20, 5, {device = device})
  local x = ember.randn({8, 20}, {device = device})
  local y = ember.randint(0, 5, {8}, {device = device})
  local seen, each = {}, {}
  local loss = ember.autocast(dtype, function()
    seen.parameters = common(model:parameters(), function(p) return p.dtype end)
    local logits = model(x, seen)
    seen.logits = logits.dtype
    local l = F.cross_entropy(logits, y)
    seen.loss = l.dtype
    return l
  end)
  loss:backward()
  seen.grads = common(model:parameters(), function(p) return p.grad and p.grad.dtype or "none" end)
  for i, np in ipairs(model:named_parameters()) do
    each[i] = {name = np[1], dtype = np[2].dtype, grad = np[2].grad and np[2].grad.dtype or "none"}
  end
  return seen, each
end

--- What the assignment's answer is (and PyTorch's autocast gives) for an
-- autocast dtype ("bf16" or "f16"): linears in that dtype, the norm and the
-- loss in f32, parameters and their gradients f32.
function M.expected(dtype)
  return {parameters = "f32", fc1 = dtype, ln = "f32", logits = dtype, loss = "f32", grads = "f32"}
end

--- The bf16 answer (kept for the specs that compare against it).
M.expected_report = M.expected("bf16")

return M
