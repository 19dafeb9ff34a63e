--- ember.attention_cli: `ember attention --matrix` (bindings/cli/ember_main.c
-- calls main(arg)): prints which attention implementation runs for each head
-- dim x dtype x causal x GQA x device case (ember.flash_support).
local argparse = require "argparse"
local support = require "ember.flash_support"
local M = {}

local function parser()
  local p = argparse("ember attention",
    "Attention support: which kernel runs for each case. Columns: forward (Tq > " ..
    support.DECODE_MAX_TQ .. "), decode (Tq <= " .. support.DECODE_MAX_TQ .. "), backward, and what " ..
    "F.scaled_dot_product_attention's impl = \"auto\" picks. \"error\" cells are refused by " ..
    "F.flash_attention with the message printed under the table; d \"other\" is any head dim outside {" ..
    table.concat(support.DIMS, ", ") .. "}. On the CPU every float dtype runs the tiled path; " ..
    "f32+autocast is f32 inputs inside ember.autocast (lowered to bf16 first).")
  p:help_max_width(100)
  p:epilog("Examples:\n" ..
    "   ember attention --matrix                      cases where causal/GQA change nothing merged\n" ..
    "   ember attention --matrix --full               every causal x GQA case on its own row\n" ..
    "   ember attention --matrix --device cuda --dtype f32 --tf32 on")
  p:flag("--matrix", "Print the support matrix.")
  p:flag("--full", "One row per causal x GQA case instead of merging identical ones.")
  p:flag("--markdown", "A Markdown table.")
  p:option("--device", "Only this device (cpu or cuda)."):argname("<device>")
  p:option("--dtype", "Only this dtype (" .. table.concat(support.DTYPES, ", ") .. ")."):argname("<dtype>")
  p:option("--tf32", "Assume ember.backends.tf32 on or off (default: the current setting, off)."):argname("<on|off>")
  return p
end

local function fail(msg)
  io.stderr:write("ember attention: ", msg, "\n")
  return 2
end

local function member(list, x)
  for _, v in ipairs(list) do if v == x then return true end end
  return false
end

function M.main(arg)
  local args = {}
  for i = 1, #arg do args[i] = arg[i] end
  local p = parser()
  local ok, a = p:pparse(args)
  if not ok then return fail(a .. "\n" .. p:get_usage()) end
  if not a.matrix then
    io.stdout:write(p:get_help(), "\n")
    return 0
  end
  if a.device and not member(support.DEVICES, a.device) then
    return fail(("expected --device cpu or cuda, got '%s'"):format(a.device))
  end
  if a.dtype and not member(support.DTYPES, a.dtype) then
    return fail(("expected --dtype one of %s, got '%s'"):format(table.concat(support.DTYPES, ", "), a.dtype))
  end
  local tf32
  if a.tf32 then
    if a.tf32 ~= "on" and a.tf32 ~= "off" then return fail(("expected --tf32 on or off, got '%s'"):format(a.tf32)) end
    tf32 = a.tf32 == "on"
  end
  local rows = support.rows({tf32 = tf32})
  if not a.full then rows = support.compact(rows) end
  local kept, errors, seen = {}, {}, {}
  for _, r in ipairs(rows) do
    if (not a.device or r.device == a.device) and (not a.dtype or r.dtype == a.dtype) then
      kept[#kept + 1] = r
      if r.error and not seen[r.error] then
        seen[r.error] = true
        errors[#errors + 1] = r.error
      end
    end
  end
  io.stdout:write(support.format(kept, a.markdown), "\n")
  io.stdout:write("\nin every row, shapes are checked too: causal = \"bottom_right\" needs Tq <= Tk, GQA needs H a " ..
    "multiple of Hkv (errors naming the shapes)\n")
  if #errors > 0 then
    io.stdout:write("\nerrors (F.flash_attention; impl = \"auto\" runs the naive composition there):\n")
    for _, e in ipairs(errors) do io.stdout:write("  flash_attention: ", e, "\n") end
  end
  return 0
end

return M
