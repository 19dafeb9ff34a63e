--- Printing tensors like PyTorch: `tensor([[1., 2.], [3., 4.]])`, 4 decimals,
-- scientific notation when magnitudes span too much, summaries past 1000
-- elements, and the dtype/device/grad suffixes PyTorch shows.
local M = {}

local opts = {precision = 4, threshold = 1000, edgeitems = 3, linewidth = 80}

--- ember.set_printoptions{precision=, threshold=, edgeitems=, linewidth=}
function M.set_printoptions(o)
  for k, v in pairs(o) do
    if opts[k] == nil then error("ember.set_printoptions: unknown option '" .. tostring(k) .. "'", 2) end
    opts[k] = v
  end
end

local function is_float(dtype) return dtype == "f32" or dtype == "f64" or dtype == "bf16" or dtype == "f16" end

-- Choose one format for every element, as torch's _Formatter does.
local function make_formatter(values, dtype)
  if dtype == "bool" then return function(v) return v and "True" or "False" end end
  if not is_float(dtype) then return function(v) return string.format("%d", v) end end
  local int_mode, amax, amin = true, nil, nil
  for _, v in ipairs(values) do
    if v == v and v ~= math.huge and v ~= -math.huge then
      if v ~= math.floor(v) then int_mode = false end
      local a = math.abs(v)
      if a ~= 0 then
        amax = (amax == nil or a > amax) and a or amax
        amin = (amin == nil or a < amin) and a or amin
      end
    end
  end
  local function special(v)
    if v ~= v then return "nan" end
    if v == math.huge then return "inf" end
    if v == -math.huge then return "-inf" end
  end
  local p = opts.precision
  if int_mode then
    if amax and amax > 1e8 then
      return function(v) return special(v) or string.format("%." .. p .. "e", v) end
    end
    return function(v) return special(v) or string.format("%.0f.", v) end
  end
  if amax and (amax / amin > 1000 or amax > 1e8 or amin < 1e-4) then
    return function(v) return special(v) or string.format("%." .. p .. "e", v) end
  end
  return function(v) return special(v) or string.format("%." .. p .. "f", v) end
end

-- Indices to show along a dim of size n ("..." marks the gap).
local function shown(n, summarize)
  local idx = {}
  if summarize and n > 2 * opts.edgeitems then
    for i = 0, opts.edgeitems - 1 do idx[#idx + 1] = i end
    idx[#idx + 1] = "..."
    for i = n - opts.edgeitems, n - 1 do idx[#idx + 1] = i end
  else
    for i = 0, n - 1 do idx[#idx + 1] = i end
  end
  return idx
end

local function render(values, shape, strides, fmt, width, dim, base, indent, summarize)
  local ndim = #shape
  if ndim == 0 then return fmt(values[1]) end
  local parts = {}
  local idx = shown(shape[dim], summarize)
  if dim == ndim then
    for _, i in ipairs(idx) do
      if i == "..." then parts[#parts + 1] = "..."
      else
        local s = fmt(values[base + i * strides[dim] + 1])
        parts[#parts + 1] = string.rep(" ", width - #s) .. s
      end
    end
    -- wrap long rows at the line width
    local per_line = math.max(1, (opts.linewidth - indent) // (width + 2))
    local lines = {}
    for i = 1, #parts, per_line do
      lines[#lines + 1] = table.concat(parts, ", ", i, math.min(#parts, i + per_line - 1))
    end
    return "[" .. table.concat(lines, ",\n" .. string.rep(" ", indent + 1)) .. "]"
  end
  for _, i in ipairs(idx) do
    if i == "..." then parts[#parts + 1] = "..."
    else parts[#parts + 1] = render(values, shape, strides, fmt, width, dim + 1, base + i * strides[dim], indent + 1, summarize) end
  end
  local sep = "," .. string.rep("\n", ndim - dim) .. string.rep(" ", indent + 1)
  return "[" .. table.concat(parts, sep) .. "]"
end

--- __tostring for tensors.
function M.tostring(t)
  local shape, dtype = t.shape, t.dtype
  local numel = t:numel()
  local summarize = numel > opts.threshold
  local values = t:detach():contiguous():_flat_values()
  local strides, s = {}, 1
  for d = #shape, 1, -1 do strides[d] = s; s = s * shape[d] end
  local fmt_values = values
  if summarize then   -- format width from the shown corner only (cheap, like torch)
    fmt_values = {}
    for i = 1, math.min(#values, 2 * opts.threshold) do fmt_values[i] = values[i] end
  end
  local fmt = make_formatter(fmt_values, dtype)
  -- column width as torch: floats count finite non-zero values only (at least 1)
  local width = 1
  local floaty = is_float(dtype)
  for _, v in ipairs(fmt_values) do
    if not floaty or (v == v and v ~= 0 and v ~= math.huge and v ~= -math.huge) then
      width = math.max(width, #fmt(v))
    end
  end
  local body
  if numel == 0 then
    body = "[]"
  else
    body = render(values, shape, strides, fmt, width, 1, 0, #"tensor(", summarize)
  end
  local suffix = {}
  if numel == 0 and #shape > 1 then
    suffix[#suffix + 1] = "size=(" .. table.concat(shape, ", ") .. ")"
  end
  if t.device ~= "cpu" then suffix[#suffix + 1] = "device='" .. t.device .. "'" end
  if dtype ~= "f32" and dtype ~= "i64" and dtype ~= "bool" then suffix[#suffix + 1] = "dtype=" .. dtype end
  if t.grad_fn then suffix[#suffix + 1] = "grad_fn=<" .. t.grad_fn .. ">"
  elseif t.requires_grad then suffix[#suffix + 1] = "requires_grad=True" end
  if #suffix > 0 then body = body .. ", " .. table.concat(suffix, ", ") end
  return "tensor(" .. body .. ")"
end

return M
