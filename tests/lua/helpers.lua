-- helpers.lua — what the specs of tests/lua and tests/gpu share, written once:
-- temporary files, reading and writing them, shell quoting, running the
-- `ember` executable as a user does, seeded inputs, and element-by-element
-- comparisons that name the element and the tolerance when they fail.
--
-- Not a spec (busted runs *_spec.lua only). A spec loads it beside itself:
--   local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
-- (from tests/gpu: .. "../lua/helpers.lua"). Each dofile is a fresh copy, so
-- a spec's temporary files are its own. Tensor helpers require "ember" when
-- first called, so specs of the executable alone (cli_spec) load it too.
local H = {}

H.BUILD = os.getenv("EMBER_BUILD") or "./build"
H.EMBER = H.BUILD .. "/ember"

local function ember() return require "ember" end

---------------------------------------------------------------------------
-- files and the shell
---------------------------------------------------------------------------

local temps = {}

--- A fresh temporary path ending in `suffix` (nothing created), removed by
-- H.remove_temps().
function H.temp(suffix)
  local p = os.tmpname()
  os.remove(p)
  p = p .. (suffix or "")
  temps[#temps + 1] = p
  return p
end

--- A fresh temporary directory, removed by H.remove_temps().
function H.tmpdir()
  local p = H.temp()
  assert(os.execute("mkdir -p " .. H.q(p)))
  return p
end

--- Remove every path H.temp gave out, newest first (directories recursively).
function H.remove_temps()
  for i = #temps, 1, -1 do
    local ok, _, errno = os.remove(temps[i])
    if not ok and errno ~= 2 then os.execute("rm -rf " .. H.q(temps[i])) end   -- 2: ENOENT
  end
  temps = {}
end

--- The bytes of a file, or nil when it cannot be opened.
function H.slurp(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

--- Write bytes to path (replacing it); returns path.
function H.spit(path, bytes)
  local f = assert(io.open(path, "wb"))
  f:write(bytes)
  f:close()
  return path
end

--- A fresh temporary file holding `text` (empty by default), removed by
-- H.remove_temps(): a script or input a spec hands to the executable.
function H.temp_file(text, suffix) return H.spit(H.temp(suffix), text or "") end

--- Whether `cmd` is on PATH (specs that need mpirun, python3... are pending without).
function H.have(cmd) return os.execute("command -v " .. cmd .. " >/dev/null 2>&1") == true end

--- The lines of `text` that match a Lua pattern, in order.
function H.lines_matching(text, pattern)
  local found = {}
  for line in text:gmatch("[^\n]*") do
    if line:find(pattern) then found[#found + 1] = line end
  end
  return found
end

--- s quoted for the shell.
function H.q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

--- Run a shell command: its output (stdout and stderr) and whether it succeeded.
function H.sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  local ok = p:close()
  return out, ok
end

--- Run `ember ARGS...` through the shell as a user does (LUA_INIT unset):
-- stdout, stderr, the exit status and the whole seconds it took. opts:
-- `stdin` (text; /dev/null otherwise), `unset` {NAME...} (more variables
-- removed, e.g. EMBER_RANK so a spec run under a launch starts no rank),
-- `env` {NAME = value}, `wrap` (words before the executable, e.g. "timeout
-- 60"), `before` (shell text run first in the same shell, e.g. a ulimit), `cwd`.
function H.ember(args, opts)
  opts = opts or {}
  local parts = {"env -u LUA_INIT -u LUA_INIT_5_4"}
  for _, name in ipairs(opts.unset or {}) do parts[#parts + 1] = "-u " .. name end
  for name, value in pairs(opts.env or {}) do parts[#parts + 1] = name .. "=" .. H.q(value) end
  if opts.wrap then parts[#parts + 1] = opts.wrap end
  parts[#parts + 1] = H.q(H.EMBER)
  for _, a in ipairs(args) do parts[#parts + 1] = H.q(a) end
  local out, err = H.temp(), H.temp()
  local input = opts.stdin and H.spit(H.temp(), opts.stdin) or "/dev/null"
  local cmd = table.concat(parts, " ") .. " <" .. H.q(input) .. " >" .. H.q(out) .. " 2>" .. H.q(err)
  if opts.before then cmd = "(" .. opts.before .. "; " .. cmd .. ")" end
  if opts.cwd then cmd = "cd " .. H.q(opts.cwd) .. " && " .. cmd end
  local t0 = os.time()
  local _, _, status = os.execute(cmd)
  local seconds = os.time() - t0
  local o, e = H.slurp(out), H.slurp(err)
  os.remove(out)
  os.remove(err)
  if opts.stdin then os.remove(input) end
  return o, e, status, seconds
end
--- A script (a temp file) printing digests of a tiny TransformerLM's three AdamW steps in f32 and under bf16 and
-- f16 autocast: every gradient and loss, the final weights, and a cached (KV) step's logits in f32 and (with
-- autocast) under it, as hex floats: what a switch that must not change results is compared on (switch_agrees).
-- attn_impl (optional): the model's attention ("flash": the CPU's tiled flash).
function H.tiny_model_digests_script(attn_impl)
  local script = H.temp(".lua")
  local impl = attn_impl and (", attn_impl = %q"):format(attn_impl) or ""
  H.spit(script, ([[
    local e = require 'ember'
    local nn, F = e.nn, e.nn.functional
    local out = {}
    local function digest(t) out[#out + 1] = ('%%a'):format(t:double():abs():sum():item()) end
    for _, amp in ipairs({false, "bf16", "f16"}) do
      e.manual_seed(7)
      local m = nn.TransformerLM(nn.configs.tiny{vocab_size = 37, context_length = 12%s})
      local opt = e.optim.AdamW(m:parameters(), {lr = 1e-2})
      local data = e.randint(0, 37, {2, 13})
      local x, y = data:narrow(1, 0, 12):contiguous(), data:narrow(1, 1, 12):contiguous()
      for _ = 1, 3 do
        opt:zero_grad()
        local loss = amp and e.autocast(amp, function() return F.cross_entropy(m(x), y) end)
                     or F.cross_entropy(m(x), y)
        loss:backward()
        for _, p in ipairs(m:parameters()) do digest(p.grad) end
        opt:step()
        out[#out + 1] = ('%%a'):format(loss:item())
      end
      local sum = 0
      for _, p in ipairs(m:parameters()) do sum = sum + p:double():abs():sum():item() end
      out[#out + 1] = ('%%a'):format(sum)
      local x5 = x:narrow(1, 0, 5):contiguous()
      digest(m(x5, {cache = nn.KVCache(m, {batch = 2, max_len = 12})}))
      if amp then
        local kv = nn.KVCache(m, {batch = 2, max_len = 12})
        digest(e.autocast(amp, function() return m(x5, {cache = kv}) end))
      end
    end
    io.write(table.concat(out, ';'))]]):format(impl))
  return script
end


--- The hooks of the ember.memory specs (tests/lua and tests/gpu), given
-- busted's before_each and after_each: every case starts with the history
-- off and empty (after a full collection) and ends with it off and empty and
-- its temporary files removed.
-- An A/B switch between two code paths that must give the same bits: run the script (a path) once per value
-- of the environment variable var, with EMBER_NUM_THREADS = threads; every run must leave stderr empty and
-- print the same text, longer than min_len bytes.
function H.switch_agrees(script, var, modes, threads, min_len)
  local first
  for _, mode in ipairs(modes) do
    local out, err = H.ember({"run", script}, {env = {[var] = mode, EMBER_NUM_THREADS = threads}})
    if (err or "") ~= "" then error(("%s=%s: expected no stderr, got %s"):format(var, mode, err), 2) end
    if not first then
      if #out <= min_len then
        error(("%s=%s: expected more than %d bytes of output, got %q"):format(var, mode, min_len, out), 2)
      end
      first = out
    elseif out ~= first then
      error(("%s=%s printed other values than %s=%s"):format(var, mode, var, modes[1]), 2)
    end
  end
end

-- A value the switch var does not take is reported on stderr with msg (plain text).
function H.switch_refuses(script, var, bad, msg)
  local _, err = H.ember({"run", script}, {env = {[var] = bad}})
  if not (err or ""):find(msg, 1, true) then
    error(("%s=%s: expected stderr to say %q, got %q"):format(var, bad, msg, err or ""), 2)
  end
end

function H.fresh_memory_history(before_each, after_each)
  local memory = ember().memory
  before_each(function()
    collectgarbage()
    memory.record_history(false)
    memory.clear_history()
  end)
  after_each(function()
    memory.record_history(false)
    memory.clear_history()
    H.remove_temps()
  end)
end

--- The message of an error without its "file:line: " prefix.
function H.strip_where(msg) return (tostring(msg):gsub("^[^%s]+:%d+: ", "", 1)) end

--- Events of a trace (a list of tables) that match every field of `want`.
function H.find(trace, want)
  local out = {}
  for _, e in ipairs(trace) do
    local ok = true
    for k, v in pairs(want) do if e[k] ~= v then ok = false break end end
    if ok then out[#out + 1] = e end
  end
  return out
end

---------------------------------------------------------------------------
-- numbers and tensors
---------------------------------------------------------------------------

--- A tensor's values as a flat Lua list.
function H.flat(t) return t:reshape(-1):tolist() end

--- x rounded to the nearest f32 (an IEEE cast through string.pack).
function H.f32(x) return (string.unpack("<f", string.pack("<f", x))) end

function H.isnan(x) return x ~= x end

--- Seeded standard normal values, drawn in f64, times `scale` (default 1),
-- then converted to dtype (default f64): the same values in every dtype.
function H.randn(seed, shape, dtype, scale)
  local e = ember()
  e.manual_seed(seed)
  local t = e.randn(shape, {dtype = "f64"})
  if scale then t = t * scale end
  return t:to(dtype or "f64")
end

--- A stream of fresh seeded inputs (the GPU specs draw new ones per case):
-- R.randn(shape, dtype, scale) and R.randint(n, shape, dtype) in [0, n) seed
-- the generator with first+1, first+2, ... in turn, so one spec's cases
-- never share inputs. Defaults: dtype f32 (randint i64), scale `scale` or 1.
function H.seeded(first, scale)
  local seed, R = first, {}
  function R.randn(shape, dtype, s)
    seed = seed + 1
    return H.randn(seed, shape, dtype or "f32", s or scale)
  end
  function R.randint(n, shape, dtype)
    seed = seed + 1
    local e = ember()
    e.manual_seed(seed)
    return e.randint(0, n, shape):to(dtype or "i64")
  end
  return R
end

--- {f(list[1]), f(list[2]), ...}
function H.map(list, f)
  local out = {}
  for i, x in ipairs(list) do out[i] = f(x) end
  return out
end

--- Largest |a - b| over the elements, compared in f32.
function H.maxdiff(a, b)
  return (a:float() - b:float()):abs():max():item()
end

--- The tensor's data bytes as ember.save writes them (contiguous, on the CPU).
function H.raw_bytes(t)
  t = t:detach():cpu():contiguous()
  local path = os.tmpname()
  ember().save(path, {x = t})
  local s = H.slurp(path)
  os.remove(path)
  local n = string.unpack("<I8", s)
  return s:sub(9 + n)
end

local BITS_WIDTH = {f32 = 4, bf16 = 2, f16 = 2}
local BITS_NAME = {f32 = "F32", bf16 = "BF16", f16 = "F16"}

--- The element bit patterns of an f32/bf16/f16 tensor, in logical order.
function H.bits(t)
  local w = assert(BITS_WIDTH[t.dtype], "H.bits: f32, bf16 or f16, got " .. tostring(t.dtype))
  local s, fmt, out = H.raw_bytes(t), "<I" .. w, {}
  for i = 1, #s // w do out[i] = string.unpack(fmt, s, w * (i - 1) + 1) end
  return out
end

--- An f32/bf16/f16 tensor of the given shape holding exactly the bit patterns
-- `pat` (a safetensors file written here and loaded: no conversion touches them).
function H.from_bits(dtype, shape, pat)
  local w = assert(BITS_WIDTH[dtype], "H.from_bits: f32, bf16 or f16, got " .. tostring(dtype))
  local parts = {}
  for i, b in ipairs(pat) do parts[i] = string.pack("<I" .. w, b) end
  local data = table.concat(parts)
  local dims = {}
  for i, d in ipairs(shape) do dims[i] = tostring(d) end
  local header = ('{"x":{"dtype":"%s","shape":[%s],"data_offsets":[0,%d]}}'):format(
    BITS_NAME[dtype], table.concat(dims, ","), #data)
  header = header .. string.rep(" ", (8 - #header % 8) % 8)
  local path = H.temp(".safetensors")
  H.spit(path, string.pack("<I8", #header) .. header .. data)
  local t = ember().load(path).x
  os.remove(path)
  return t
end

--- got and ref, Lua lists (nested for tensors of more dims), agree element by
-- element within atol + rtol·|ref|; NaN matches NaN and an infinity only
-- itself. A failure names the element, both values and the tolerances.
function H.assert_close(got, ref, rtol, atol, what)
  rtol, atol = rtol or 0, atol or 0
  local function walk(g, r, path)            -- nil, or what is wrong
    if type(r) == "table" then
      if type(g) ~= "table" or #g ~= #r then
        return string.format("%s: expected %d elements, got %s", path, #r,
          type(g) == "table" and tostring(#g) or type(g))
      end
      for i = 1, #r do
        local bad = walk(g[i], r[i], path .. "[" .. i .. "]")
        if bad then return bad end
      end
      return nil
    end
    local ok
    if r ~= r then ok = g ~= g
    elseif r == math.huge or r == -math.huge then ok = g == r
    else ok = type(g) == "number" and math.abs(g - r) <= atol + rtol * math.abs(r) end
    if not ok then
      return string.format("element %s: got %s, expected %.17g (rtol %g, atol %g)", path,
        type(g) == "number" and string.format("%.17g", g) or tostring(g), r, rtol, atol)
    end
  end
  local bad = walk(got, ref, "")
  if bad then error((what or "values") .. ": " .. bad, 2) end
end

--- H.assert_close with an absolute tolerance only (values of a known O(1)
-- scale: rotations, softmax averages).
function H.assert_abs(got, ref, atol, what) return H.assert_close(got, ref, 0, atol, what) end

--- erf(x) to double precision (Lua has none): 2/√π · e^(−x²) · Σ_n 2^n
-- x^(2n+1) / (1·3·5···(2n+1)); every term is positive, so no cancellation;
-- converges for every x (≈ x² + 40 terms); ±1 beyond |x| = 6.
function H.erf(x)
  if x < 0 then return -H.erf(-x) end
  if x == 0 then return 0.0 end
  if x > 6 then return 1.0 end
  local term, sum, n = x, x, 0
  repeat
    n = n + 1
    term = term * 2 * x * x / (2 * n + 1)
    sum = sum + term
  until term < 1e-17 * sum
  return 2 / math.sqrt(math.pi) * math.exp(-x * x) * sum
end

--- One rmsnorm / add_rmsnorm with an out dtype od, and its gradients: new, the
-- op's {out_dtype = od}; else the composition (the norm, or the add and the
-- norm, then :to(od)). x, r (add_rmsnorm only), w (or nil) become fresh
-- leaves; consumer "root": y:backward(gy); else one consumer, (y * gy):sum()
-- in f32 (+ (s * gs):sum() for add_rmsnorm). Returns {y, s, gx, gr, gw}.
-- Shared by tests/lua/norm_spec.lua and tests/gpu/norm_spec.lua.
function H.norm_out_grads(new, op, od, x, r, w, gs, gy, consumer)
  local F = ember().nn.functional
  local function leaf(t) local c = t:detach():clone(); c.requires_grad = true; return c end
  local xl, rl, wl = leaf(x), r and leaf(r), w and leaf(w)
  local s, y
  if op == "rmsnorm" then
    if new then y = F.rmsnorm(xl, wl, 1e-5, {out_dtype = od}) else y = F.rmsnorm(xl, wl, 1e-5):to(od) end
  else
    if new then s, y = F.add_rmsnorm(xl, rl, wl, 1e-5, {out_dtype = od})
    else s = xl + rl; y = F.rmsnorm(s, wl, 1e-5):to(od) end
  end
  if consumer == "root" then
    y:backward(gy)
  else                                     -- one consumer: a product with a tensor in od
    local loss = (y * gy):sum():float()
    if s then loss = loss + (s * gs):sum() end
    loss:backward()
  end
  return {y = y, s = s, gx = xl.grad, gr = rl and rl.grad, gw = wl and wl.grad}
end

return H
