--- ember.nn containers: ModuleList and Sequential (torch/nn/modules/container.py).
-- Children are named "0", "1", ... as in PyTorch, so checkpoints line up;
-- from Lua they index 1-based like any array.
-- @module ember.nn.container

local module = require "ember.nn.module"

local Module, is_module, add_indent = module.Module, module.is_module, module.add_indent
local fmt = string.format
local M = {}

--- A list of modules, named "0", "1", ... (as PyTorch). Index it 1-based
-- like any Lua array: `layers[1]` is child "0"; `#layers` and `ipairs` work.
-- @type ModuleList
local ModuleList = Module:extend("ModuleList")
M.ModuleList = ModuleList

function ModuleList:__init(mods)
  for _, m in ipairs(mods or {}) do self:append(m) end
end

--- Append a module; returns self.
function ModuleList:append(m)
  if not is_module(m) then
    error("ember.nn.ModuleList.append: expected a module, got " .. type(m), 2)
  end
  self:register_module(tostring(#rawget(self, "_modules_order")), m)
  return self
end

ModuleList.__len = function(self) return #rawget(self, "_modules_order") end
function ModuleList:forward()
  error("ember.nn.ModuleList: a ModuleList has no forward; iterate over it", 2)
end

-- PyTorch folds runs of identical children: "(0-11): 12 x TransformerBlock(".
function ModuleList:_child_repr_lines()
  local lines, kids = {}, self:named_children()
  local i = 1
  while i <= #kids do
    local r = kids[i][2]:__repr()
    local j = i
    while j < #kids and kids[j + 1][2]:__repr() == r do j = j + 1 end
    if j == i then
      lines[#lines + 1] = "(" .. kids[i][1] .. "): " .. add_indent(r, 2)
    else
      lines[#lines + 1] = fmt("(%s-%s): %d x %s", kids[i][1], kids[j][1], j - i + 1,
        add_indent(r, 2))
    end
    i = j + 1
  end
  return lines
end

--- Modules applied in order: Sequential(a, b, c)(x) = c(b(a(x))).
-- @type Sequential
local Sequential = Module:extend("Sequential")
M.Sequential = Sequential

function Sequential:__init(...)
  local mods = table.pack(...)
  if mods.n == 1 and type(mods[1]) == "table" and not is_module(mods[1]) then
    mods = mods[1]
    mods.n = #mods
  end
  for i = 1, mods.n do
    if not is_module(mods[i]) then
      error(fmt("ember.nn.Sequential: expected a module at position %d, got %s", i,
        type(mods[i])), 3)
    end
    self:register_module(tostring(i - 1), mods[i])
  end
end

Sequential.__len = ModuleList.__len
function Sequential:forward(x)
  for _, m in ipairs(self:children()) do x = m(x) end
  return x
end

return M
