-- compare.lua — how the GPU specs compare a CUDA result with the CPU's
-- (loaded with dofile by the specs of tests/gpu; not a spec itself). It
-- returns a second value, a fresh copy of ../lua/helpers.lua, so a spec that
-- wants both writes one line instead of two dofiles and a path:
--   local C, H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "compare.lua")
--
-- One rule everywhere, stated exactly: element by element, in f64,
--     |got - ref| <= atol + rtol * |ref|,   atol = rtol * max(1, max |ref|)
-- NaN must meet NaN and ±inf the same infinity; shapes must be equal.
-- The atol term scales with the tensor's largest value so that an element
-- that cancels to ~0 (a sum of randn values, a gradient through a difference)
-- is held to the precision of the operands that produced it, not to a
-- relative bound it cannot meet; a wrong formula is off by O(max |ref|) and
-- still fails.
--
-- rtol by dtype, and why:
--   f64  1e-12   both sides compute in double; only summation order differs.
--   f32  1e-5    f32 arithmetic (2^-24 per rounding) plus device libm
--                (expf/tanhf/erff within 2 ulp) and a different summation
--                order than the CPU's double accumulation: far below 1e-5
--                for the O(1)-valued, <= 10^5-term cases of these specs.
--   bf16 1e-2    about five bf16 roundings (2^-9 each): an op's output is
--                rounded once, a backward formula chains a few such ops.
--   f16  2.5e-3  the same five roundings at f16's 2^-11.
--   integer and bool dtypes: exact (rtol 0).
local ember = require "ember"
local F, core = ember.nn.functional, ember.core

local M = {}

M.RTOL = {f64 = 1e-12, f32 = 1e-5, bf16 = 1e-2, f16 = 2.5e-3}

function M.rtol(dtype) return M.RTOL[dtype] or 0 end

local function shape_str(t)
  return "(" .. table.concat(t.shape, ",") .. ")"
end

--- Flat f64 values of a tensor on the CPU.
function M.values(t)
  local c = t:detach():to({device = "cpu", dtype = "f64"})
  if c:dim() == 0 then return {c:item()} end
  return c:reshape(-1):tolist()
end

