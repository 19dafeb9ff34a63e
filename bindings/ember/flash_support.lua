--- ember.flash_support: which attention implementation runs for each case —
-- head dim x dtype x causal x GQA x device — as rows (F.flash_support) and as
-- the table `ember attention --matrix` prints. The rules are the op's
-- (engine/ops/flash_attention.c, em_flash_applies); tests/lua/flash_support_spec.lua
-- and tests/gpu/flash_spec.lua run every cell on tiny inputs and check that
-- the op does what its row says, errors included. docs/flash.md shows the table.
local core = require "ember.core"
local M = {}

local limits = core.flash_limits()
M.DECODE_MAX_TQ = limits.decode_max_tq   -- CUDA: Tq <= this takes the split-key decode kernel
M.CPU_MIN_TK = limits.cpu_min_tk         -- CPU: impl "auto" takes the tiled path from this many keys

M.DIMS = {16, 32, 64, 80, 96, 128, 256}
M.UNSUPPORTED_DIM = 48                   -- stands for every other head dim in the matrix
M.DTYPES = {"bf16", "f16", "f32", "f32+autocast", "f64"}
M.CAUSAL = {"none", "top_left", "bottom_right"}
M.GQA = {false, true}
M.DEVICES = {"cpu", "cuda"}

local SUPPORTED = {}
for _, d in ipairs(M.DIMS) do SUPPORTED[d] = true end

local function dims_list() return table.concat(M.DIMS, ", ") end

--- What runs for one case. `dtype` is one of M.DTYPES ("f32+autocast": f32
-- inputs inside ember.autocast, lowered to bf16 first). `opts.tf32` is the
-- ember.backends.tf32 setting that impl "auto" reads for f32 on CUDA
-- (default: the current one). Returns a row: the case's fields, then
-- `forward` (the kernel for Tq > DECODE_MAX_TQ), `decode` (Tq <= it),
-- `backward`, `auto` (what impl = "auto" runs), `precision`, and `error`
-- (the message F.flash_attention raises, nil where it runs).
function M.cell(device, dtype, d, causal, gqa, opts)
  opts = opts or {}
  local tf32 = opts.tf32
  if tf32 == nil then tf32 = core.cuda_allow_tf32() end
  local row = {device = device, dtype = dtype, d = d, causal = causal, gqa = gqa}
  local function refuse(msg, auto)
    row.forward, row.decode, row.backward, row.precision = "error", "error", "error", "-"
    row.auto, row.error = auto or "naive", msg
    return row
  end
  -- the op checks a CUDA tensor's dtype before its head dim (the H100 run
  -- of 2026-11-27 caught the matrix naming the head dim for f64 at d 48)
  if device ~= "cpu" and dtype == "f64" then
    return refuse("expected bf16, f16 or f32 q, k and v on CUDA, got f64")
  end
  if not SUPPORTED[d] then
    return refuse(("no kernel for head dim %d (supported: %s)"):format(d, dims_list()))
  end
  if device == "cpu" then
    row.forward, row.decode, row.backward = "cpu tiled", "cpu tiled", "cpu tiled"
    row.precision = dtype == "f64" and "f64" or "f32"
    row.auto = ("cpu tiled from Tk >= %d, naive below"):format(M.CPU_MIN_TK)
    return row
  end
  if dtype == "f32" then
    row.forward, row.decode, row.backward = "flash_fwd (tf32)", "flash_decode (f32)", "flash_bwd (tf32)"
    row.precision = "tf32 mma, f32 softmax"
    row.auto = tf32 and "flash" or "naive (f32; flash with ember.backends.tf32(true))"
    return row
  end
  local mma = dtype == "f16" and "f16" or "bf16"
  row.forward, row.decode, row.backward = "flash_fwd (" .. mma .. ")", "flash_decode (" .. mma .. ")",
    "flash_bwd (" .. mma .. ")"
  -- Hopper: the wgmma forward (flash_fwd_wg2.cu) at d 64 and 128 (docs/flash.md, Step 3), and at d 80 and
  -- 96 the d 128 kernels on zero-filled columns unless EMBER_FLASH_WG_PAD=0 (Step 7)
  if d == 64 or d == 128 then
    row.forward = (d == 64 and "flash_fwd_wg2 (3 consumers)" or "flash_fwd_wg2") .. " on sm_90, else flash_fwd (" .. mma .. ")"
    row.backward = "flash_bwd_wg on sm_90, else flash_bwd (" .. mma .. ")"
  elseif (d == 80 or d == 96) and os.getenv("EMBER_FLASH_WG_PAD") ~= "0" then
    row.forward = "flash_fwd_wg2 (as d 128) on sm_90, else flash_fwd (" .. mma .. ")"
    row.backward = "flash_bwd_wg (as d 128) on sm_90, else flash_bwd (" .. mma .. ")"
  end
  row.precision = mma .. " mma, f32 softmax"
  row.auto = "flash"
  return row
