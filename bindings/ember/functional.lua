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

local function flash_guard(fname)
  local fa = core.flash_attention
  if not fa then
    error("ember.nn.functional." .. fname ..
      ": impl 'flash' not available yet (ember.core.flash_attention is missing)", 3)
  end
  return fa
end

--- FlashAttention: softmax(q kᵀ / √d + causal mask) v without materialising
-- the score matrix. Returns O, and whatever else the core returns (the
-- log-sum-exp L, for tests).
-- @param q tensor (B, H, T, d)
-- @param k tensor (B, H, T, d)
-- @param v tensor (B, H, T, d)
-- @tparam[opt=false] boolean causal
function F.flash_attention(q, k, v, causal)
  local fa = flash_guard("flash_attention")
  return fa(q, k, v, causal and true or false)
end

--- softmax(q kᵀ · scale + mask) v.
-- @param q tensor (..., Tq, d)
-- @param k tensor (..., Tk, d)
-- @param v tensor (..., Tk, d)
-- @tparam[opt] table opts `causal` (default false, as PyTorch's is_causal),
--   `scale` (default 1/√d), `impl` ("naive", the default, or "flash")
function F.scaled_dot_product_attention(q, k, v, opts)
  opts = opts or {}
  if type(opts) ~= "table" then
    error("ember.nn.functional.scaled_dot_product_attention: expected an options table, got " ..
      type(opts), 2)
  end
  local causal = opts.causal and true or false
  local impl = opts.impl or "naive"
  if impl == "naive" then
    check_tensor("scaled_dot_product_attention", "q", q)
    check_tensor("scaled_dot_product_attention", "k", k)
    check_tensor("scaled_dot_product_attention", "v", v)
    return core.attention_naive(q, k, v, causal, opts.scale or 0)
  elseif impl == "flash" then
    local fa = flash_guard("scaled_dot_product_attention")
    if opts.scale ~= nil then return (fa(q, k, v, causal, opts.scale)) end
    return (fa(q, k, v, causal))
  end
  error("ember.nn.functional.scaled_dot_product_attention: expected impl 'naive' or 'flash', got " ..
    tostring(impl), 2)
end

return F
