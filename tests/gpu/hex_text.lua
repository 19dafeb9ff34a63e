--- A tensor's values as text: hex floats ("%a", exact), "nan" for NaNs, space-separated — what the reference
-- scripts (launch_ref.lua, bf16_table_ref.lua) print so a child process's results compare bit for bit.
local function text(t)
  local l = t:to("cpu"):to("f64"):reshape(-1):tolist()
  for i, v in ipairs(l) do l[i] = v ~= v and "nan" or ("%a"):format(v) end
  return table.concat(l, " ")
end
return text
