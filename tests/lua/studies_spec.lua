-- studies_spec.lua — the study scripts (scripts/bench_attention.lua,
-- mixed_precision.lua, memory_profile.lua) run as a user runs them: through
-- the built `ember` executable on the CPU with tiny settings, their printed
-- tables, JSON lines, Markdown files and exit statuses checked. The GPU-only
-- parts (graph and flash cells, memory statistics, clocks) are for tests/gpu.
--
-- Run from the repository root:  EMBER_BUILD=$PWD/build busted tests/lua/studies_spec.lua
local cjson = require "cjson"

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local EMBER, q, slurp, temp = H.EMBER, H.q, H.slurp, H.temp

-- run(script, {args...}, {prefix=, timeout=}) --> stdout, stderr, exit status.
-- `prefix` is shell text run first in the same shell (e.g. a ulimit);
-- `timeout` (seconds) turns a hang into a failure (exit status 124).
local function run(script, args, opts)
  opts = opts or {}
  local argv = {"run", "scripts/" .. script}
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  return H.ember(argv, {before = opts.prefix, wrap = opts.timeout and ("timeout " .. opts.timeout)})
end

local function lines(s)
  local out = {}
  for l in s:gmatch("[^\n]+") do out[#out + 1] = l end
  return out
end

local function json_lines(path)
  local out = {}
  for _, l in ipairs(lines(slurp(path) or "")) do out[#out + 1] = cjson.decode(l) end
  return out
end

--- Cells of the Markdown rows that start with "| <first> |", in order.
local function md_rows(text, first_pattern)
  local rows = {}
  for _, l in ipairs(lines(text)) do
    if l:match("^| " .. first_pattern .. " ") then
      local cells = {}
      for c in l:gmatch("|%s*([^|]-)%s*%f[|]") do cells[#cells + 1] = c end
      rows[#rows + 1] = cells
    end
  end
  return rows
end

local function find(text, s) return text:find(s, 1, true) ~= nil end

describe("study scripts", function()
  setup(function()
    assert(io.open(EMBER, "rb"), "no executable at " .. EMBER .. " (set EMBER_BUILD)"):close()
  end)

  after_each(H.remove_temps)

  -- -------------------------------------------------------------------------
  describe("bench_attention.lua", function()
    it("prints device, commit and config first, a line per cell and the d × seq table", function()
      local json, md = temp(".jsonl"), temp(".md")
      local out, err, status = run("bench_attention.lua", {"--device", "cpu", "--d", "16,32", "--seq", "32,64",
        "--passes", "2", "--warmup", "1", "--causal", "--json", json, "--markdown", md})
      assert.are.equal(0, status, err)
      local l = lines(out)
      assert.matches("^device: cpu", l[1])
      assert.matches("^commit: ", l[2])
      assert.matches("^config: impl=naive d=16,32 seq=32,64 batch=8 dtype=f32 causal=true passes=2 warmup=1", l[3])
      local progress = 0
      for _, line in ipairs(l) do
        if line:match("^naive%s+d=%d+%s+seq=%d+%s+fwd%s+[%d.]+ ± [%d.]+ ms%s+bwd%s+[%d.]+ ± [%d.]+ ms") then
          progress = progress + 1
        end
      end
      assert.are.equal(4, progress)
      assert.truthy(find(out, "| d  | seq | naive fwd ms | naive bwd ms | naive mem MiB |"))
      -- two tables with the same (d, seq) rows: times and memory, then the speed table (TF/s, fwd+bwd ms)
      local rows = md_rows(out, "%d+")
      assert.are.equal(8, #rows)
      local want = {{"16", "32"}, {"16", "64"}, {"32", "32"}, {"32", "64"}}
      for i = 1, 4 do
        local r, s = rows[i], rows[i + 4]
        assert.are.same(want[i], {r[1], r[2]})
        assert.is_true(tonumber(r[3]) > 0 and tonumber(r[4]) > 0, "times of row " .. i)
        assert.are.equal("n/a", r[5])              -- no memory statistics on the CPU
        assert.are.same(want[i], {s[1], s[2]})
        -- TF/s of these tiny CPU cells print as 0.00-0.03: numbers, not negative; fwd+bwd = fwd + bwd
        assert.is_true(tonumber(s[3]) >= 0 and tonumber(s[4]) >= 0, "speed row " .. i)
        assert.is_true(math.abs(tonumber(s[5]) - (tonumber(r[3]) + tonumber(r[4]))) <= 0.0015,
          ("speed row %d: fwd+bwd %s vs %s + %s"):format(i, s[5], r[3], r[4]))
      end
      assert.truthy(find(out, "| d  | seq | naive fwd TF/s | naive bwd TF/s | naive fwd+bwd ms |"))
      -- the seq 64 score matrix: 8·64²·4 B
      assert.truthy(find(out, "seq 64: one B×T×T score matrix = 8·64²·4 B = 0.1 MiB (f32)"))
      assert.truthy(find(slurp(md), "| d  | seq | naive fwd ms"))
    end)

    it("writes one JSON line per cell with the timings, memory fields and status", function()
      local json = temp(".jsonl")
      local _, err, status = run("bench_attention.lua", {"--device", "cpu", "--d", "16", "--seq", "32,48",
        "--batch", "2", "--passes", "2", "--warmup", "0", "--json", json})
      assert.are.equal(0, status, err)
      local cells = json_lines(json)
      assert.are.equal(2, #cells)
      for i, c in ipairs(cells) do
        local T = ({32, 48})[i]
        assert.are.same({"naive", 16, T, 2, "f32", false, "ok"},
          {c.impl, c.d, c.seq, c.batch, c.dtype, c.causal, c.status})
        assert.is_true(c.fwd_ms > 0 and c.bwd_ms > 0 and c.fwd_std_ms >= 0 and c.bwd_median_ms > 0)
        assert.are.equal(cjson.null, c.mem_before_bwd_bytes)   -- CPU: no allocator statistics
        assert.are.equal(cjson.null, c.peak_bytes)
        assert.are.equal(2 * T * T * 4, c.score_bytes)
        assert.are.equal(2, c.passes)
        assert.is_string(c.commit)
        assert.is_string(c.date)
        assert.matches("^cpu", c.device)
      end
    end)

    it("turns an allocation failure into an OOM cell and goes on with the next cells", function()
      -- Cap the address space (ulimit -v) 256 MiB above what an ember process
      -- with OpenBLAS mapped needs: seq 32 fits, seq 4096's 512 MiB score
      -- matrix does not. One BLAS thread: OpenBLAS maps its buffers per thread
      -- and spins when it cannot, so they are mapped in the first cell.
      local probe = io.popen("OPENBLAS_NUM_THREADS=1 " .. q(EMBER) .. " -e " ..
        q("ember.randn(64,64):matmul(ember.randn(64,64)) for l in io.lines('/proc/self/status') do " ..
          "local k = l:match('^VmPeak:%s*(%d+)') if k then print(k) end end"))
      local vm_kb = tonumber(probe:read("a"))
      probe:close()
      assert.is_number(vm_kb)
      local json = temp(".jsonl")
      local out, err, status = run("bench_attention.lua", {"--device", "cpu", "--d", "16,32", "--seq", "32,4096",
        "--passes", "1", "--warmup", "0", "--json", json},
        {prefix = ("ulimit -v %d; export OPENBLAS_NUM_THREADS=1"):format(vm_kb + 256 * 1024), timeout = 60})
      assert.are.equal(0, status, err)
      local status_of = {}
      for _, c in ipairs(json_lines(json)) do
        status_of[("%d/%d"):format(c.d, c.seq)] = c.status
        if c.status == "OOM" then
          assert.matches("^out of memory", c.error)
          assert.are.equal(cjson.null, c.fwd_ms)
        end
      end
      assert.are.same({["16/32"] = "ok", ["16/4096"] = "OOM", ["32/32"] = "ok", ["32/4096"] = "OOM"}, status_of)
      local rows = md_rows(out, "%d+")
      assert.are.same({"16", "4096", "OOM", "OOM", "OOM"}, rows[2])
      assert.matches("^naive%s+d=16%s+seq=4096%s+OOM %(out of memory", lines(out)[5])
    end)

    it("times the tiled flash path on the CPU in the decode shape (GQA, one query, bottom-right, forward only)", function()
      local json = temp(".jsonl")
      local out, err, status = run("bench_attention.lua", {"--device", "cpu", "--impl", "naive,flash", "--d", "16",
        "--seq", "300", "--batch", "2", "--heads", "4", "--kv-heads", "2", "--tq", "1", "--causal", "--align",
        "bottom_right", "--fwd-only", "--passes", "2", "--warmup", "0", "--json", json})
      assert.are.equal(0, status, err)
      assert.truthy(find(out, "heads=4 kv_heads=2 tq=1 align=bottom_right fwd_only=true"))
      assert.truthy(find(out, "seq 300: one score matrix = B·H·Tq·T·elt = 2·4·1·300·4 B"))
      local cells = json_lines(json)
      assert.are.equal(2, #cells)
      for i, c in ipairs(cells) do
        assert.are.same({({"naive", "flash"})[i], 4, 2, 1, "bottom_right", true, "ok"},
          {c.impl, c.heads, c.kv_heads, c.tq, c.align, c.fwd_only, c.status})
        assert.is_true(c.fwd_ms > 0)
        assert.are.equal(cjson.null, c.bwd_ms)
        assert.are.equal(2 * 4 * 1 * 300 * 4, c.score_bytes)
      end
      local rows = md_rows(out, "%d+")
      assert.are.same({"16", "300"}, {rows[1][1], rows[1][2]})
      assert.are.equal("-", rows[1][4])   -- no backward column values
      assert.is_true(tonumber(rows[1][6]) > 0, "flash fwd ms")
    end)

    it("rejects bad options with a clear message and a non-zero status", function()
      local cases = {
        {{"--device", "cpu", "--impl", "graph"}, "--impl graph needs --device cuda"},
        {{"--device", "cpu", "--impl", "naive,fast"}, "--impl expects a comma list of naive, graph, flash"},
        {{"--device", "cpu", "--d", "16,x"}, "--d expects a comma list of positive integers, got '16,x'"},
        {{"--device", "cpu", "--seq", "0"}, "--seq expects a comma list of positive integers"},
        {{"--device", "cpu", "--passes", "0"}, "--passes must be a positive integer"},
        {{"--device", "tpu"}, "--device must be cpu, cuda or cuda:N"},
        {{"--device", "cpu", "--dtype", "f64"}, "argument for option '--dtype' must be one of"},
        {{"--device", "cpu", "--kv-heads", "2"}, "--kv-heads needs --heads"},
        {{"--device", "cpu", "--heads", "3", "--kv-heads", "2"}, "--kv-heads 2 must divide --heads 3"},
        {{"--device", "cpu", "--tq", "0"}, "--tq must be a positive integer"},
        {{"--device", "cpu", "--align", "bottom_right"}, "--align bottom_right needs --causal"},
        {{"--device", "cpu", "--causal", "--align", "end"}, "argument for option '--align' must be one of"},
      }
      for _, c in ipairs(cases) do
        local out, err, status = run("bench_attention.lua", c[1])
        assert.are_not.equal(0, status, table.concat(c[1], " "))
        assert.truthy(find(err, c[2]), "stderr for " .. table.concat(c[1], " ") .. ": " .. err)
        assert.falsy(find(out, "| d "))
      end
    end)
  end)

  -- -------------------------------------------------------------------------
  describe("mixed_precision.lua", function()
    --- x rounded to nearest-even in a binary format with `bits` significand
    -- bits (implicit one included) and smallest normal exponent emin.
    local function round_to(x, bits, emin)
      if x == 0 then return 0.0 end
      local a = math.abs(x)
      local e = math.floor(math.log(a, 2))
      if 2.0 ^ e > a then e = e - 1 elseif 2.0 ^ (e + 1) <= a then e = e + 1 end
      local ulp = 2.0 ^ (math.max(e, emin) - (bits - 1))
      local n = math.floor(a / ulp)
      local frac = a / ulp - n
      if frac > 0.5 or (frac == 0.5 and n % 2 == 1) then n = n + 1 end
      return (x < 0 and -1 or 1) * n * ulp
    end
    local ROUND = {
      f32 = function(x) return (string.unpack("f", string.pack("f", x))) end,  -- C's double -> float
      f16 = function(x) return round_to(x, 11, -14) end,
      bf16 = function(x) return round_to(x, 8, -126) end,
    }
    -- IEEE arithmetic: the exact sum (exact in a double here) rounded once to the accumulator
    local function simulate(acc, value)
      local x, s = ROUND[value](0.01), 0.0
      for _ = 1, 1000 do s = ROUND[acc](s + x) end
      return s
    end

    it("sums 0.01 a thousand times exactly as IEEE rounding does in each variant", function()
      assert.are.equal(ROUND.f32(0.1), 0.100000001490116119384765625)   -- the f32 rounding itself
      assert.are.equal(0.01000213623046875, ROUND.f16(0.01))           -- 1.2802734375 · 2^-7
      local json = temp(".jsonl")
      local out, err, status = run("mixed_precision.lua", {"--device", "cpu", "--part", "accumulation", "--json", json})
      assert.are.equal(0, status, err)
      local r = json_lines(json)[1]
      local want = {{"f32", "f32", false}, {"f16", "f16", false}, {"f32", "f16", false}, {"f32", "f16", true},
        {"bf16", "bf16", false}, {"f32", "bf16", false}}
      assert.are.equal(#want, #r.accumulation)
      for i, w in ipairs(want) do
        local v = r.accumulation[i]
        assert.are.same(w, {v.accumulator, v.value_dtype, v.cast_to_f32})
        local expect = simulate(w[1], w[2])
        -- JSON numbers keep 14 digits; neighbouring f32 values near 10 are 9.5e-7 apart
        assert.is_true(math.abs(v.result - expect) < 1e-9, ("variant %d: %.17g vs IEEE %.17g"):format(i, v.result, expect))
        assert.are.equal(10, v.exact)
      end
      -- the four of the assignment, as PyTorch prints them (4 digits)
      assert.are.same({"10.0001", "9.9531", "10.0021", "10.0021"}, {
        ("%.4f"):format(r.accumulation[1].result), ("%.4f"):format(r.accumulation[2].result),
        ("%.4f"):format(r.accumulation[3].result), ("%.4f"):format(r.accumulation[4].result)})
      assert.truthy(find(out, "| # | accumulator += value | result"))
      assert.are.equal(6, #md_rows(out, "%d"))
      assert.falsy(find(out, "(b) autocast"))
    end)

    it("reports the ToyModel's dtypes under bf16 and f16 autocast as PyTorch's autocast gives them", function()
      local json, md = temp(".jsonl"), temp(".md")
      local out, err, status = run("mixed_precision.lua", {"--device", "cpu", "--part", "autocast", "--json", json,
        "--markdown", md})
      assert.are.equal(0, status, err)
      local r = json_lines(json)[1]
      -- PyTorch's autocast: linear on the lower-precision list, layer_norm and
      -- cross_entropy on the f32 list, parameters and their grads untouched (f32)
      for _, dt in ipairs({"bf16", "f16"}) do
        assert.are.same({parameters = "f32", fc1 = dt, ln = "f32", logits = dt, loss = "f32", grads = "f32"},
          r.autocast[dt].observed)
        assert.is_true(r.autocast[dt].matches_pytorch)
        for _, p in ipairs(r.autocast[dt].parameters) do assert.are.same({"f32", "f32"}, {p.dtype, p.grad}) end
      end
      assert.truthy(find(out, "| quantity                         | ember bf16 | PyTorch bf16 | ember f16 | PyTorch f16 |"))
      local rows = md_rows(out, "%a[^|]-")
      assert.are.equal(7, #rows)             -- the header and six quantities
      assert.are.same({"fc1 output (after relu)", "bf16", "bf16", "f16", "f16"}, rows[3])
      assert.are.same({"norm output", "f32", "f32", "f32", "f32"}, rows[4])
      -- one line of why per quantity
      for _, what in ipairs({"model parameters inside autocast:", "fc1 output (after relu):", "norm output:",
          "logits (fc2 output):", "loss:", "gradients:"}) do
        assert.truthy(find(out, "- " .. what), what)
      end
      assert.truthy(find(out, "bf16 autocast matches PyTorch: yes"))
      assert.truthy(find(slurp(md), "| quantity"))
    end)

    it("rejects bad options", function()
      local _, err, status = run("mixed_precision.lua", {"--device", "cpu", "--autocast", "bf16,f32"})
      assert.are_not.equal(0, status)
      assert.truthy(find(err, "--autocast expects a comma list of bf16, f16; got 'bf16,f32'"))
      _, err, status = run("mixed_precision.lua", {"--device", "cpu", "--part", "both"})
      assert.are_not.equal(0, status)
      assert.truthy(find(err, "argument for option '--part' must be one of"))
    end)
  end)

  -- -------------------------------------------------------------------------
  describe("memory_profile.lua", function()
    local TINY = {"--device", "cpu", "--model", "tiny", "--context", "16,32", "--vocab", "256", "--batch", "2"}

    it("prints the peak-memory table (n/a on the CPU), every configuration and the residual-stream size", function()
      local json, md = temp(".jsonl"), temp(".md")
      local args = {table.unpack(TINY)}
      for _, a in ipairs({"--json", json, "--markdown", md}) do args[#args + 1] = a end
      local out, err, status = run("memory_profile.lua", args)
      assert.are.equal(0, status, err)
      local l = lines(out)
      assert.matches("^device: cpu", l[1])
      assert.matches("^commit: ", l[2])
      assert.matches("^config: tiny d_model=64 .* context=16,32 mode=fwd,train precision=fp32,bf16", l[3])
      assert.truthy(find(out, "| context | fwd fp32 | train fp32 | fwd bf16 | train bf16 |"))
      assert.are.same({{"16", "n/a", "n/a", "n/a", "n/a"}, {"32", "n/a", "n/a", "n/a", "n/a"}}, md_rows(out, "%d+"))
      assert.are.equal(8, #md_rows(out, "[fb][pf]%d+"))       -- fp32/bf16 × fwd/train × 2 contexts
      -- 2 · 16 · 64 elements, 4 bytes each in f32
      assert.truthy(find(out, "- context 16: 2·16·64 = 2048 elements → f32 8192 B = 0.01 MiB, bf16 0.00 MiB"))
      local cells = json_lines(json)
      assert.are.equal(8, #cells)
      for _, c in ipairs(cells) do
        assert.are.equal("ok", c.status)
        assert.are.equal("tiny", c.model)
        assert.are.equal(cjson.null, c.peak_bytes)
        assert.are.equal(cjson.null, c.start_bytes)
      end
      assert.are.same({"fp32", "fwd", 16}, {cells[1].precision, cells[1].mode, cells[1].context})
      assert.are.same({"bf16", "train", 32}, {cells[8].precision, cells[8].mode, cells[8].context})
      assert.truthy(find(slurp(md), "| context | fwd fp32"))
    end)

    it("says clearly when --snapshot cannot work in this build", function()
      local has = io.popen(q(EMBER) .. " -e " .. q("local ok, m = pcall(require, 'ember.memory') " ..
        "io.write(tostring(ok and type(m) == 'table' and m.record_history ~= nil))")):read("a")
      if has == "true" then pending("this build records memory history: nothing to refuse") return end
      local dir = temp(".d")
      local args = {table.unpack(TINY)}
      args[#args + 1], args[#args + 2] = "--snapshot", dir
      local out, err, status = run("memory_profile.lua", args)
      assert.are_not.equal(0, status)
      assert.truthy(find(err, "--snapshot needs ember.memory.record_history"))
      assert.falsy(find(out, "| context"))
    end)

    it("rejects bad options", function()
      local cases = {
        {{"--context", "16,0"}, "--context expects a comma list of positive integers"},
        {{"--mode", "fwd,infer"}, "--mode expects a comma list of fwd, fwd_bwd, train; got 'fwd,infer'"},
        {{"--precision", "fp8"}, "--precision expects a comma list of fp32, bf16"},
        {{"--model", "huge"}, "argument for option '--model' must be one of"},
        {{"--batch", "0"}, "--batch must be a positive integer"},
      }
      for _, c in ipairs(cases) do
        local args = {"--device", "cpu", "--model", "tiny"}
        for _, a in ipairs(c[1]) do args[#args + 1] = a end
        local _, err, status = run("memory_profile.lua", args)
        assert.are_not.equal(0, status)
        assert.truthy(find(err, c[2]), table.concat(c[1], " ") .. ": " .. err)
      end
    end)
  end)
end)
