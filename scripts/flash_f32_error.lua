--- The error of attention in f32 against float64 (docs/flash.md, "f32 inputs
-- on CUDA"): flash in f32 (the TF32 kernels on CUDA, the tiled path on the
-- CPU), the naive composition in f32 with TF32 matmuls on and off, and
-- flash in bf16 for scale. Inputs randn f32 (B, H, T, d); the reference is
-- the naive composition in f64 on the CPU from the same values, with
-- autograd for dq, dk, dv. Two measures per output: max |err| / max |ref|
-- and the norm-wise ‖err‖ / ‖ref‖. Prints a Markdown table.
--
--   ember run scripts/flash_f32_error.lua                          # d 64,128, T 1024, causal, on CUDA
--   ember run scripts/flash_f32_error.lua --d 64 --seq 4096 --heads 2 --device cpu
local ember = require "ember"
local argparse = require "argparse"
local F = ember.nn.functional

local p = argparse("flash_f32_error.lua", "Attention error against f64: flash f32 (TF32), naive f32, flash bf16.")
p:option("--d", "Comma list of head dims.", "64,128")
p:option("--seq", "Sequence length (Tq = Tk).", "1024")
p:option("--batch", "Batch size.", "1")
p:option("--heads", "Heads.", "4")
p:option("--device", "Device.", "cuda")
p:flag("--no-causal", "No mask (default: causal).")
local a = p:parse(arg)
local B, H, T = tonumber(a.batch), tonumber(a.heads), tonumber(a.seq)
local causal = not a.no_causal

local function leaf(t) local c = t:detach():clone(); c.requires_grad = true; return c end
local function run(fn, q, k, v, g)
  local qq, kk, vv = leaf(q), leaf(k), leaf(v)
  local o = fn(qq, kk, vv)
  o:backward(g)
  return {o:detach(), qq.grad, kk.grad, vv.grad}
end
local function errs(got, ref)
  local d = got:to({device = "cpu", dtype = "f64"}) - ref
  return d:abs():max():item() / ref:abs():max():item(), (d:pow(2):sum():item() / ref:pow(2):sum():item()) ^ 0.5
end

local function naive(x, y, z) return F.scaled_dot_product_attention(x, y, z, {causal = causal, impl = "naive"}) end
local function flash(x, y, z) return (F.flash_attention(x, y, z, causal)) end

print(("B %d, H %d, T %d, causal %s, device %s; cells: max|err|/max|ref|, ||err||/||ref||"):format(B, H, T,
  tostring(causal), a.device))
print("| d | output | flash f32 (TF32) | naive f32, TF32 on | naive f32, TF32 off | flash bf16 |")
print("|---|---|---|---|---|---|")
for ds in a.d:gmatch("[^,]+") do
  local d = tonumber(ds)
  ember.manual_seed(d)
  local shape = {B, H, T, d}
  local q, k, v, g = ember.randn(shape), ember.randn(shape), ember.randn(shape), ember.randn(shape)
  local ref = run(naive, q:double(), k:double(), v:double(), g:double())
  local dev = function(t, dt) return t:to({device = a.device, dtype = dt or "f32"}) end
  local prev = ember.backends.tf32(false)
  local cols = {}
  cols[1] = run(flash, dev(q), dev(k), dev(v), dev(g))
  ember.backends.tf32(true)
  cols[2] = run(naive, dev(q), dev(k), dev(v), dev(g))
  ember.backends.tf32(false)
  cols[3] = run(naive, dev(q), dev(k), dev(v), dev(g))
  cols[4] = run(flash, dev(q, "bf16"), dev(k, "bf16"), dev(v, "bf16"), dev(g, "bf16"))
  ember.backends.tf32(prev)
  for i, name in ipairs({"o", "dq", "dk", "dv"}) do
    local cells = {}
    for c = 1, 4 do cells[c] = ("%.2e, %.2e"):format(errs(cols[c][i], ref[i])) end
    print(("| %d | %s | %s |"):format(d, name, table.concat(cells, " | ")))
  end
end
