--- The two precision exercises of CS336 A2 §1.1.5, on Ember tensors.
--
--   ember run scripts/mixed_precision.lua                     # both parts, on cuda when available
--   ember run scripts/mixed_precision.lua --device cpu --json mp.jsonl --markdown mp.md
--
-- (a) mixed_precision_accumulation: add 0.01 to a zero accumulator 1000 times
--     (each `s:add_(x)` rounds to the accumulator's dtype, as PyTorch's `s += x`):
--       1. f32 accumulator, f32 value
--       2. f16 accumulator, f16 value
--       3. f32 accumulator, f16 value          (the add promotes x to f32)
--       4. f32 accumulator, f16 value cast to f32 first (x:to("f32"))
--     plus two bf16 rows (5. bf16 + bf16, 6. f32 + bf16), the dtype Ember's
--     autocast uses. The exact answer is 10; the table also gives
--     1000 × (0.01 as stored in the value's dtype), which separates the error of
--     representing 0.01 from the error of accumulating. PyTorch prints 10.0001,
--     9.9531, 10.0021, 10.0021 for the four.
-- (b) benchmarking_mixed_precision (a): the ToyModel (fc1 → relu → norm → fc2,
--     scripts/lib/amp_toy.lua; RMSNorm stands in for LayerNorm, which ember.nn
--     lacks) with f32 parameters, one forward + cross-entropy under
--     ember.autocast(dtype) and a backward after it; the dtypes of the
--     parameters, fc1's output, the norm's output, the logits, the loss and
--     the gradients, beside what PyTorch's autocast gives (a line of why each).
local ember = require "ember"
local argparse = require "argparse"

local parser = argparse("mixed_precision.lua",
  "Accumulation in f32/f16/bf16, and the dtypes autocast gives the ToyModel.")
parser:option("--device", "cpu or cuda[:N] (default: cuda when available).")
parser:option("--part", "Which exercise: accumulation, autocast or all.", "all")
  :choices({"all", "accumulation", "autocast"})
parser:option("--autocast", "Comma list of autocast dtypes for the dtype report.", "bf16,f16")
parser:option("--json", "Append one JSON line of results to this file.")
parser:option("--markdown", "Write the tables to this Markdown file.")
local args = parser:parse(arg)

local function fail(msg) io.stderr:write("mixed_precision.lua: ", msg, "\n") os.exit(2) end

local script_dir = (arg and arg[0] or ""):match("^(.*/)") or "./"
local S = dofile(script_dir .. "lib/study.lua")
local toy = dofile(script_dir .. "lib/amp_toy.lua")

S.resolve_device(args, fail)
local AUTOCAST = {}
for name in (args.autocast .. ","):gmatch("([^,]*),") do
  if name ~= "bf16" and name ~= "f16" then fail("--autocast expects a comma list of bf16, f16; got '" .. args.autocast .. "'") end
  AUTOCAST[#AUTOCAST + 1] = name
end

local runinfo = require "ember.runinfo"
local facts = runinfo.collect(args.device)
S.print_header(facts)
print(("config: part=%s autocast=%s device=%s"):format(args.part, table.concat(AUTOCAST, ","), args.device))

local md_table = require("ember.report").text_table

local result = {tool = "ember", commit = facts.commit, device = facts.device, driver = facts.driver,
  date = facts.date, config = {part = args.part, autocast = AUTOCAST, device = args.device},
  command = "ember run scripts/mixed_precision.lua " .. table.concat(arg, " ")}
local markdown = {}
local function emit(text)
  print(text)
  markdown[#markdown + 1] = text
end

-- ---------------------------------------------------------------------------
-- (a) accumulation

local N, VALUE = 1000, 0.01
local VARIANTS = {
  {acc = "f32", value = "f32", cast = false,
   why = "each add rounds to f32 (24 bits; ulp(8..16) = 9.5e-7): 1000 roundings drift by about 1e-4"},
  {acc = "f16", value = "f16", cast = false,
   why = "f16 keeps 11 bits, so every add rounds to the sum's ulp: in [4,8) (ulp 2^-8) +0.01 becomes +0.0117, past 8 (ulp 2^-7) +0.0078"},
  {acc = "f32", value = "f16", cast = false,
   why = "x is promoted to f32 before the add: the sum is exact to f32, the error is 0.01's f16 representation (+2.1e-4 relative), x1000"},
  {acc = "f32", value = "f16", cast = true,
   why = "the explicit cast is the promotion variant 3 does implicitly: the same numbers, the same sum"},
  {acc = "bf16", value = "bf16", cast = false, extra = true,
   why = "bf16 keeps 8 bits: at 4 the ulp is 2^-5 = 0.031, so +0.01 (< half an ulp) rounds back and the sum stalls"},
  {acc = "f32", value = "bf16", cast = false, extra = true,
   why = "as 3 with bf16's coarser 0.01 (+9.8e-4 relative): the f32 sum is right, the value is not"},
}

--- Sum VALUE N times into a zero accumulator of dtype acc, each value in dtype value.
local function accumulate(v)
  local s = ember.zeros({}, {dtype = v.acc, device = args.device})
  local x = ember.tensor(VALUE, {dtype = v.value, device = args.device})
  if v.cast then
    for _ = 1, N do s:add_(x:to("f32")) end
  else
    for _ = 1, N do s:add_(x) end
  end
  return s:item(), x:item()
end

local any_mismatch = false
if args.part ~= "autocast" then
  local rows, out = {}, {}
  for i, v in ipairs(VARIANTS) do
    local got, stored = accumulate(v)
    local ideal = N * stored               -- the sum of the stored values, in f64
    out[i] = {variant = i, accumulator = v.acc, value_dtype = v.value, cast_to_f32 = v.cast,
      result = got, exact = N * VALUE, error = got - N * VALUE, value_stored = stored,
      sum_of_stored = ideal, accumulation_error = got - ideal, extra = v.extra or false}
    local what = ("%s%s += %s%s"):format(v.extra and "(extra) " or "", v.acc, v.value, v.cast and " → f32" or "")
    rows[i] = {tostring(i), what, ("%.6f"):format(got), ("%+.2e"):format(got - N * VALUE),
      ("%.10f"):format(stored), ("%.6f"):format(ideal), ("%+.2e"):format(got - ideal)}
  end
  result.accumulation = out
  emit("")
  emit(("(a) accumulation: s = 0; %d times s += %g  (exact: %g)"):format(N, VALUE, N * VALUE))
  emit("")
  emit(md_table({"#", "accumulator += value", "result", "error vs 10", "0.01 as stored",
    "1000 × stored", "accumulation error"}, rows))
  emit("")
  for i, v in ipairs(VARIANTS) do emit(("%d. %s"):format(i, v.why)) end
end

-- ---------------------------------------------------------------------------
-- (b) autocast dtype report

local WHAT = {
  {"parameters", "model parameters inside autocast",
   "autocast casts a weight when an op uses it (a cached copy); the parameter itself stays f32 (master weights)"},
  {"fc1", "fc1 output (after relu)",
   "linear is on autocast's lower-precision list: inputs cast down, f32 accumulation, output in the autocast dtype; relu keeps it"},
  {"ln", "norm output",
   "norms are on the f32 list (PyTorch: layer_norm): the input is widened and mean/variance computed in f32, returned f32"},
  {"logits", "logits (fc2 output)",
   "fc2 is a linear again: its f32 input is cast down like fc1's"},
  {"loss", "loss",
   "cross-entropy (log-softmax + nll) is on the f32 list: exp/log/sum over the vocabulary need f32's range"},
  {"grads", "gradients",
   "a gradient flows back through the cast to the f32 leaf, so it is accumulated in the parameter's dtype"},
}

if args.part ~= "accumulation" then
  local reports = {}
  for _, dt in ipairs(AUTOCAST) do
    local ok, rep, each = pcall(toy.dtype_report, args.device, dt)
    if ok then
      local expected = toy.expected(dt)
      local match = true
      for _, w in ipairs(WHAT) do if rep[w[1]] ~= expected[w[1]] then match = false end end
      any_mismatch = any_mismatch or not match
      reports[dt] = {observed = rep, parameters = each, expected = expected, matches_pytorch = match}
    else
      reports[dt] = {error = tostring(rep)}
    end
  end
  result.autocast = reports

  local headers, rows = {"quantity"}, {}
  for _, dt in ipairs(AUTOCAST) do
    headers[#headers + 1] = "ember " .. dt
    headers[#headers + 1] = "PyTorch " .. dt
  end
  for _, w in ipairs(WHAT) do
    local row = {w[2]}
    for _, dt in ipairs(AUTOCAST) do
      local r = reports[dt]
      local got = r.error and "error" or r.observed[w[1]]
      local want = toy.expected(dt)[w[1]]
      row[#row + 1] = got == want and got or (got .. " ≠")
      row[#row + 1] = want
    end
    rows[#rows + 1] = row
  end
  emit("")
  emit("(b) autocast dtypes of the ToyModel (fc1 → relu → RMSNorm → fc2, f32 parameters; backward after the region)")
  emit("")
  emit(md_table(headers, rows))
  emit("")
  for _, w in ipairs(WHAT) do emit(("- %s: %s"):format(w[2], w[3])) end
  emit("- RMSNorm stands in for the assignment's LayerNorm (ember.nn has none); autocast treats both as norms.")
  for _, dt in ipairs(AUTOCAST) do
    local r = reports[dt]
    if r.error then
      emit(("- %s autocast: error (%s)"):format(dt, r.error:gsub("\n.*", "")))
    else
      emit(("- %s autocast matches PyTorch: %s"):format(dt, r.matches_pytorch and "yes" or "NO"))
    end
  end
end

if args.json then S.append_json(args.json, result, fail) end
if args.markdown then S.write_markdown(args.markdown, facts, markdown, fail) end
os.exit(any_mismatch and 1 or 0)
