--- Attention benchmark of CS336 A2 §1.2.1 (pytorch_attention) and §1.3.1
-- (torch_compile): single-head attention on (batch, seq, d) inputs — no head
-- dimension, as the assignment asks — over a grid of head sizes d and sequence
-- lengths, timing `--passes` forward passes, then `--passes` backward passes,
-- with the device synchronised after each, and recording memory in use
-- right before the backward. Out of memory is a result ("OOM"), not a crash.
--
--   ember run scripts/bench_attention.lua                       # the full grid, naive/graph/flash
--   ember run scripts/bench_attention.lua --impl naive,flash --dtype bf16 --causal --json attn.jsonl
--   ember run scripts/bench_attention.lua --impl flash --heads 16 --batch 1 --d 64,128 --seq 4096,16384 \
--     --dtype bf16 --causal --flush-l2 --passes 20 --torch    # issue 11's grid, PyTorch SDPA beside, TF/s
--   ember run scripts/bench_attention.lua --device cpu --d 16 --seq 64,128 --passes 5   # CPU, naive only
--   ember run scripts/bench_attention.lua --device cpu --impl naive,flash --d 64 --seq 256,1024 --passes 5
--     (CPU: naive against the tiled flash path)
--   ember run scripts/bench_attention.lua --impl flash --heads 32 --kv-heads 8 --tq 1 --seq 4096,65536 \
--     --batch 4 --d 128 --dtype bf16 --causal --align bottom_right --fwd-only        # decode (flash_decode.cu)
--   (ulimit -v 900000; OPENBLAS_NUM_THREADS=1 ember run scripts/bench_attention.lua --device cpu \
--     --d 16 --seq 64,4096)     # the OOM path on a CPU: the 512 MiB score matrix does not fit
--   (OpenBLAS spins when its own buffer cannot be mapped: leave it room, one thread)
--
-- Implementations (--impl):
--   naive  F.scaled_dot_product_attention{impl = "naive"}: the composition
--          softmax(Q Kᵀ / √d + mask) V, which materialises B·T² scores.
--   graph  the same naive forward captured once with ember.cuda.graph and
--          replayed, and its backward captured as a second graph: Ember's
--          analogue of torch.compile (no host dispatch; the same kernels,
--          no fusion). CUDA only.
--   flash  F.scaled_dot_product_attention{impl = "flash"}: Ember's
--          FlashAttention (no T² tensor; saves O and the log-sum-exp), d in
--          {16, 32, 64, 80, 96, 128, 256}. CUDA: the FlashAttention-2 kernels,
--          or the split-key decode kernels when Tq <= 16 (--tq), in bf16/f16,
--          or f32 on the TF32 tensor cores (--dtype f32; the decode kernel in
--          exact f32). CPU: the tiled path (engine/ops/flash_cpu.c) in the
--          input dtype.
--
-- Shapes: (B, T, d) for q, k and v by default (one head, the course's
-- shape); --heads H [--kv-heads Hkv] makes them (B, H, T, d) and (B, Hkv, T,
-- d) (grouped-query attention when Hkv < H); --tq N gives q N rows against
-- the seq rows of k and v (N <= 16 is the decode case); --causal masks,
-- aligned top-left (PyTorch's is_causal) or, with --align bottom_right, to
-- the end of the keys (what a KV cache needs); --fwd-only skips the backward
-- (generation has none).
--
-- One cell (impl, d, seq): Q, K, V random (B, T, d) leaves with
-- requires_grad; `--warmup` + `--passes` forwards (each one records the
-- autograd graph, as in PyTorch); then one more forward whose graph the
-- backward uses, after which
--   mem_before_bwd = ember.cuda.memory_allocated()      (what the seed asks for)
--   peak_fwd       = ember.cuda.max_memory_allocated()  (peak of that forward)
-- then `--warmup` + `--passes` backwards of that output with a fixed random
-- upstream gradient (retain_graph; the inputs' .grad dropped before each, so
-- every pass allocates its gradients as a first backward does), and
--   peak           = max_memory_allocated() over forward + backwards.
-- Times are the mean per pass (ms) of ember.bench samples.
--
-- TF/s (printed in the speed table, recorded as fwd_tflops / bwd_tflops):
-- FlashAttention's count, 4·B·H·d FLOPs per visible (query, key) pair for
-- the forward (two matmuls) and 2.5 times that for the backward (five); the
-- visible pairs are Tq·Tk, or those the causal mask keeps (T(T+1)/2 when Tq
-- = Tk), so a causal cell is not credited with the work it skips. --torch
-- runs scripts/torch/bench_attention.py with the same grid and protocol
-- (CUDA events, the same L2 flush) and prints PyTorch's figures beside ours.
--
-- Memory accounting of naive attention (per cell, elt = bytes per element):
--   one score matrix   S = B·T²·elt            (printed per seq below the table)
--   forward transient  Q Kᵀ, ·1/√d, masked, softmax: up to 2 S alive at once
--   saved for backward P = softmax(...) (1 S) + Q, K, V, O (4·B·T·d·elt)
--   backward           dP and dS (2 S more) while P is alive
-- so naive attention needs about 3 S at the backward's peak, which is what
-- runs out of memory first as seq grows; flash keeps none of it.
local ember = require "ember"
local argparse = require "argparse"
local F = ember.nn.functional

local script_dir = (arg and arg[0] or ""):match("^(.*/)") or "./"
local S = dofile(script_dir .. "lib/study.lua")

local parser = argparse("bench_attention.lua",
  "Time single-head attention forward and backward over a (d, seq) grid: naive, CUDA graph, flash.")
parser:option("--impl", "Comma list of naive, graph, flash (default: all that apply on the device).")
parser:option("--d", "Comma list of head sizes d.", "16,32,64,128")
parser:option("--seq", "Comma list of sequence lengths.", "256,1024,4096,8192,16384")
parser:option("--batch", "Batch size.", "8"):convert(math.tointeger)
parser:option("--heads", "Query heads: (B, H, T, d) inputs instead of (B, T, d).", nil, math.tointeger)
parser:option("--kv-heads", "Key/value heads (grouped-query attention; needs --heads, divides it).", nil,
  math.tointeger)
parser:option("--tq", "Query rows (default: seq); k and v keep seq rows. <= 16 is decoding.", nil, math.tointeger)
parser:option("--align", "Causal alignment with --causal: top_left (is_causal) or bottom_right (end of the keys).",
  "top_left"):choices({"top_left", "bottom_right"})
parser:flag("--fwd-only", "Time the forward only (no backward passes).")
parser:option("--passes", "Timed forward passes, then as many backward passes.", "100"):convert(math.tointeger)
parser:option("--warmup", "Untimed passes before each timed series.", "5"):convert(math.tointeger)
parser:option("--dtype", "Input dtype (flash in f32 runs on the TF32 tensor cores on CUDA).", "f32")
  :choices({"f32", "bf16", "f16"})
parser:flag("--causal", "Causal mask (query i sees keys j <= i).")
parser:flag("--tf32", "Allow TF32 for f32 matmuls (ember.backends.tf32).")
parser:flag("--flush-l2", "Overwrite a buffer bigger than L2 before every timed pass (ember.bench flush_l2).")
parser:option("--device", "cpu or cuda[:N] (default: cuda when available).")
parser:option("--seed", "Seed for the inputs.", "0"):convert(math.tointeger)
parser:flag("--torch", "Also time PyTorch's F.scaled_dot_product_attention on the same grid " ..
  "(python3 scripts/torch/bench_attention.py) and print TF/s side by side.")
parser:option("--torch-backend", "SDPA backend for --torch: default (PyTorch's choice: cuDNN on an H100), " ..
  "flash, cudnn, efficient or math.", "default"):choices({"default", "flash", "cudnn", "efficient", "math"})
parser:option("--json", "Append one JSON line per cell to this file.")
parser:option("--markdown", "Write the final Markdown table to this file.")
local args = parser:parse(arg)
args.causal, args.tf32, args.flush_l2 = args.causal or false, args.tf32 or false, args.flush_l2 or false
args.fwd_only = args.fwd_only or false
args.torch = args.torch or false

local function fail(msg) io.stderr:write("bench_attention.lua: ", msg, "\n") os.exit(2) end

S.check_counts(args, {"batch", "passes", "seed"}, fail)
for _, k in ipairs({"heads", "kv_heads", "tq"}) do
  if args[k] ~= nil and args[k] < 1 then fail("--" .. k:gsub("_", "-") .. " must be a positive integer") end
end
if args.kv_heads and not args.heads then fail("--kv-heads needs --heads") end
if args.kv_heads and args.heads % args.kv_heads ~= 0 then
  fail(("--kv-heads %d must divide --heads %d"):format(args.kv_heads, args.heads))
end
if args.align == "bottom_right" and not args.causal then fail("--align bottom_right needs --causal") end
local D_LIST, SEQ_LIST = S.int_list("d", args.d, fail), S.int_list("seq", args.seq, fail)

local on_cuda = S.resolve_device(args, fail)

local KNOWN = {naive = true, graph = true, flash = true}
local IMPLS = {}
if args.impl then
  for name in (args.impl .. ","):gmatch("([^,]*),") do
    if not KNOWN[name] then fail("--impl expects a comma list of naive, graph, flash; got '" .. args.impl .. "'") end
    IMPLS[#IMPLS + 1] = name
  end
  for _, name in ipairs(IMPLS) do
    if name == "graph" and not on_cuda then fail("--impl graph needs --device cuda") end
  end
else
  IMPLS = on_cuda and {"naive", "graph", "flash"} or {"naive"}
end

-- every implementation computes in the input dtype (flash in f32 on CUDA: TF32 tensor cores)
local function impl_dtype(impl)
  return args.dtype
end
local function impl_label(impl)
  return impl_dtype(impl) ~= args.dtype and ("%s (%s)"):format(impl, impl_dtype(impl)) or impl
end

-- ---------------------------------------------------------------------------
-- header

local runinfo = require "ember.runinfo"
local facts = runinfo.collect(args.device)
local B = args.batch
local config = {
  impl = IMPLS, d = D_LIST, seq = SEQ_LIST, batch = B, passes = args.passes, warmup = args.warmup,
  dtype = args.dtype, causal = args.causal, tf32 = args.tf32, flush_l2 = args.flush_l2,
  device = args.device, seed = args.seed, heads = args.heads, kv_heads = args.kv_heads, tq = args.tq,
  align = args.align, fwd_only = args.fwd_only,
}
S.print_header(facts)
local impl_names = {}
for i, impl in ipairs(IMPLS) do impl_names[i] = impl_label(impl) end
print(("config: impl=%s d=%s seq=%s batch=%d dtype=%s%s causal=%s passes=%d warmup=%d flush_l2=%s device=%s " ..
  "heads=%s kv_heads=%s tq=%s align=%s fwd_only=%s")
  :format(table.concat(impl_names, ","), args.d, args.seq, B, args.dtype, args.tf32 and "+tf32" or "",
    tostring(args.causal), args.passes, args.warmup, tostring(args.flush_l2), args.device,
    tostring(args.heads or 1), tostring(args.kv_heads or args.heads or 1), tostring(args.tq or "seq"),
    args.causal and args.align or "-", tostring(args.fwd_only)))

-- ---------------------------------------------------------------------------
-- one cell

local function sync() if on_cuda then ember.cuda.synchronize() end end
local function allocated() return on_cuda and ember.cuda.memory_allocated() or nil end
local function peak() return on_cuda and ember.cuda.max_memory_allocated() or nil end
local function reset_peak() if on_cuda then ember.cuda.reset_peak_memory_stats() end end

local function free_all() S.free_all(on_cuda) end   -- after a cell, also after an OOM

local ELT = {f32 = 4, bf16 = 2, f16 = 2}

-- q's and k's (v's) shapes of a cell
local function shapes(d, T)
  local tq = args.tq or T
  if args.heads then return {B, args.heads, tq, d}, {B, args.kv_heads or args.heads, T, d} end
  return {B, tq, d}, {B, T, d}
end

--- Measure one (impl, d, T) cell; returns the fields of its row (raises on OOM).
local function measure(impl, d, T)
  local dtype = impl_dtype(impl)
  if impl == "flash" then   -- a one-row call says whether flash takes this d and dtype here
    local probe = ember.zeros({1, 1, 1, d}, {dtype = dtype, device = args.device})
    local ok, err = pcall(function() ember.no_grad(function() F.flash_attention(probe, probe, probe) end) end)
    if not ok then return {status = "unsupported", note = tostring(err):gsub("^[^%s]+:%d+: ", "")} end
  end
  reset_peak()
  ember.manual_seed(args.seed)
  local o = {dtype = dtype, device = args.device, requires_grad = not args.fwd_only}
  local qs, ks = shapes(d, T)
  local q, k, v = ember.randn(qs, o), ember.randn(ks, o), ember.randn(ks, o)
  local sdpa = {impl = impl == "flash" and "flash" or "naive", causal = args.causal and args.align,
    enable_gqa = true}
  local function attend() return F.scaled_dot_product_attention(q, k, v, sdpa) end
  local gout = ember.randn(qs, {dtype = dtype, device = args.device})
  local out
  local function drop_out() out = nil collectgarbage() end
  local function drop_grads() q.grad, k.grad, v.grad = nil, nil, nil end
  local bopts = {warmup = args.warmup, reps = args.passes, device = args.device, flush_l2 = args.flush_l2}

  local fwd_fn, bwd_fn, graphs
  if impl == "graph" then
    -- eager passes first (workspaces, the mask), then one capture of each direction
    for _ = 1, math.max(args.warmup, 1) do
      drop_out()
      out = attend()
      drop_grads()
      if not args.fwd_only then out:backward(gout, {retain_graph = true}) end
    end
    drop_out()
    drop_grads()
    sync()
    local gf, o1 = ember.cuda.graph(function() return attend() end, {warmup = 0})
    out = o1
    graphs = {gf}
    fwd_fn = function() gf:replay() end
    if not args.fwd_only then
      local gb = ember.cuda.graph(function() out:backward(gout, {retain_graph = true}) end, {warmup = 0})
      graphs[2] = gb
      bwd_fn = function() gb:replay() end
    end
  else
    fwd_fn = function() out = attend() end
    bwd_fn = function() out:backward(gout, {retain_graph = true}) end
  end

  -- forward passes (eager: the previous output and its graph are freed first, untimed)
  local fwd = ember.bench(fwd_fn, {warmup = bopts.warmup, reps = bopts.reps, device = bopts.device,
    flush_l2 = bopts.flush_l2, setup = impl ~= "graph" and drop_out or nil})
  if args.fwd_only then
    if graphs then for _, g in ipairs(graphs) do g:close() end end
    return {status = "ok", fwd = fwd, peak = peak()}
  end
  -- the forward the backward passes use, and the memory right before them
  if impl ~= "graph" then drop_out() end
  collectgarbage()
  sync()
  reset_peak()
  fwd_fn()
  sync()
  local mem_before_bwd, peak_fwd = allocated(), peak()
  local bwd = ember.bench(bwd_fn, {warmup = bopts.warmup, reps = bopts.reps, device = bopts.device,
    flush_l2 = bopts.flush_l2, setup = impl ~= "graph" and drop_grads or nil})
  sync()
  local peak_all = peak()
  if graphs then for _, g in ipairs(graphs) do g:close() end end
  return {status = "ok", fwd = fwd, bwd = bwd, mem_before_bwd = mem_before_bwd, peak_fwd = peak_fwd,
    peak = peak_all}
end

-- ---------------------------------------------------------------------------
-- FLOPs (FlashAttention's count, causal pairs counted exactly)

local function visible_pairs(T)
  local tq = args.tq or T
  if not args.causal then return tq * T end
  local off = args.align == "bottom_right" and (T - tq) or 0   -- row i sees keys j <= i + off
  local n = 0
  for i = 0, tq - 1 do n = n + math.max(0, math.min(T, i + off + 1)) end
  return n
end
local function fwd_flops(d, T) return 4 * B * (args.heads or 1) * d * visible_pairs(T) end

-- ---------------------------------------------------------------------------
-- the grid

local MiB = 2 ^ 20
local function mib(b) return b and ("%.1f"):format(b / MiB) or "n/a" end
local function ms(s) return ("%.3f"):format(s * 1e3) end

local cjson = args.json and require "cjson" or nil
-- every JSON line has these keys; null where a cell has no value (OOM, CPU memory)
local NULLABLE = {"fwd_ms", "fwd_std_ms", "fwd_median_ms", "bwd_ms", "bwd_std_ms", "bwd_median_ms",
  "fwd_tflops", "bwd_tflops",
  "mem_before_bwd_bytes", "peak_fwd_bytes", "peak_bytes", "clock_mhz_before", "clock_mhz_after",
  "error", "note", "driver", "align"}
local json_file = S.open_json(args.json, fail)

if args.tf32 then ember.backends.tf32(true) end
local cells, any_error = {}, false
for _, d in ipairs(D_LIST) do
  for _, T in ipairs(SEQ_LIST) do
    for _, impl in ipairs(IMPLS) do
      local ok, r = pcall(measure, impl, d, T)
      free_all()
      if not ok then
        local msg = tostring(r)
        r = {status = S.failure_status(msg), error = msg}
        any_error = any_error or r.status == "error"
      end
      r.impl, r.d, r.seq, r.dtype = impl, d, T, impl_dtype(impl)
      cells[#cells + 1] = r
      local head = ("%-14s d=%-4d seq=%-6d"):format(impl_label(impl), d, T)
      if r.status == "ok" and not r.bwd then
        print(("%s fwd %9.3f ± %.3f ms   %s"):format(head, r.fwd.mean * 1e3, r.fwd.std * 1e3,
          r.peak and ("peak %s MiB"):format(mib(r.peak)) or "memory n/a on the CPU"))
      elseif r.status == "ok" then
        print(("%s fwd %9.3f ± %.3f ms   bwd %9.3f ± %.3f ms   %s")
          :format(head, r.fwd.mean * 1e3, r.fwd.std * 1e3, r.bwd.mean * 1e3, r.bwd.std * 1e3,
            r.mem_before_bwd and ("mem before bwd %s MiB, peak %s MiB"):format(mib(r.mem_before_bwd), mib(r.peak))
              or "memory n/a on the CPU"))
      elseif r.status == "unsupported" then
        print(("%s unsupported (%s)"):format(head, r.note))
      else
        print(("%s %s (%s)"):format(head, r.status, (r.error:gsub("\n.*", ""))))
      end
      if json_file then
        local line = {
          impl = impl, d = d, seq = T, batch = B, dtype = r.dtype, causal = args.causal, tf32 = args.tf32,
          heads = args.heads or 1, kv_heads = args.kv_heads or args.heads or 1, tq = args.tq or T,
          align = args.causal and args.align or nil, fwd_only = args.fwd_only,
          status = r.status, error = r.error, note = r.note, passes = args.passes, warmup = args.warmup,
          fwd_ms = r.fwd and r.fwd.mean * 1e3, fwd_std_ms = r.fwd and r.fwd.std * 1e3,
          fwd_median_ms = r.fwd and r.fwd.median * 1e3,
          bwd_ms = r.bwd and r.bwd.mean * 1e3, bwd_std_ms = r.bwd and r.bwd.std * 1e3,
          bwd_median_ms = r.bwd and r.bwd.median * 1e3,
          mem_before_bwd_bytes = r.mem_before_bwd, peak_fwd_bytes = r.peak_fwd, peak_bytes = r.peak,
          score_bytes = B * (args.heads or 1) * (args.tq or T) * T * ELT[r.dtype],
          fwd_tflops = r.fwd and fwd_flops(d, T) / r.fwd.mean / 1e12,
          bwd_tflops = r.bwd and 2.5 * fwd_flops(d, T) / r.bwd.mean / 1e12,
          clock_mhz_before = r.fwd and r.fwd.clock_mhz_before, clock_mhz_after = r.bwd and r.bwd.clock_mhz_after,
          tool = "ember", commit = facts.commit, device = facts.device, driver = facts.driver,
          date = os.date("!%Y-%m-%dT%H:%M:%SZ"), flush_l2 = args.flush_l2,
          command = "ember run scripts/bench_attention.lua " .. table.concat(arg, " "),
        }
        for _, key in ipairs(NULLABLE) do
          if line[key] == nil then line[key] = cjson.null end
        end
        json_file:write(cjson.encode(line), "\n")
        json_file:flush()
      end
    end
  end
end
if json_file then json_file:close() end

-- ---------------------------------------------------------------------------
-- the table: rows d × seq, three columns per implementation

local md_table = require("ember.report").text_table

local headers = {"d", "seq"}
for _, impl in ipairs(IMPLS) do
  local l = impl_label(impl)
  headers[#headers + 1] = l .. " fwd ms"
  headers[#headers + 1] = l .. " bwd ms"
  headers[#headers + 1] = l .. " mem MiB"
end
local rows, by_key = {}, {}
for _, c in ipairs(cells) do by_key[c.impl .. "/" .. c.d .. "/" .. c.seq] = c end
for _, d in ipairs(D_LIST) do
  for _, T in ipairs(SEQ_LIST) do
    local row = {tostring(d), tostring(T)}
    for _, impl in ipairs(IMPLS) do
      local c = by_key[impl .. "/" .. d .. "/" .. T]
      local s = c.status == "unsupported" and "n/a" or c.status
      local ok = c.status == "ok"
      table.insert(row, ok and ms(c.fwd.mean) or s)
      table.insert(row, ok and (c.bwd and ms(c.bwd.mean) or "-") or s)
      table.insert(row, ok and (c.bwd and mib(c.mem_before_bwd) or mib(c.peak)) or s)
    end
    rows[#rows + 1] = row
  end
end

local shape_note = (args.heads and (", %d heads (%d kv)"):format(args.heads, args.kv_heads or args.heads) or "") ..
  (args.tq and (", %d queries"):format(args.tq) or "")
local title = ("Attention, batch %d%s, %s%s, %d passes each way (mean ms per pass; mem = MiB allocated %s%s)")
  :format(B, shape_note, args.dtype, args.causal and (", causal " .. args.align) or "", args.passes,
    args.fwd_only and "at the forward's peak" or "before the backward", on_cuda and "" or "; n/a on the CPU")
local tbl = md_table(headers, rows)
local notes = {}
local HN = args.heads or 1
for _, T in ipairs(SEQ_LIST) do
  local tq = args.tq or T
  if HN == 1 and tq == T then
    notes[#notes + 1] = ("seq %d: one B×T×T score matrix = %d·%d²·%d B = %.1f MiB (%s)"):format(T, B, T,
      ELT[args.dtype], B * T * T * ELT[args.dtype] / MiB, args.dtype)
  else
    notes[#notes + 1] = ("seq %d: one score matrix = B·H·Tq·T·elt = %d·%d·%d·%d·%d B = %.1f MiB (%s)"):format(T,
      B, HN, tq, T, ELT[args.dtype], B * HN * tq * T * ELT[args.dtype] / MiB, args.dtype)
  end
end
print()
print(title)
print()
print(tbl)
print()
print("naive attention keeps ~1 score matrix (softmax P) for the backward and ~3 at its peak:")
for _, n in ipairs(notes) do print("  " .. n) end
-- PyTorch's figures: the twin prints one JSON line per cell
local torch_cells = {}
if args.torch then
  local root = script_dir .. "../"
  local q = function(a) return "'" .. tostring(a):gsub("'", "'\\''") .. "'" end
  local parts = {("EMBER_COMMIT=%s python3 %sscripts/torch/bench_attention.py"):format(facts.commit, root),
    "--d", q(args.d), "--seq", q(args.seq), "--batch", B, "--dtype", q(args.dtype),
    "--passes", args.passes, "--warmup", args.warmup, "--backend", q(args.torch_backend),
    "--device", q(on_cuda and ("cuda:" .. (tostring(args.device):match(":(%d+)") or "0")) or "cpu"),
    "--seed", args.seed}
  if args.heads then parts[#parts + 1] = "--heads " .. args.heads end
  if args.kv_heads then parts[#parts + 1] = "--kv-heads " .. args.kv_heads end
  if args.tq then parts[#parts + 1] = "--tq " .. args.tq end
  if args.causal then parts[#parts + 1] = "--causal --align " .. args.align end
  if args.fwd_only then parts[#parts + 1] = "--fwd-only" end
  if args.flush_l2 then parts[#parts + 1] = "--flush-l2" end
  if args.tf32 then parts[#parts + 1] = "--tf32" end
  local cmd = table.concat(parts, " ") .. " 2>&1"
  print("pytorch: " .. cmd)
  local cj = require "cjson"
  local pipe = io.popen(cmd)
  for line in pipe:lines() do
    local ok, rec = pcall(cj.decode, line)
    if ok and type(rec) == "table" and rec.torch then
      rec.d, rec.seq = math.tointeger(rec.d), math.tointeger(rec.seq)   -- cjson gives floats
      torch_cells[rec.d .. "/" .. rec.seq] = rec
      if rec.status ~= "ok" then print(("  torch| d=%d seq=%d: %s: %s"):format(rec.d, rec.seq, rec.status,
        tostring(rec.error))) end
    elseif line:match("%S") then print("  torch| " .. line) end
  end
  pipe:close()
  if args.json then   -- PyTorch's cells go to the same JSON file
    local f = io.open(args.json, "a")
    for _, rec in pairs(torch_cells) do
      if rec.fwd_ms then rec.fwd_tflops = fwd_flops(rec.d, rec.seq) / (rec.fwd_ms / 1e3) / 1e12 end
      if rec.bwd_ms and rec.bwd_ms ~= cj.null then
        rec.bwd_tflops = 2.5 * fwd_flops(rec.d, rec.seq) / (rec.bwd_ms / 1e3) / 1e12
      end
      f:write(cj.encode(rec), "\n")
    end
    f:close()
  end
end

-- the speed table: TF/s per implementation (and PyTorch's)
local speed_headers = {"d", "seq"}
for _, impl in ipairs(IMPLS) do
  local l = impl_label(impl)
  speed_headers[#speed_headers + 1] = l .. " fwd TF/s"
  if not args.fwd_only then
    speed_headers[#speed_headers + 1] = l .. " bwd TF/s"
    speed_headers[#speed_headers + 1] = l .. " fwd+bwd ms"
  end
end
if args.torch then
  local l = "torch " .. args.torch_backend
  speed_headers[#speed_headers + 1] = l .. " fwd ms"
  speed_headers[#speed_headers + 1] = l .. " fwd TF/s"
  if not args.fwd_only then
    speed_headers[#speed_headers + 1] = l .. " bwd TF/s"
    speed_headers[#speed_headers + 1] = l .. " fwd+bwd ms"
  end
end
local speed_rows = {}
local function tf(flops, ms_)
  if not ms_ then return "-" end
  local v = flops / (ms_ / 1e3) / 1e12
  return (v < 10 and "%.2f" or "%.0f"):format(v)
end
for _, d in ipairs(D_LIST) do
  for _, T in ipairs(SEQ_LIST) do
    local row, f = {tostring(d), tostring(T)}, fwd_flops(d, T)
    for _, impl in ipairs(IMPLS) do
      local c = by_key[impl .. "/" .. d .. "/" .. T]
      local ok = c.status == "ok"
      row[#row + 1] = ok and tf(f, c.fwd.mean * 1e3) or c.status
      if not args.fwd_only then
        row[#row + 1] = ok and c.bwd and tf(2.5 * f, c.bwd.mean * 1e3) or c.status
        row[#row + 1] = ok and c.bwd and ms(c.fwd.mean + c.bwd.mean) or c.status
      end
    end
    if args.torch then
      local t = torch_cells[d .. "/" .. T]
      local ok = t and t.status == "ok"
      local bwd = ok and type(t.bwd_ms) == "number" and t.bwd_ms
      row[#row + 1] = ok and ("%.3f"):format(t.fwd_ms) or (t and t.status or "-")
      row[#row + 1] = ok and tf(f, t.fwd_ms) or (t and t.status or "-")
      if not args.fwd_only then
        row[#row + 1] = bwd and tf(2.5 * f, bwd) or (t and t.status or "-")
        row[#row + 1] = bwd and ("%.3f"):format(t.fwd_ms + bwd) or (t and t.status or "-")
      end
    end
    speed_rows[#speed_rows + 1] = row
  end
end
local speed_title = "Speed: TF/s with FlashAttention's FLOP count (4·B·H·d per visible pair forward, 2.5x that " ..
  "backward; causal pairs counted exactly)" .. (args.torch and ("; PyTorch SDPA backend " .. args.torch_backend ..
  ", same protocol") or "")
local speed_tbl = md_table(speed_headers, speed_rows)
print()
print(speed_title)
print()
print(speed_tbl)

if args.markdown then
  local lines = {title, "", tbl, "", speed_title, "", speed_tbl, ""}
  for _, n in ipairs(notes) do lines[#lines + 1] = "- " .. n end
  S.write_markdown(args.markdown, facts, lines, fail)
end
os.exit(any_error and 1 or 0)
