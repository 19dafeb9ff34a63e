--- ember.nn.functional (alias F): stateless neural-network ops.
--
-- Thin wrappers over the C core (`ember.core`): every function here checks
-- little and computes nothing itself, so `F.linear(x, w)` costs what
-- `core.linear(x, w, nil)` costs. Defaults follow PyTorch (softmax over the
-- last dim when none is given, `scaled_dot_product_attention` non-causal
-- unless asked, scale 1/sqrt(d_head)). The core records autograd, so these
-- are differentiable wherever the core op is.
--
--     local F = require "ember.functional"   -- also ember.nn.functional
--     local y = F.swiglu(F.linear(x, w1), F.linear(x, w3))
-- @module ember.nn.functional

local F = {}
-- Registered before anything else is required, so `require "ember"` (whose
-- init.lua may require us back) finds this table instead of loading us twice.
package.loaded["ember.functional"] = F

local core = require "ember.core"
local ember = require "ember"

local function check_tensor(fname, argname, v)
  if type(v) ~= "userdata" then
    error(string.format("ember.nn.functional.%s: expected a tensor for '%s', got %s",
      fname, argname, type(v)), 3)
  end
end

--- Positions 0..T-1 as an i64 tensor on `device`.
-- @tparam integer T number of positions
-- @tparam[opt] string device
-- @return i64 tensor of shape (T)
function F.positions(T, device)
  return ember.arange(0, T, 1, {dtype = "i64", device = device})
end

--- y = x Wᵀ + b. x (..., in), w (out, in), b (out) or nil.
function F.linear(x, w, b)
  check_tensor("linear", "x", x)
  check_tensor("linear", "w", w)
  return core.linear(x, w, b)
end

--- Rows of `w` (n, d) picked by integer `ids` (any shape) -> (..., d).
function F.embedding(ids, w)
  check_tensor("embedding", "ids", ids)
  check_tensor("embedding", "w", w)
  return core.embedding(ids, w)
end

-- opts of the norms: nil, or a table with only out_dtype.
local function norm_opts(fname, opts)
  if opts == nil then return nil end
  if type(opts) ~= "table" then
    error(("ember.nn.functional.%s: expected an options table {out_dtype = ...}, got %s"):format(fname,
      type(opts)), 3)
  end
  for k in pairs(opts) do
    if k ~= "out_dtype" then
      error(("ember.nn.functional.%s: unknown option '%s' (expected out_dtype)"):format(fname, tostring(k)), 3)
    end
  end
  return opts
end

--- x / sqrt(mean(x², -1) + eps) * w, computed in f32. w may be nil.
-- opts.out_dtype: y in that float dtype, the values of
-- F.rmsnorm(x, w, eps):to(out_dtype). For f32 x (autocast's) and bf16/f16
-- the norm writes y directly (no cast pass) and y's gradient is summed in
-- f32 (its consumers' gradients widened exactly, as each would be had it
-- cast an f32 y itself), so the gradients of x and w are those of the
-- composition when y has one consumer, and of F.rmsnorm with each consumer
-- casting when it has several.
-- @param x tensor (..., d)
-- @param[opt] w tensor (d)
-- @tparam[opt=1e-5] number eps
-- @tparam[opt] table opts {out_dtype = "bf16"}
function F.rmsnorm(x, w, eps, opts)
  check_tensor("rmsnorm", "x", x)
  return core.rmsnorm(x, w, eps or 1e-5, norm_opts("rmsnorm", opts))
end

--- The pre-norm residual add and its norm in one op: s = x + r and
-- rmsnorm(s, w, eps), the same values as `x + r` then F.rmsnorm (one CUDA
-- kernel instead of two; EMBER_FUSE_ADD_RMSNORM=0 runs the two ops).
-- opts.out_dtype as F.rmsnorm's, for y (s keeps x's dtype).
-- @param x tensor (..., d), the residual stream
-- @param r tensor of x's shape (a branch output, e.g. bf16 under autocast)
-- @param[opt] w tensor (d)
-- @tparam[opt=1e-5] number eps
-- @tparam[opt] table opts {out_dtype = "bf16"}
-- @return s, y
function F.add_rmsnorm(x, r, w, eps, opts)
  check_tensor("add_rmsnorm", "x", x)
  check_tensor("add_rmsnorm", "r", r)
  return core.add_rmsnorm(x, r, w, eps or 1e-5, norm_opts("add_rmsnorm", opts))