end

--- Every case: devices x dtypes x head dims (M.DIMS and M.UNSUPPORTED_DIM) x
-- causal x GQA, as M.cell rows (opts passed on).
function M.rows(opts)
  local out = {}
  for _, dev in ipairs(M.DEVICES) do
    for _, dt in ipairs(M.DTYPES) do
      local dims = {table.unpack(M.DIMS)}
      dims[#dims + 1] = M.UNSUPPORTED_DIM
      for _, d in ipairs(dims) do
        for _, c in ipairs(M.CAUSAL) do
          for _, g in ipairs(M.GQA) do out[#out + 1] = M.cell(dev, dt, d, c, g, opts) end
        end
      end
    end
  end
  return out
end

local COLS = {"device", "dtype", "d", "causal", "gqa", "forward", "decode", "backward", "auto"}
M.COLUMNS = COLS

local function same_kernels(a, b)
  for _, k in ipairs({"forward", "decode", "backward", "auto", "error"}) do
    if a[k] ~= b[k] then return false end
  end
  return true
end

--- The rows merged where causal and GQA change nothing (every supported
-- case today: causal and GQA are template-free branches of the same
-- kernels): one row per device x dtype x d with causal = gqa = "any".
function M.compact(rows)
  local out, i = {}, 1
  local per = #M.CAUSAL * #M.GQA
  while i <= #rows do
    local group, uniform = {}, true
    for j = i, i + per - 1 do
      group[#group + 1] = rows[j]
      if not same_kernels(rows[i], rows[j]) then uniform = false end
    end
    if uniform then
      local r = {}
      for k, v in pairs(rows[i]) do r[k] = v end
      r.causal, r.gqa = "any", "any"
      out[#out + 1] = r
    else
      for _, r in ipairs(group) do out[#out + 1] = r end
    end
    i = i + per
  end
  return out
end

local function cellstr(r, k)
  local v = r[k]
  if k == "d" and v == M.UNSUPPORTED_DIM then return "other" end
  if k == "gqa" and type(v) == "boolean" then return v and "yes" or "no" end
  return tostring(v)
end

--- The rows as an aligned text table (a Markdown table with markdown = true),
-- each refused case followed by its error message.
function M.format(rows, markdown)
  local w = {}
  for i, k in ipairs(COLS) do
    w[i] = #k
    for _, r in ipairs(rows) do w[i] = math.max(w[i], #cellstr(r, k)) end
  end
  local lines = {}
  local function line(cells)
    if markdown then return "| " .. table.concat(cells, " | ") .. " |" end
    local parts = {}
    for i, c in ipairs(cells) do parts[i] = c .. string.rep(" ", w[i] - #c) end
    return (table.concat(parts, "  "):gsub("%s+$", ""))
  end
  lines[1] = line(COLS)
  if markdown then
    local sep = {}
    for i = 1, #COLS do sep[i] = "---" end
    lines[2] = line(sep)
  end
  for _, r in ipairs(rows) do
    local cells = {}
    for i, k in ipairs(COLS) do cells[i] = cellstr(r, k) end
    lines[#lines + 1] = line(cells)
  end
  return table.concat(lines, "\n")
end

return M
