-- bad_input_spec.lua — wrong calls get a Lua error that names the function
-- and says what was expected and what was received; none of them may crash
-- the process (busted itself would die, so reaching the summary is part of
-- the test).
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/bad_input_spec.lua
--
-- Each case is {title, function name (a Lua pattern), distinctive fragment
-- (plain text), the bad call}. The message must read "ember.NAME: ..." once
-- Lua's "file:line: " position prefix (added by luaL_error/error for errors
-- raised on behalf of a caller) is set aside; out-of-memory errors read
-- "out of memory ...".

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local F = ember.nn.functional

local strip_where = H.strip_where

-- Run fn, expect an error from ember.NAME whose text contains fragment.
-- name may be a list of acceptable names (e.g. a method and the op it wraps).
local function expect_error(name, fragment, fn)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error, but the call succeeded")
  assert(type(err) == "string", "expected a string error, got " .. type(err))
  local msg = strip_where(err)
  local names = type(name) == "table" and name or {name}
  local named = false
  for _, n in ipairs(names) do
    local prefix = n == "out of memory" and "^out of memory" or ("^ember%." .. n .. ":")
    if msg:find(prefix) then named = true end
  end
  assert(named, ("expected the message to start with ember.%s:, got: %s"):format(table.concat(names, " or ember."), err))
  assert(msg:find(fragment, 1, true), ("expected the message to contain %q, got: %s"):format(fragment, err))
end

local tmp, write_file = H.temp, H.spit

local z23 = function() return ember.zeros(2, 3) end