end

--- (x - mean) / sqrt(var + eps) * weight + bias over the last dim (PyTorch's
-- layer_norm), computed in f32. normalized_shape is the last dim (a number or
-- {d}); a longer shape {..., d} normalizes over that many trailing dims.
-- @param x tensor (..., *normalized_shape)
-- @param normalized_shape number or table
-- @param[opt] weight tensor (normalized_shape)
-- @param[opt] bias tensor (normalized_shape)
-- @tparam[opt=1e-5] number eps
function F.layer_norm(x, normalized_shape, weight, bias, eps)
  check_tensor("layer_norm", "x", x)
  local ns = type(normalized_shape) == "table" and normalized_shape or {normalized_shape}
  local shape, k = x.shape, #ns
  if k < 1 or k > #shape then
    error(("ember.nn.functional.layer_norm: expected normalized_shape of 1..%d dims, got %d"):format(#shape, k), 2)
  end
  local d = 1
  for i = 1, k do
    if ns[i] ~= shape[#shape - k + i] then
      error(("ember.nn.functional.layer_norm: normalized_shape {%s} does not match x's trailing dims (x has shape {%s})")
        :format(table.concat(ns, ", "), table.concat(shape, ", ")), 2)
    end
    d = d * ns[i]
  end
  if k == 1 then return core.layer_norm(x, weight, bias, eps or 1e-5) end
  local flat = {}
  for i = 1, #shape - k do flat[i] = shape[i] end
  flat[#flat + 1] = d
  local y = core.layer_norm(x:reshape(flat), weight and weight:reshape({d}), bias and bias:reshape({d}), eps or 1e-5)
  return y:reshape(shape)
end

--- Rotary position embedding: rotates adjacent pairs (x[2j], x[2j+1]) of the
-- last dim by pos · theta^(−2j/d).
-- @param x tensor (..., T, d), d even
-- @param[opt] pos integer tensor (T); default 0..T-1 on x's device
-- @tparam[opt=10000] number theta
function F.rope(x, pos, theta)
  check_tensor("rope", "x", x)
  if pos == nil then
    local shape = x.shape
    if #shape < 2 then
      error("ember.nn.functional.rope: expected x of shape (..., T, d), got " ..
        #shape .. " dim(s)", 2)
    end
    pos = F.positions(shape[#shape - 1], x.device)
  end
  return core.rope(x, pos, theta or 10000)
end

--- RoPE of q and k together: F.rope(q, pos, theta), F.rope(k, pos, theta)
-- with one autograd node, and on CUDA one launch each way (attention's pair:
-- the angles are shared and half the launches go).
-- @param q tensor (..., T, d), d even
-- @param k tensor (..., T, d) on q's device
-- @param[opt] pos integer tensor (T); default 0..T-1 of q's T on q's device
-- @tparam[opt=10000] number theta
-- @return q rotated, k rotated
function F.rope_qk(q, k, pos, theta)
  check_tensor("rope_qk", "q", q)
  check_tensor("rope_qk", "k", k)
  if pos == nil then
    local shape = q.shape
    if #shape < 2 then
      error("ember.nn.functional.rope_qk: expected q of shape (..., T, d), got " ..
        #shape .. " dim(s)", 2)
    end
    pos = F.positions(shape[#shape - 1], q.device)
  end
  return core.rope_qk(q, k, pos, theta or 10000)
end

--- silu(x) = x · sigmoid(x).
function F.silu(x) return core.silu(x) end
--- max(x, 0).
function F.relu(x) return core.relu(x) end
--- GELU: exact (erf) by default, as PyTorch's; opts.approximate = "tanh"
-- gives 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))) (issue 12).
function F.gelu(x, opts)
  local approx = opts and opts.approximate or "none"
  if type(opts) == "string" then approx = opts end   -- F.gelu(x, "tanh")
  if approx == "tanh" then return core.gelu_tanh(x) end
  if approx ~= "none" then
    error(("ember.nn.functional.gelu: expected approximate \"none\" or \"tanh\", got %s"):format(tostring(approx)), 2)
  end
  return core.gelu(x)
end
--- silu(a) ⊙ b, fused.
function F.swiglu(a, b)
  check_tensor("swiglu", "a", a)
  check_tensor("swiglu", "b", b)
  return core.swiglu(a, b)
end

--- Softmax along `dim` (default -1, the last).
function F.softmax(x, dim) return core.softmax(x, dim or -1) end
--- Log-softmax along `dim` (default -1, the last).
function F.log_softmax(x, dim) return core.log_softmax(x, dim or -1) end

-- F.cross_entropy (with its options) is defined in the issue 12 block below.

--- FlashAttention: softmax(q kᵀ · scale + causal mask) v without
-- materialising the score matrix — the CUDA kernels (bf16/f16; f32 on the
-- TF32 tensor cores, or lowered to bf16/f16 under ember.autocast) or the
-- tiled CPU path (any float dtype). Returns O and the
-- rows' log-sum-exp L (B, H, Tq) or (B, Tq), f32 (f64 for f64 inputs).
-- @param q tensor (B, H, Tq, d) or (B, Tq, d) (one head)
-- @param k tensor (B, Hkv, Tk, d) or (B, Tk, d); H a multiple of Hkv
--   (grouped-query attention: head h reads kv head h // (H / Hkv))
-- @param v tensor shaped as k
-- @param[opt=false] causal false, true or "top_left" (query i sees keys
--   j <= i, PyTorch's is_causal) or "bottom_right" (j <= i + Tk - Tq: the
--   queries are the last Tq positions of a KV cache; needs Tq <= Tk)
-- @param[opt] opts a number (the scale, default 1/√d) or a table: `scale`,
--   `rope = {pos = p, theta = θ}`: q and k are given un-rotated and RoPE
--   (F.rope's: adjacent pairs, angle p · θ^(−2j/d)) is applied inside, the
--   gradients w.r.t. the un-rotated q and k; pos an integer tensor
--   broadcasting to q's and k's leading dims (default 0..T-1 on q's device;
--   one pos for both, so Tq = Tk), θ default 10000. The same values as
--   F.rope_qk then F.flash_attention (docs/flash.md, "RoPE inside").
function F.flash_attention(q, k, v, causal, opts)
  check_tensor("flash_attention", "q", q)
  check_tensor("flash_attention", "k", k)
  check_tensor("flash_attention", "v", v)
  if type(opts) ~= "table" then
    if opts ~= nil and type(opts) ~= "number" then
      error("ember.nn.functional.flash_attention: expected a scale (number) or an options table, got " ..
        type(opts), 2)
    end
    return core.flash_attention(q, k, v, causal, opts or 0)
  end
  for key in pairs(opts) do
    if key ~= "scale" and key ~= "rope" then
      error(("ember.nn.functional.flash_attention: unknown option '%s' (expected scale or rope)"):format(
        tostring(key)), 2)
    end
  end
  local rope = opts.rope
  if rope == nil then return core.flash_attention(q, k, v, causal, opts.scale or 0) end
  if type(rope) ~= "table" then
    error("ember.nn.functional.flash_attention: expected rope to be a table {pos = , theta = }, got " ..
      type(rope), 2)
  end
  for key in pairs(rope) do
    if key ~= "pos" and key ~= "theta" then
      error(("ember.nn.functional.flash_attention: unknown rope option '%s' (expected pos or theta)"):format(
        tostring(key)), 2)
    end
  end
  local pos = rope.pos
  if pos == nil then
    local shape = q.shape
    if #shape < 3 then
      error("ember.nn.functional.flash_attention: expected q of shape (B, H, T, D) or (B, T, D), got " ..
        #shape .. " dim(s)", 2)
    end
    pos = F.positions(shape[#shape - 1], q.device)
  elseif type(pos) ~= "userdata" then
    error("ember.nn.functional.flash_attention: expected rope.pos to be an integer tensor, got " .. type(pos), 2)
  end
  if rope.theta ~= nil and type(rope.theta) ~= "number" then
    error("ember.nn.functional.flash_attention: expected rope.theta to be a number, got " .. type(rope.theta), 2)
  end
  return core.flash_attention_rope(q, k, v, causal, opts.scale or 0, pos, rope.theta or 10000)
end

--- Generation's decode attention: a few queries against a key/value cache
-- whose filled length `n_keys` is a device tensor, so one captured CUDA graph
-- of a decode step serves every step (nn.KVCache's decode step under
-- EMBER_KV_DECODE=flash). Query i sees the keys j < n − Tq + 1 + i of the
-- first n = n_keys[b] (bottom-right causal against the filled part); a row
-- that sees no key gives 0. CUDA: the split-key decode kernels, reading only
-- the n filled keys (bf16, f16, f32 with f32 arithmetic); n_keys is never
-- read on the host there, so a count past max_len is clamped to max_len, a
-- negative one read as 0. CPU: any float dtype, F.flash_attention on the
-- first n keys. Forward only (an error when an input requires grad).
-- Returns o (B, H, Tq, D) in q's dtype.
-- @param q tensor (B, H, Tq, D), 1 <= Tq <= 16
-- @param k_cache tensor (B, Hkv, max_len, D), H a multiple of Hkv (GQA)
-- @param v_cache tensor shaped as k_cache; q's dtype and device for all three
-- @param n_keys i64 tensor (1) or (B) on q's device: keys filled
-- @param[opt] opts a number (the scale, default 1/√D) or a table {scale = }
function F.flash_decode(q, k_cache, v_cache, n_keys, opts)
  check_tensor("flash_decode", "q", q)
  check_tensor("flash_decode", "k_cache", k_cache)
  check_tensor("flash_decode", "v_cache", v_cache)
  check_tensor("flash_decode", "n_keys", n_keys)
  local scale = opts
  if type(opts) == "table" then
    for key in pairs(opts) do
      if key ~= "scale" then
        error(("ember.nn.functional.flash_decode: unknown option '%s' (expected scale)"):format(tostring(key)), 2)
      end
    end
    scale = opts.scale
  end
  if scale ~= nil and type(scale) ~= "number" then
    error("ember.nn.functional.flash_decode: expected a scale (number) or an options table {scale = }, got " ..
      type(scale), 2)
  end
  return core.flash_decode(q, k_cache, v_cache, n_keys, scale or 0)
end

--- The attention support matrix: one row per device x dtype x head dim x
-- causal x GQA case, saying which kernel runs forward (Tq > 16), for
-- decoding (Tq <= 16) and backward, what impl = "auto" picks, and the error
-- F.flash_attention raises for the cases it refuses (ember.flash_support;
-- `ember attention --matrix` prints it).
-- @tparam[opt] table opts `tf32`: the ember.backends.tf32 setting to assume
--   (default: the current one; it decides "auto" for f32 on CUDA)
function F.flash_support(opts) return require("ember.flash_support").rows(opts) end

local SDPA_IMPLS = {auto = core.attention, naive = core.attention_naive,
  flash = function(q, k, v, causal, scale) return (core.flash_attention(q, k, v, causal, scale)) end}
local SDPA_KEYS = {causal = true, is_causal = true, scale = true, impl = true, enable_gqa = true}

--- softmax(q kᵀ · scale + mask) v.
-- @param q tensor (..., Tq, d)
-- @param k tensor (..., Tk, d)
-- @param v tensor (..., Tk, d)
-- @tparam[opt] table opts `causal` (default false; true or "top_left" is
--   PyTorch's is_causal, "bottom_right" aligns the mask to the end of the
--   keys; `is_causal`, PyTorch's spelling, is taken too), `scale` (default 1/√d), `enable_gqa` (as PyTorch's: q with H heads
--   in dim -3 against k, v with Hkv heads, H a multiple of Hkv), `impl`:
--   "auto" (the default: flash where it applies — CUDA with bf16/f16,
--   autocast, or f32 while ember.backends.tf32 is on; the CPU from 256 keys; 3-D or 4-D, d in {16, 32, 64, 80,
--   96, 128, 256} — the naive composition elsewhere), "naive" or "flash" (an
--   error where it does not apply)
function F.scaled_dot_product_attention(q, k, v, opts)
  opts = opts or {}
  if type(opts) ~= "table" then
    error("ember.nn.functional.scaled_dot_product_attention: expected an options table, got " ..
      type(opts), 2)
  end
  for key in pairs(opts) do
    if not SDPA_KEYS[key] then
      error(("ember.nn.functional.scaled_dot_product_attention: unknown option '%s' (expected causal, " ..
        "is_causal, scale, impl or enable_gqa)"):format(tostring(key)), 2)
    end
  end
  local causal = opts.causal
  if opts.is_causal ~= nil then   -- PyTorch's name for causal = true
    if type(opts.is_causal) ~= "boolean" then
      error("ember.nn.functional.scaled_dot_product_attention: expected is_causal to be a boolean, got " ..
        type(opts.is_causal), 2)
    end
    if causal ~= nil and (causal ~= false) ~= opts.is_causal then
      error(("ember.nn.functional.scaled_dot_product_attention: causal = %s and is_causal = %s disagree " ..
        "(give one of them)"):format(tostring(causal), tostring(opts.is_causal)), 2)
    end
    causal = causal or opts.is_causal
  end
  local impl = opts.impl or "auto"
  local fn = SDPA_IMPLS[impl]
  if not fn then
    error("ember.nn.functional.scaled_dot_product_attention: expected impl 'auto', 'naive' or 'flash', got " ..
      tostring(impl), 2)
  end
  check_tensor("scaled_dot_product_attention", "q", q)
  check_tensor("scaled_dot_product_attention", "k", k)
  check_tensor("scaled_dot_product_attention", "v", v)
  -- as PyTorch: heads that differ (and do not broadcast) need enable_gqa
  local qs, ks = q.shape, k.shape
  if not opts.enable_gqa and #qs >= 3 and #ks >= 3 then
    local hq, hk = qs[#qs - 2], ks[#ks - 2]
    if hk ~= hq and hk ~= 1 then
      error(("ember.nn.functional.scaled_dot_product_attention: q has %d heads (dim -3) and k %d: " ..
        "pass enable_gqa = true for grouped-query attention"):format(hq, hk), 2)
    end
  end
  return fn(q, k, v, causal, opts.scale or 0)
end

-- ---------------------------------------------------------------------------
-- issue 12: dropout and losses (docs/api.md §19, §20)

local REDUCTIONS = {mean = true, sum = true, none = true}

-- opts as a table whose keys are all in `allowed`; "ember.nn.functional.<f>: ..." otherwise.
local function loss_opts(fname, opts, allowed)
  if opts == nil then return {}, "mean" end
  if type(opts) ~= "table" then
    error(("ember.nn.functional.%s: expected an options table, got %s"):format(fname, type(opts)), 3)
  end
  for k in pairs(opts) do
    if not allowed[k] then
      error(("ember.nn.functional.%s: unknown option '%s'"):format(fname, tostring(k)), 3)
    end
  end
  local r = opts.reduction or "mean"
  if not REDUCTIONS[r] then
    error(("ember.nn.functional.%s: expected reduction \"mean\", \"sum\" or \"none\", got %s")
      :format(fname, tostring(r)), 3)
  end
  return opts, r
end

local function reduce(l, r)
  if r == "mean" then return l:mean() elseif r == "sum" then return l:sum() end
  return l
end

--- Dropout: in training, zero each element with probability p and scale the
-- rest by 1/(1-p) (the mask from the Philox stream, regenerated for backward);
-- otherwise (or p == 0) x itself.
-- @param x float tensor
-- @tparam[opt=0.5] number p in [0, 1]
-- @tparam[opt=true] boolean training
function F.dropout(x, p, training)
  check_tensor("dropout", "x", x)
  p = p == nil and 0.5 or p
  if type(p) ~= "number" or not (p >= 0 and p <= 1) then
    error(("ember.nn.functional.dropout: expected p in [0, 1], got %s"):format(tostring(p)), 2)
  end
  if training == false or p == 0 then return x end
  return core.dropout(x, p)
end

--- Cross-entropy of logits (..., V) against integer targets (...), fused.
-- opts: reduction ("mean" over the targets that are not ignore_index, "sum",
-- "none": the per-target losses), ignore_index (-100), label_smoothing (0).
function F.cross_entropy(logits, targets, opts)
  check_tensor("cross_entropy", "logits", logits)
  check_tensor("cross_entropy", "targets", targets)
  local o, r = loss_opts("cross_entropy", opts, {reduction = true, ignore_index = true, label_smoothing = true})
  return core.cross_entropy_ex(logits, targets, o.ignore_index or -100, o.label_smoothing or 0, r)
end

local FLOATS = {f32 = true, f64 = true, bf16 = true, f16 = true}

-- A loss of the difference alone: f(input - target) reduced; target broadcasts
-- to input. Float operands: one fused op (engine/ops/loss_diff.c); others (an
-- integer sum, say) the composition f(input - target) as before.
local function difference_loss(fname, f)
  local fused = core[fname]
  return function(input, target, opts)
    check_tensor(fname, "input", input)
    check_tensor(fname, "target", target)
    local _, r = loss_opts(fname, opts, {reduction = true})
    if FLOATS[input.dtype] and FLOATS[target.dtype] then return fused(input, target, r) end
    return reduce(f(input - target), r)
  end
end

--- (input - target)² reduced.
F.mse_loss = difference_loss("mse_loss", function(d) return d:square() end)
--- |input - target| reduced.
F.l1_loss = difference_loss("l1_loss", function(d) return d:abs() end)

--- Negative log-likelihood of log-probabilities input (N, C), (N, C, d...)
-- or (C) at integer targets (N), (N, d...) or (): −w[t] · input[n, t], one
-- fused gather (engine/ops/loss_nll.c). opts: weight (C), ignore_index
-- (-100), reduction ("mean": divided by the summed weights of the targets
-- that count, as PyTorch). On the CPU a target outside [0, C) that is not
-- ignore_index is an error; on CUDA it makes the loss NaN (no device read).
function F.nll_loss(input, target, opts)
  check_tensor("nll_loss", "input", input)
  check_tensor("nll_loss", "target", target)
  local o, r = loss_opts("nll_loss", opts, {weight = true, ignore_index = true, reduction = true})
  local nd = input:dim()
  if nd < 1 or target:dim() ~= math.max(nd - 1, 0) then
    error(("ember.nn.functional.nll_loss: expected input (N, C, d...) and target (N, d...), got input of %d dims "
      .. "and target of %d dims"):format(nd, target:dim()), 2)
  end
  local logp = input
  if nd >= 3 then   -- (N, C, d...) -> (N, d..., C): the class dim last, as a view (read in place)
    local perm = {0}
    for d = 2, nd - 1 do perm[#perm + 1] = d end
    perm[#perm + 1] = 1
    logp = input:permute(table.unpack(perm))
  end
  for i = 1, #target.shape do
    if target.shape[i] ~= logp.shape[i] then
      error(("ember.nn.functional.nll_loss: expected target of shape [%s] for input of shape [%s], got [%s]")
        :format(table.concat(logp.shape, ", ", 1, #logp.shape - 1), table.concat(input.shape, ", "),
          table.concat(target.shape, ", ")), 2)
    end
  end
  if o.weight ~= nil then check_tensor("nll_loss", "weight", o.weight) end
  return core.nll_loss(logp, target, o.weight, o.ignore_index or -100, r)
end

--- Binary cross-entropy on logits, numerically stable for any |x|, fused
-- (engine/ops/loss_bce.c): (1 − y) x + (1 + (pos_weight − 1) y) softplus(−x),
-- softplus(−x) = max(−x, 0) + log1p(exp(−|x|)). opts: weight (broadcasts to
-- the loss), pos_weight (broadcasts along the last dim), reduction.
function F.binary_cross_entropy_with_logits(input, target, opts)
  check_tensor("binary_cross_entropy_with_logits", "input", input)
  check_tensor("binary_cross_entropy_with_logits", "target", target)
  local o, r = loss_opts("binary_cross_entropy_with_logits", opts, {weight = true, pos_weight = true, reduction = true})
  if o.pos_weight ~= nil then check_tensor("binary_cross_entropy_with_logits", "pos_weight", o.pos_weight) end
  if o.weight ~= nil then check_tensor("binary_cross_entropy_with_logits", "weight", o.weight) end
  return core.bce_with_logits(input, target, o.weight, o.pos_weight, r)
end
-- ops-indexing block begin
--- One-hot encoding (PyTorch's F.one_hot): integer ids (...) -> (..., num_classes) i64.
-- num_classes -1 (the default) infers max(ids) + 1 (a host read: synchronises on CUDA).
function F.one_hot(ids, num_classes)
  check_tensor("one_hot", "ids", ids)
  return core.one_hot(ids, num_classes or -1)
end

--- Sums or means of embedding rows per bag (ember.indexing): ids (B, L), or
-- 1-D ids with 1-D offsets; mode "mean" (default) or "sum". -> (B, d)
function F.embedding_bag(ids, weight, offsets, mode)
  return require("ember.indexing").embedding_bag(ids, weight, offsets, mode)
end
-- ops-indexing block end

return F