--- Check got (any device/dtype) against ref; error names the first bad element.
function M.assert_close(got, ref, rtol, what)
  what = what or "values"
  if got == nil then error(what .. ": got nil", 2) end
  if shape_str(got) ~= shape_str(ref) then
    error(what .. ": shape " .. shape_str(got) .. ", expected " .. shape_str(ref), 2)
  end
  local g, r = M.values(got), M.values(ref)
  local scale = 1
  for _, v in ipairs(r) do
    if v == v and v ~= math.huge and v ~= -math.huge and math.abs(v) > scale then scale = math.abs(v) end
  end
  local atol = rtol * scale
  for i = 1, #r do
    local x, y = g[i], r[i]
    local ok
    if y ~= y then ok = x ~= x
    elseif y == math.huge or y == -math.huge then ok = x == y
    else ok = x == x and math.abs(x - y) <= atol + rtol * math.abs(y) end
    if not ok then
      error(string.format("%s: element %d of %d: got %.9g, expected %.9g (|diff| %.3g > atol %.3g + rtol %.3g * |ref|)",
        what, i, #r, x, y, math.abs(x - y), atol, rtol, rtol), 2)
    end
  end
end

--- Exact equality of values (integers, bools, bit-exact float ops), and dtype.
function M.assert_equal(got, ref, what)
  what = what or "values"
  if got.dtype ~= ref.dtype then error(what .. ": dtype " .. got.dtype .. ", expected " .. ref.dtype, 2) end
  M.assert_close(got, ref, 0, what)
end

--- Equal values, checked where the tensors are (one max of |got − ref| in
-- f32) rather than element by element in Lua as assert_equal does: for the
-- millions of elements of a model's parameters and optimizer state compared
-- bit for bit. For NaN-free tensors of a dtype f32 holds exactly (f32, bf16,
-- f16): a zero maximum is equal bits up to the sign of zero.
function M.assert_same_bits(got, ref, what)
  what = what or "values"
  local x, y = got:cpu():float(), ref:cpu():float()
  if shape_str(x) ~= shape_str(y) then error(what .. ": shape " .. shape_str(x) .. ", expected " .. shape_str(y), 2) end
  local d = (x - y):abs():max():item()
  if d ~= 0 then error(string.format("%s: max |got - ref| = %.9g, expected 0", what, d), 2) end
end

--- The norm-wise relative error ‖got − want‖ / ‖want‖, in f64 on the CPU
-- (the measure METHOD.md recommends for whole-tensor comparisons).
function M.rel_error(got, want)
  local g, w = got:cpu():to("f64"), want:cpu():to("f64")
  -- plain error(): this chunk is loaded with dofile, outside busted's `assert`
  if shape_str(g) ~= shape_str(w) then
    error("shape " .. shape_str(g) .. ", expected " .. shape_str(w), 2)
  end
  local num = ((g - w) ^ 2):sum():item()
  local den = (w ^ 2):sum():item()
  return math.sqrt(num / math.max(den, 1e-300))
end

--- Assert rel_error(got, want) <= tol; returns the error.
function M.assert_rel(got, want, tol, what)
  local e = M.rel_error(got, want)
  if not (e <= tol) then error(string.format("%s: relative error %.3g > %.3g", what, e, tol), 2) end
  return e
end

--- The attention specs' shared pieces (flash_spec, flash_wg_spec, flash_wg_bwd_spec):
-- a fresh leaf copy of t that requires grad;
function M.leaf(t) local c = t:detach():clone(); c.requires_grad = true; return c end
-- the (B, H, T, D) view of (B, T, H, D) memory, as the model's head split makes it;
function M.bthd(t) return t:transpose(1, 2):contiguous():transpose(1, 2) end
--- (B, H, T, D) values as a view of (B, H, T, D + 48) memory (a row stride that is not D, as a slice of a fused
-- projection has), the 48 columns past D holding 1000·t's first 48: a kernel that reads past D is far off.
function M.wide(t)
  local d = t.shape[4]
  return ember.cat({t, t:narrow(3, 0, 48) * 1000}, 3):narrow(3, 0, d)
end
-- k (B, Hkv, T, d) with each kv head repeated for its group of q heads: (B, H, T, d) (3-D: as is).
function M.repeat_kv(k, H)
  if #k.shape == 3 or k.shape[2] == H then return k end
  local B, Hkv, T, d = table.unpack(k.shape)
  return k:unsqueeze(2):expand(B, Hkv, H // Hkv, T, d):reshape(B, H, T, d)
end
-- the largest |a - b| over all elements, in f64 on the CPU
function M.max_abs(a, b) return (a:cpu():to("f64") - b:cpu():to("f64")):abs():max():item() end

--- The backward specs' (flash_wg_bwd_spec, flash_fused_bwd_spec) gradients, each {dq =, dk =, dv =}:
-- of fn(q, k, v) through autograd from fresh leaves, with g as the output's gradient; `layout` (bthd, wide),
-- when given, views each leaf before fn (a leaf is a contiguous clone: a layout applied before it would be lost);
function M.attn_grads(fn, q, k, v, g, layout)
  local qq, kk, vv = M.leaf(q), M.leaf(k), M.leaf(v)
  local lay = layout or function(t) return t end
  local o = fn(lay(qq), lay(kk), lay(vv))
  o:backward(g)
  return {dq = qq.grad, dk = kk.grad, dv = vv.grad}
end
-- the f64 reference on the CPU (repeat_kv sums a kv head's group);
function M.attn_ref64(q, k, v, g, causal)
  local q6, k6, v6 = M.leaf(q:cpu():to("f64")), M.leaf(k:cpu():to("f64")), M.leaf(v:cpu():to("f64"))
  local H = q.shape[2]
  local o = F.scaled_dot_product_attention(q6, M.repeat_kv(k6, H), M.repeat_kv(v6, H), {causal = causal, impl = "naive"})
  o:backward(g:cpu():to("f64"))
  return {dq = q6.grad, dk = k6.grad, dv = v6.grad}
end
-- the flash forward (whatever auto runs) and the backward `kernel` (core.flash_bwd_kernel), restored after;
function M.flash_grads(kernel, q, k, v, g, causal, layout)
  local prev = core.flash_bwd_kernel(kernel)
  local ok, res = pcall(M.attn_grads, function(a, b, c) return (F.flash_attention(a, b, c, causal)) end, q, k, v, g,
    layout)
  core.flash_bwd_kernel(prev)
  if not ok then error(res, 0) end
  return res
end
-- the naive composition on the same device.
function M.naive_grads(q, k, v, g, causal)
  return M.attn_grads(function(a, b, c)
    return F.scaled_dot_product_attention(a, b, c, {causal = causal, impl = "naive", enable_gqa = true})
  end, q, k, v, g)
end

--- The names of the kernels fn() launched (CUPTI), joined by " | ".
function M.kernel_names(fn)
  local P = ember.profiler.profile(function() fn() ember.cuda.synchronize() end, {print = false})
  local names = {}
  for _, r in ipairs(P:kernels()) do names[#names + 1] = r.key end
  P:close()
  return table.concat(names, " | ")
end

--- The number of kernel launches of fn() whose name contains `pat` (a plain substring), from the
-- profiler's per-kernel rows (kernel_names lists each name once, whatever its calls).
function M.kernel_calls(fn, pat)
  local P = ember.profiler.profile(function() fn() ember.cuda.synchronize() end, {print = false})
  local n = 0
  for _, r in ipairs(P:kernels()) do if r.key:find(pat, 1, true) then n = n + r.calls end end
  P:close()
  return n
end

--- nil when fn() (a forced wgmma kernel) runs here; the error when it failed for want of an sm_90 GPU;
-- any other error is raised.
function M.sm90_unavailable(fn)
  local ok, err = pcall(fn)
  if ok then return nil end
  if tostring(err):match("sm_90") then return tostring(err) end
  error(err, 0)
end

-- Checks by kernel name need CUPTI. Under compute-sanitizer (`make test-gpu-memcheck` sets
-- EMBER_UNDER_SANITIZER=1) CUPTI is not ours: there such a check is reported pending, with the reason;
-- anywhere else a CUPTI that does not load fails the test. `pending` is the running test's.
function M.need_cupti(pending)
  local backend, why = ember.profiler.backend()
  if backend == "cupti" then return end
  local msg = "kernel names need CUPTI; the profiler has " .. tostring(backend) .. " (" .. tostring(why) .. ")"
  if os.getenv("EMBER_UNDER_SANITIZER") == "1" then pending(msg .. " under compute-sanitizer") end
  error(msg, 2)
end

--- Runs `script` once per mode in a child `ember run`, with the environment
-- variable `var` set to the mode (such switches are read once a process) and
-- SCAN_SPEC_OUT naming the file the child saves its tensors to; returns
-- {[mode] = the tensors loaded}. H: the calling spec's helpers (its temp files);
-- env: more variables, the same for every mode (optional).
function M.mode_results(H, script, var, modes, env)
  local got = {}
  for _, mode in ipairs(modes) do
    local path = H.temp(".safetensors")
    local vars = {[var] = mode, SCAN_SPEC_OUT = path}
    for k, v in pairs(env or {}) do vars[k] = v end
    local _, err, code = H.ember({"run", script}, {env = vars})
    if code ~= 0 then error(("%s=%s child failed (exit %s): %s"):format(var, mode, tostring(code), err), 2) end
    got[mode] = ember.load(path)
  end
  return got
end

--- A script (a temp file) that trains a 2-layer 768-wide TransformerLM (12 heads of 64) on CUDA over T tokens
-- (B 4) for `steps` bf16-autocast AdamW steps and saves to $SCAN_SPEC_OUT the losses, the first step's gradients,
-- the final weights and a cached (KV) step's logits in f32 and under autocast: what a switch that must not change
-- results is compared on (M.mode_results). H: the calling spec's helpers (its temp files).
function M.train_small_script(H, T, steps)
  local script = H.temp(".lua")
  H.spit(script, ([==[
local ember = require "ember"
local nn, F = ember.nn, ember.nn.functional
ember.manual_seed(11)
local m = nn.TransformerLM{vocab_size = 101, context_length = %d, d_model = 768, d_ff = 1024, num_layers = 2,
  num_heads = 12, device = "cuda"}
local opt = ember.optim.AdamW(m:parameters(), {lr = 1e-2})
local data = ember.randint(0, 101, {4, %d}):cuda()
local x, y = data:narrow(1, 0, %d):contiguous(), data:narrow(1, 1, %d):contiguous()
local out, losses = {}, {}
for step = 1, %d do
  opt:zero_grad()
  local loss = ember.autocast("bf16", function() return F.cross_entropy(m(x), y) end)
  loss:backward()
  if step == 1 then for _, np in ipairs(m:named_parameters()) do out["g_" .. np[1]] = np[2].grad:cpu() end end
  opt:step()
  losses[step] = loss:float():cpu():reshape(1)
end
out.losses = ember.cat(losses, 0)
for name, p in pairs(m:state_dict()) do out["p_" .. name] = p:cpu() end
local x9 = x:narrow(1, 0, 9):contiguous()
out.cached_logits = m(x9, {cache = nn.KVCache(m, {batch = 4, max_len = %d})}):float():cpu()
local kv = nn.KVCache(m, {batch = 4, max_len = %d})
out.cached_logits_bf16 = ember.autocast("bf16", function() return m(x9, {cache = kv}) end):float():cpu()
ember.save(os.getenv("SCAN_SPEC_OUT"), out)
]==]):format(T, T + 1, T, T, steps, T, T))
  return script
end

--- Every tensor of got[ref] equals the same-named tensor of each mode in
-- `modes`, element for element (ne, not a difference: an overflow to inf must
-- meet the same inf); returns how many names were compared.
function M.assert_modes_agree(got, ref, modes)
  local n = 0
  for name, t in pairs(got[ref]) do
    for _, mode in ipairs(modes) do
      local other = got[mode][name]
      if not other then error(mode .. "'s results lack " .. name, 2) end
      if shape_str(other) ~= shape_str(t) then
        error(("%s vs %s, %s: shape %s, expected %s"):format(mode, ref, name, shape_str(other), shape_str(t)), 2)
      end
      local d = other:ne(t):sum():item()
      if d ~= 0 then
        error(("%s vs %s, %s: %d of %d elements differ, expected 0"):format(mode, ref, name, d, t:numel()), 2)
      end
    end
    n = n + 1
  end
  return n
end

return M, dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../lua/helpers.lua")