-- {title, name, fragment, call}
local CASES = {
  -- ---------------- shapes ----------------
  {"add of unbroadcastable shapes", "add", "cannot broadcast shapes [2, 3] and [4]",
    function() return z23() + ember.zeros(4) end},
  {"sub of unbroadcastable shapes (method form)", "sub", "[3, 2]",
    function() return z23():sub(ember.zeros(3, 2)) end},
  {"in-place mul_ whose broadcast result is larger than self", {"mul", "mul_"}, "[2, 3]",
    function() return ember.zeros(3):mul_(z23()) end},
  {"matmul with mismatched inner dims", "matmul", "(3 != 4)",
    function() return z23():matmul(ember.zeros(4, 5)) end},
  {"matmul with unbroadcastable batch dims", "matmul", "cannot be broadcast",
    function() return ember.zeros(2, 3, 4):matmul(ember.zeros(3, 4, 5)) end},
  {"matmul of a 0-dim tensor", "matmul", "at least 1 dim",
    function() return ember.tensor(1):matmul(ember.zeros(2)) end},
  {"view to a different element count", "view", "shape [4] is invalid for input of size 6",
    function() return z23():view(4) end},
  {"view with two -1", "view", "only one dimension can be -1",
    function() return z23():view(-1, -1) end},
  {"view of a transposed tensor", "view", "without copying",
    function() return z23():t():view(6) end},
  {"reshape to a different element count", "reshape", "invalid for input of size 6",
    function() return z23():reshape(5) end},
  {"expand of a non-1 dim", "expand", "cannot be expanded to 4",
    function() return z23():expand(4, 3) end},
  {"expand to fewer dims", "expand", "to 1 dims",
    function() return z23():expand(3) end},
  {"cat of tensors whose other dims differ", "cat", "got 4",
    function() return ember.cat({z23(), ember.zeros(2, 4)}, 0) end},
  {"cat of an empty list", "cat", "non-empty",
    function() return ember.cat({}, 0) end},
  {"stack of tensors of different shapes", "stack", "[3]",
    function() return ember.stack({ember.zeros(2), ember.zeros(3)}) end},
  {"where with unbroadcastable branches", "where", "cannot broadcast",
    function() return ember.where(ember.tensor({true}), ember.zeros(2), ember.zeros(3)) end},
  {"copy_ from a source that does not broadcast", "copy_", "[2]",
    function() return ember.zeros(3):copy_(ember.zeros(2)) end},
  {"copy_ from a larger source", "copy_", "cannot be broadcast to destination shape [3]",
    function() return ember.zeros(3):copy_(z23()) end},
  {"cross_entropy with targets of the wrong shape", "cross_entropy", "expected targets of shape [2]",
    function() return F.cross_entropy(ember.zeros(2, 5), ember.zeros(3, {dtype = "i64"})) end},
  {"cross_entropy with a target out of range", "cross_entropy", "out of range for 5 classes",
    function() return F.cross_entropy(ember.zeros(2, 5), ember.tensor({1, 7}, {dtype = "i64"})) end},
  {"embedding with an id past the table", "embedding", "id 9",
    function() return F.embedding(ember.tensor({0, 9}, {dtype = "i64"}), ember.zeros(5, 3)) end},
  {"embedding with a negative id", "embedding", "out of range",
    function() return F.embedding(ember.tensor({-1}, {dtype = "i64"}), ember.zeros(5, 3)) end},
  {"embedding with a 1-dim weight", "embedding", "weight to have 2 dims",
    function() return F.embedding(ember.tensor({0}, {dtype = "i64"}), ember.zeros(5)) end},
  {"rmsnorm with a weight that is not (D)", "rmsnorm", "expected weight of shape [4]",
    function() return F.rmsnorm(ember.zeros(2, 4), ember.zeros(3)) end},
  {"rmsnorm with a negative eps", "rmsnorm", "eps",
    function() return F.rmsnorm(ember.zeros(2, 4), nil, -1) end},
  {"rope of an odd last dim", "rope", "even last dim, got 3",
    function() return F.rope(ember.zeros(2, 3), ember.arange(2)) end},
  {"rope with positions of the wrong length", "rope", "positions of shape [3]",
    function() return F.rope(ember.zeros(4, 6), ember.arange(3)) end},
  {"attention with q and k of different head dims", "scaled_dot_product_attention", "[1, 4, 8], [1, 4, 6]",
    function()
      return F.scaled_dot_product_attention(ember.zeros(1, 4, 8), ember.zeros(1, 4, 6), ember.zeros(1, 4, 6))
    end},
  {"attention with a 1-dim q", "scaled_dot_product_attention", "at least 2 dims",
    function() return F.scaled_dot_product_attention(ember.zeros(8), ember.zeros(4, 8), ember.zeros(4, 8)) end},
  {"attention with k and v of different lengths", "scaled_dot_product_attention", "[4, 8] and [5, 8]",
    function() return F.scaled_dot_product_attention(ember.zeros(4, 8), ember.zeros(4, 8), ember.zeros(5, 8)) end},
  {"linear with x and weight that do not fit", "linear", "incompatible",
    function() return F.linear(z23(), ember.zeros(4, 5)) end},
  {"linear with a bias of the wrong size", "linear", "expected bias of shape [4]",
    function() return F.linear(z23(), ember.zeros(4, 3), ember.zeros(5)) end},
  {"backward with a gradient of the wrong shape", "backward", "expected a gradient of shape [3]",
    function() (ember.zeros(3, {requires_grad = true}) * 2):backward(ember.zeros(2)) end},

  -- ---------------- dtypes ----------------
  {"matmul of f32 with f64", "matmul", "same dtype",
    function() return z23():matmul(ember.zeros(3, 2, {dtype = "f64"})) end},
  {"matmul of bool tensors", "matmul", "bool",
    function() return ember.zeros(2, 2, {dtype = "bool"}):matmul(ember.zeros(2, 2, {dtype = "bool"})) end},
  {"mean of an integer tensor", "mean", "i64",
    function() return ember.arange(4):mean() end},
  {"var of an integer tensor", "var", "i64",
    function() return ember.arange(4):var() end},
  {"softmax of an integer tensor", "softmax", "i64",
    function() return ember.arange(4):softmax(0) end},
  {"negation of a bool tensor", "neg", "bool",
    function() return -ember.tensor({true}) end},
  {"an in-place float op on an integer tensor (PyTorch: Float can't be cast to Long)", {"exp", "exp_"}, "i64",
    function() return ember.arange(3):exp_() end},
  {"requires_grad on an integer tensor", "requires_grad", "got i64",
    function() ember.zeros(2, {dtype = "i64"}).requires_grad = true end},
  {"requires_grad=true when creating an integer tensor", {"tensor", "requires_grad"}, "got i32",
    function() return ember.tensor({1, 2}, {dtype = "i32", requires_grad = true}) end},
  {"cross_entropy with float targets", "cross_entropy", "expected targets to be an integer tensor",
    function() return F.cross_entropy(ember.zeros(2, 5), ember.zeros(2)) end},
  {"cross_entropy with integer logits", "cross_entropy", "floating-point",
    function() return F.cross_entropy(ember.zeros(2, 5, {dtype = "i64"}), ember.zeros(2, {dtype = "i64"})) end},
  {"embedding with float ids", "embedding", "expected ids to be an integer tensor",
    function() return F.embedding(ember.tensor({0, 1}), ember.zeros(5, 3)) end},
  {"rope with float positions", "rope", "expected pos to be an integer tensor",
    function() return F.rope(ember.zeros(4, 6), ember.zeros(4)) end},
  {"where with a float condition", "where", "bool",
    function() return ember.where(ember.zeros(2), ember.zeros(2), ember.zeros(2)) end},
  {"masked_fill with a float mask", "masked_fill", "bool",
    function() return ember.zeros(2):masked_fill(ember.zeros(2), 1) end},
  {"attention with q f32 and k f64", "scaled_dot_product_attention", "same dtype",
    function()
      return F.scaled_dot_product_attention(ember.zeros(4, 8), ember.zeros(4, 8, {dtype = "f64"}), ember.zeros(4, 8))
    end},
  {"set_ on a non-leaf tensor", "set_", "only leaf tensors",
    function() return (ember.zeros(2, {requires_grad = true}) * 2):set_(ember.zeros(2)) end},
  {"set_ giving an integer dtype to a tensor that requires grad", "set_", "cannot take dtype i64",
    function() return ember.zeros(2, {requires_grad = true}):set_(ember.zeros(2, {dtype = "i64"})) end},
  {".grad of another dtype", "grad", "dtype f32, got f64",
    function() ember.zeros(2, {requires_grad = true}).grad = ember.zeros(2, {dtype = "f64"}) end},

  -- ---------------- devices ----------------
  {"creating a tensor on cuda without CUDA", "zeros", "no CUDA",
    function() return ember.zeros(2, {device = "cuda"}) end},
  {"moving a tensor to cuda without CUDA", "to", "no CUDA",
    function() return ember.zeros(2):to("cuda") end},
  {"t:cuda() without CUDA", {"cuda", "to"}, "no CUDA",
    function() return ember.zeros(2):cuda() end},
  {"ember.cuda.synchronize without CUDA", "cuda%.synchronize", "no CUDA device",
    function() return ember.cuda.synchronize() end},
  {"an unknown device name", "zeros", "got gpu",
    function() return ember.zeros(2, {device = "gpu"}) end},
  {"a malformed cuda device index", "ones", "cuda:x",
    function() return ember.ones(2, {device = "cuda:x"}) end},
  {"to() with an unknown device or dtype string", "to", "got \"gpu\"",
    function() return ember.zeros(2):to("gpu") end},

  -- ---------------- dims out of range ----------------
  {"sum over dim 5 of a 2-dim tensor", "sum", "dim 5 out of range",
    function() return z23():sum(5) end},
  {"transpose with a dim out of range", "transpose", "dim 2 out of range",
    function() return z23():transpose(0, 2) end},
  {"narrow past the end", "narrow", "start 2 + length 3 is out of range for dim 0 of size 2",
    function() return z23():narrow(0, 2, 3) end},
  {"narrow over a dim out of range", "narrow", "dim 3 out of range",
    function() return z23():narrow(3, 0, 1) end},
  {"select an index past the end", "select", "index 5 is out of range for dim 1 of size 3",
    function() return z23():select(1, 5) end},
  {"size of a dim out of range", "size", "dim 2 out of range",
    function() return z23():size(2) end},
  {"unsqueeze at a dim out of range", "unsqueeze", "dim 4 out of range",
    function() return z23():unsqueeze(4) end},
  {"softmax over a dim out of range", "softmax", "dim 2 out of range",
    function() return z23():softmax(2) end},
  {"max over a dim out of range", "max", "dim 3 out of range",
    function() return z23():max(3) end},
  {"logsumexp over a dim out of range", "logsumexp", "dim -3 out of range",
    function() return z23():logsumexp(-3) end},
  {"squeeze a dim out of range", "squeeze", "dim 3 out of range",
    function() return z23():squeeze(3) end},
  {"cat along a dim out of range", "cat", "dim 1 out of range",
    function() return ember.cat({ember.zeros(2), ember.zeros(2)}, 1) end},
  {"permute with too few dims", "permute", "expected 2 dims in the permutation, got 1",
    function() return z23():permute(0) end},
  {"permute with a repeated dim", "permute", "repeats",
    function() return z23():permute(0, 0) end},
  {"flatten with start after end", "flatten", "start_dim 1 must not come after end_dim 0",
    function() return z23():flatten(1, 0) end},
  {"triu of a 1-dim tensor", "triu", "at least 2 dims",
    function() return ember.zeros(3):triu() end},

  -- ---------------- argument types ----------------
  {"a string where a tensor is expected (operator)", "add", "got string",
    function() return ember.add("x", ember.zeros(2)) end},
  {"a string as matmul's other", "matmul", "got string",
    function() return z23():matmul("x") end},
  {"a string as F.linear's weight", {"linear", "nn%.functional%.linear"}, "got string",
    function() return F.linear(z23(), "w") end},
  {"a nil shape", "zeros", "got nil",
    function() return ember.zeros(nil) end},
  {"a shape table holding a string", "zeros", "got string at position 2",
    function() return ember.zeros({2, "a"}) end},
  {"a negative size", "zeros", "negative size -1",
    function() return ember.zeros(-1) end},
  {"data holding a string", "tensor", "got string",
    function() return ember.tensor({1, "x"}) end},
  {"ragged nested data", "tensor", "ragged",
    function() return ember.tensor({{1, 2}, {3}}) end},
  {"data nested deeper than 8 dims", "tensor", "more than 8 deep",
    function() return ember.tensor({{{{{{{{{1}}}}}}}}}) end},
  {"data that is a string", "tensor", "got string",
    function() return ember.tensor("abc") end},
  {"a fractional view size", "view", "got 2.5",
    function() return z23():view(2.5) end},
  {"a string as a dim", "transpose", "got string",
    function() return z23():transpose("a", 1) end},
  {"a fractional dim", "sum", "got 1.5",
    function() return z23():sum(1.5) end},
  {"a list of tensors holding a number", "cat", "element 2 is not a tensor",
    function() return ember.cat({ember.zeros(2), 5}, 0) end},
  {"a tensor where a list of tensors is expected", "cat", "table",
    function() return ember.cat(ember.zeros(2), 0) end},
  {"a string as clamp's bound", "clamp", "string",
    function() return ember.zeros(2):clamp("a") end},
  {"a string as fill_'s value", "fill_", "string",
    function() return ember.zeros(2):fill_("x") end},
  {"a string option where a number is expected", "var", "correction",
    function() return ember.zeros(3):var(0, {correction = "a"}) end},
  {"a number as a hook", "register_post_accumulate_grad_hook", "function",
    function() return ember.zeros(2, {requires_grad = true}):register_post_accumulate_grad_hook(3) end},
  {"a string as backward's gradient", "backward", "got string",
    function() (ember.zeros(1, {requires_grad = true}) * 2):backward("g") end},
  {"a string as .grad", "Tensor%.grad", "got string",
    function() ember.zeros(2, {requires_grad = true}).grad = "g" end},
  {"an unknown field", "Tensor", "no field or method 'foo'",
    function() return ember.zeros(2).foo end},
  {"setting a read-only field", "Tensor", "cannot set field 'shape'",
    function() ember.zeros(2).shape = {1} end},
  {"indexing with t[i] (use select)", "Tensor", "select",
    function() return ember.zeros(2)[1] end},
  {"a split size of 0", "split", "positive integer split size",
    function() return ember.zeros(4):split(0) end},
  {"a chunk count of 0", "chunk", "positive integer number of chunks",
    function() return ember.zeros(4):chunk(0) end},
  {"randint with low >= high", "randint", "low=5 high=2",
    function() return ember.randint(5, 2, {3}) end},
  {"arange with a zero step", "arange", "step must be nonzero",
    function() return ember.arange(0, 10, 0) end},
  {"eye with a negative size", "eye", "non-negative",
    function() return ember.eye(-1) end},
  {"clamp with min > max", "clamp", "min <= max",
    function() return ember.zeros(2):clamp(1, 0) end},

  {"narrow without start and length", "narrow", "got no value",
    function() return z23():narrow(0) end},
  {"linspace without steps", "linspace", "got no value",
    function() return ember.linspace(0, 1) end},
  {"full without a fill value", "full", "fill value",
    function() return ember.full({2}) end},
  {"sizes followed by a string", "zeros", "got string at argument 3",
    function() return ember.zeros(2, 3, "x") end},
  {"more than 8 dims", "zeros", "at most 8 dims",
    function() return ember.zeros(1, 1, 1, 1, 1, 1, 1, 1, 1) end},
  {"a string seed", "manual_seed", "got string",
    function() return ember.manual_seed("x") end},
  {"gradcheck of something that is not a function", "autograd%.gradcheck", "expected a function",
    function() return ember.autograd.gradcheck("f", {}) end},

  -- ---------------- bad options ----------------
  {"an unknown dtype", "zeros", "got f8",
    function() return ember.zeros(2, {dtype = "f8"}) end},
  {"an unknown dtype in to()", "to", "\"f8\"",
    function() return ember.zeros(2):to("f8") end},
  {"an unknown dtype for ember.tensor", "tensor", "got f8",
    function() return ember.tensor({1}, {dtype = "f8"}) end},
  {"an unknown attention impl", {"scaled_dot_product_attention", "nn%.functional%.scaled_dot_product_attention"},
    "bogus",
    function()
      return F.scaled_dot_product_attention(ember.zeros(2, 4), ember.zeros(2, 4), ember.zeros(2, 4), {impl = "bogus"})
    end},
  {"an unknown print option", "set_printoptions", "unknown option 'foo'",
    function() return ember.set_printoptions({foo = 1}) end},

  -- ---------------- misuse ----------------
  {"item() of a tensor with several elements", "item", "got shape [2, 2]",
    function() return ember.zeros(2, 2):item() end},
  {"item() of an empty tensor", "item", "[0]",
    function() return ember.zeros(0):item() end},
  {"#t of a 0-dim tensor", "len", "0-dim",
    function() return #ember.tensor(1) end},
  {"backward on a tensor that does not require grad", "backward", "does not require grad",
    function() ember.zeros(1):backward() end},
  {"backward of a non-scalar without a gradient", "backward", "only for tensors with one element",
    function() (ember.zeros(3, {requires_grad = true}) * 2):backward() end},
  {"a second backward without retain_graph", "backward", "retain_graph",
    function()
      local y = (ember.ones(2, {requires_grad = true}) * 3):sum()
      y:backward()
      y:backward()
    end},
  {"an in-place fill_ of a leaf that requires grad", "fill_", "requires grad",
    function() ember.zeros(2, {requires_grad = true}):fill_(1) end},
  {"an in-place add_ of a leaf that requires grad", {"add", "add_"}, "requires grad",
    function() ember.zeros(2, {requires_grad = true}):add_(1) end},
  {"copy_ from a source that requires grad", "copy_", "requires grad",
    function() ember.zeros(2):copy_(ember.zeros(2, {requires_grad = true})) end},
  {"requires_grad = false on a non-leaf", "requires_grad", "leaf",
    function() (ember.zeros(2, {requires_grad = true}) * 2).requires_grad = false end},
  {".grad of the wrong shape", "grad", "expected a gradient of shape [3], got [2]",
    function() ember.zeros(3, {requires_grad = true}).grad = ember.zeros(2) end},
  {"a hook on a tensor that does not require grad", "register_post_accumulate_grad_hook", "requires grad",
    function() ember.zeros(2):register_post_accumulate_grad_hook(function() end) end},

  -- ---------------- closed tensors ----------------
  {"a method on a tensor closed by <close>", "numel", "already closed",
    function()
      local keep
      do
        local t <close> = ember.zeros(2)
        keep = t
      end
      return keep:numel()
    end},
  {"an operator on a tensor closed by <close>", "add", "already closed",
    function()
      local keep
      do
        local t <close> = ember.zeros(2)
        keep = t
      end
      return keep + 1
    end},
  {"a closed tensor passed as an argument", "matmul", "already closed",
    function()
      local keep
      do
        local t <close> = ember.zeros(2, 2)
        keep = t
      end
      return ember.zeros(2, 2):matmul(keep)
    end},

  -- ---------------- memory ----------------
  {"a 4 TiB allocation", "out of memory", "bytes",
    function() return ember.empty(1 << 40) end},
}

-- File cases need temporary paths, so they build their call lazily.
local FILE_CASES = {
  {"ember.load of a missing file", "load", "No such file",
    function() return ember.load("/nonexistent-ember-dir/missing.safetensors") end},
  {"ember.load of random bytes", "load", "corrupt safetensors",
    function()
      ember.manual_seed(99)
      local bytes = {}
      for _, v in ipairs(ember.randint(0, 256, {64}):tolist()) do bytes[#bytes + 1] = string.char(v) end
      return ember.load(write_file(tmp(".safetensors"), table.concat(bytes)))
    end},
  {"ember.load of a file shorter than the 8-byte length", "load", "too short",
    function() return ember.load(write_file(tmp(".safetensors"), "abc")) end},
  {"ember.load of a header that runs past the end (truncated)", "load", "runs past the end of the file",
    function()
      local header = '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
      return ember.load(write_file(tmp(".safetensors"), string.pack("<I8", #header) .. header:sub(1, 20)))
    end},
  {"ember.load of a header claiming a huge length", "load", "exceeds the 100 MB",
    function() return ember.load(write_file(tmp(".safetensors"), string.pack("<I8", 1 << 40) .. "{}")) end},
  {"ember.load of a header that is not JSON", "load", "not valid JSON",
    function() return ember.load(write_file(tmp(".safetensors"), string.pack("<I8", 8) .. "{nope!!}")) end},
  {"ember.load of a tensor whose data is missing", "load", "data_offsets",
    function()
      local header = '{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}'
      return ember.load(write_file(tmp(".safetensors"), string.pack("<I8", #header) .. header .. "12345678"))
    end},
  {"ember.load of an unknown dtype", "load", "F8",
    function()
      local header = '{"a":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}}'
      return ember.load(write_file(tmp(".safetensors"), string.pack("<I8", #header) .. header .. "x"))
    end},
  {"ember.load_npy of a file that is not .npy", "load_npy", "magic",
    function() return ember.load_npy(write_file(tmp(".npy"), "this is not a numpy file at all")) end},
  {"ember.load_npy of a missing file", "load_npy", "No such file",
    function() return ember.load_npy("/nonexistent-ember-dir/x.npy") end},
  {"ember.save into a directory that does not exist", "save", "No such file",
    function() return ember.save("/nonexistent-ember-dir/x.safetensors", {a = ember.zeros(1)}) end},
  {"ember.save of a non-tensor value", "save", "string = number",
    function() return ember.save(tmp(), {a = 1}) end},
  {"ember.save of a tensor named __metadata__", "save", "reserved",
    function() return ember.save(tmp(), {__metadata__ = ember.zeros(1)}) end},
  {"ember.save_npy into a directory that does not exist", "save_npy", "No such file",
    function() return ember.save_npy("/nonexistent-ember-dir/x.npy", ember.zeros(1)) end},
  {"ember.save_npy of bf16 (NumPy has none)", "save_npy", "bf16",
    function() return ember.save_npy(tmp(".npy"), ember.zeros(1, {dtype = "bf16"})) end},
  {"writing into a memory-mapped .npy", "fill_", "read-only",
    function()
      local p = tmp(".npy")
      ember.save_npy(p, ember.zeros(4))
      return ember.load_npy(p, {mmap = true}):fill_(1)
    end},
}

describe("bad input", function()
  after_each(H.remove_temps)

  it("has at least 60 distinct cases", function()
    assert(#CASES + #FILE_CASES >= 60, "only " .. (#CASES + #FILE_CASES) .. " cases")
    local seen = {}
    for _, list in ipairs {CASES, FILE_CASES} do
      for _, c in ipairs(list) do
        assert.is_nil(seen[c[1]], "duplicate case: " .. c[1])
        seen[c[1]] = true
      end
    end
  end)

  for _, list in ipairs {CASES, FILE_CASES} do
    for _, c in ipairs(list) do
      local title, name, fragment, call = c[1], c[2], c[3], c[4]
      it(title, function() expect_error(name, fragment, call) end)
    end
  end

  it("leaves the process usable after all of the above", function()
    collectgarbage()
    assert.same({2, 4}, (ember.tensor({1, 2}) * 2):tolist())
    assert.is_true(ember.is_grad_enabled())
  end)
end)
