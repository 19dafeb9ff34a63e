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

--- x / sqrt(mean(x², -1) + eps) * w, computed in f32. w may be nil.
-- @param x tensor (..., d)
-- @param[opt] w tensor (d)
-- @tparam[opt=1e-5] number eps
function F.rmsnorm(x, w, eps)
  check_tensor("rmsnorm", "x", x)
  return core.rmsnorm(x, w, eps or 1e-5)
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

--- silu(x) = x · sigmoid(x).
function F.silu(x) return core.silu(x) end
--- max(x, 0).
function F.relu(x) return core.relu(x) end
--- Exact (erf) GELU, as PyTorch's default.
function F.gelu(x) return core.gelu(x) end
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

--- Mean cross-entropy over all targets.
-- @param logits float tensor (..., V)
-- @param targets integer tensor (...) with values in [0, V)
-- @return 0-d tensor
function F.cross_entropy(logits, targets)
  check_tensor("cross_entropy", "logits", logits)
  check_tensor("cross_entropy", "targets", targets)
  return core.cross_entropy(logits, targets)
end

--- FlashAttention (CUDA, bf16/f16 or f32 under ember.autocast): softmax(q kᵀ
-- · scale + causal mask) v without materialising the score matrix. Returns O
-- and the rows' log-sum-exp L (B, H, Tq) f32.
-- @param q tensor (B, H, Tq, d)
-- @param k tensor (B, H, Tk, d)
-- @param v tensor (B, H, Tk, d)
-- @tparam[opt=false] boolean causal
-- @tparam[opt] number scale default 1/√d
function F.flash_attention(q, k, v, causal, scale)
  check_tensor("flash_attention", "q", q)
  check_tensor("flash_attention", "k", k)
  check_tensor("flash_attention", "v", v)
  return core.flash_attention(q, k, v, causal and true or false, scale or 0)
end

local SDPA_IMPLS = {auto = core.attention, naive = core.attention_naive,
  flash = function(q, k, v, causal, scale) return (core.flash_attention(q, k, v, causal, scale)) end}

--- softmax(q kᵀ · scale + mask) v.
-- @param q tensor (..., Tq, d)
-- @param k tensor (..., Tk, d)
-- @param v tensor (..., Tk, d)
-- @tparam[opt] table opts `causal` (default false, as PyTorch's is_causal),
--   `scale` (default 1/√d), `impl`: "auto" (the default: the flash kernels
--   where they apply — CUDA, bf16/f16 or autocast, 4-D, d in {16, 32, 64, 80,
--   96, 128} — the naive composition elsewhere), "naive" or "flash" (an error
--   where it does not apply)
function F.scaled_dot_product_attention(q, k, v, opts)
  opts = opts or {}
  if type(opts) ~= "table" then
    error("ember.nn.functional.scaled_dot_product_attention: expected an options table, got " ..
      type(opts), 2)
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
  return fn(q, k, v, opts.causal and true or false, opts.scale or 0)
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
