--- ember.profiler: a kernel profiler in the engine (torch.profiler's job,
-- where Nsight cannot run or is not wanted).
--
--   ember.profiler.start{backend = "auto"}    -- "cupti" | "events" | "host"
--   ... work ...
--   local p = ember.profiler.stop()
--   print(p:kernel_table{top = 10, phase = "backward"})
--   p:export_chrome_trace("trace.json")       -- open in ui.perfetto.dev
--
--   local p = ember.profile(function() step() end)   -- REPL: runs, prints, returns p
--
-- Backends (the tables name the one used, and why CUPTI was not):
--   cupti   every kernel/memcpy/memset with device timestamps and the op,
--           module path and phase that launched it (kernels/cupti.cu)
--   events  a CUDA event pair around each op on the current stream: device
--           time per op, nested ops included (no per-kernel rows)
--   host    host time per op only (CPU builds, CPU-only machines)
-- start() synchronises the device (work queued before does not count) and
-- turns module-path tracking on (ember.context) unless {modules = false};
-- stop() synchronises it again. Tables are strings; the rows behind them
-- come from p:kernels / p:ops / p:modules / p:stats.
local core = require "ember.core"
local context = require "ember.context"
local peaks_lib = require "ember.peaks"

local M = {}
local Profile = {}
Profile.__index = Profile

local PHASES = {"forward", "backward", "optimizer", "none"}
local holding_track = false

-- ---------------------------------------------------------------------------
-- sessions

--- Start profiling. opts: backend ("auto"), modules (true: track module paths).
function M.start(opts)
  if opts ~= nil and type(opts) ~= "table" then
    error("ember.profiler.start: expected an options table or nil, got " .. type(opts), 2)
  end
  opts = opts or {}
  core.prof_start(opts)
  if opts.modules ~= false then
    context.track(true)
    holding_track = true
  end
end

--- Stop profiling; returns the profile object.
function M.stop()
  local c = core.prof_stop()
  if holding_track then
    context.track(false)
    holding_track = false
  end
  local p = setmetatable({_c = c}, Profile)
  local s = c:summary()
  p.backend, p.label, p.reason = s.backend, s.label, s.reason
  p._stats = s
  return p
end

function M.is_running() return core.prof_running() end
--- Mark a step boundary (p:summary() divides by the steps marked).
function M.step() core.prof_step() end
--- Load CUPTI now (graphs captured from then on keep their ops' context
-- when replays are profiled). Returns true, or false and the reason.
function M.init() return core.prof_init() end
--- What start() would use: "cupti" | "events" | "host", and why not CUPTI.
function M.backend() return core.prof_auto_backend() end
--- Peaks the roofline columns divide by, for every profile from now on:
-- {gbs =, tflops = {f32 =, tf32 =, bf16 =, ...} or a number}; nil goes back
-- to the default (the GPU's datasheet entry, or the CPU measured once).
function M.set_peaks(p)
  if p ~= nil and (type(p) ~= "table" or type(p.gbs) ~= "number") then
    error("ember.profiler.set_peaks: expected nil or {gbs = number, tflops = table or number}, got " ..
      (type(p) == "table" and "a table without gbs" or type(p)), 2)
  end
  if p and type(p.tflops) ~= "table" then p = peaks_lib.make(p.gbs, p.tflops, p.name) end
  M._peaks = p
end

--- Run fn under the profiler, print the tables (unless opts.print == false)
-- and return the profile, then fn's results. opts also go to start() and
-- to p:print() (top =).
function M.profile(fn, opts)
  if type(fn) ~= "function" then error("ember.profile: expected a function, got " .. type(fn), 2) end
  if opts ~= nil and type(opts) ~= "table" then
    error("ember.profile: expected an options table or nil, got " .. type(opts), 2)
  end
  opts = opts or {}
  M.start(opts)
  local res = table.pack(pcall(fn))
  local p = M.stop()
  if not res[1] then
    p:close()
    error(res[2], 0)
  end
  if opts.print ~= false then p:print(opts) end
  return p, table.unpack(res, 2, res.n)
end

-- ---------------------------------------------------------------------------
-- formatting helpers

local function ms(x) return x and ("%.3f"):format(x) or "-" end
-- 1234567 -> "1.23M": bytes and FLOPs in the roofline columns
local function si(x)
  if not x then return "-" end
  local units = {{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}}
  for _, u in ipairs(units) do if x >= u[1] then return ("%.3g%s"):format(x / u[1], u[2]) end end
  return ("%.3g"):format(x)
end
local function rate(x) return x and (x >= 100 and ("%.0f"):format(x) or ("%.3g"):format(x)) or "-" end
local function us(x) return x and ("%.1f"):format(x) or "-" end
local function pct(x) return x and ("%.1f%%"):format(x) or "-" end

local function clip(s, width)
  if #s <= width then return s end
  return s:sub(1, width - 3) .. "..."
end

--- Aligned text table: first column left, the rest right-aligned.
local function render(title, headers, rows, footer)
  local w = {}
  for i, h in ipairs(headers) do w[i] = utf8.len(h) or #h end
  for _, r in ipairs(rows) do
    for i, v in ipairs(r) do w[i] = math.max(w[i], utf8.len(v) or #v) end
  end
  local function line(cells)
    local out = {}
    for i, v in ipairs(cells) do
      local pad = (" "):rep(w[i] - (utf8.len(v) or #v))
      out[i] = i == 1 and (v .. pad) or (pad .. v)
    end
    return table.concat(out, "  ")
  end
  local sep = {}
  for i = 1, #headers do sep[i] = ("-"):rep(w[i]) end
  local lines = {title, line(headers), table.concat(sep, "  ")}
  for _, r in ipairs(rows) do lines[#lines + 1] = line(r) end
  if footer then lines[#lines + 1] = footer end
  return table.concat(lines, "\n")
end

local function check_opts(method, opts)
  if opts ~= nil and type(opts) ~= "table" then
    error(("ember.profile.%s: expected an options table or nil, got %s"):format(method, type(opts)), 3)
  end
  opts = opts or {}
  if opts.phase ~= nil then
    local ok = false
    for _, ph in ipairs(PHASES) do ok = ok or opts.phase == ph end
    if not ok then
      error(("ember.profile.%s: expected phase to be \"forward\", \"backward\", \"optimizer\" or \"none\", got %s")
        :format(method, tostring(opts.phase)), 3)
    end
  end
  if opts.top ~= nil and (math.type(opts.top) ~= "integer" or opts.top < 1) then
    error(("ember.profile.%s: expected top to be a positive integer, got %s"):format(method, tostring(opts.top)), 3)
  end
  if opts.depth ~= nil and (math.type(opts.depth) ~= "integer" or opts.depth < 0) then
    error(("ember.profile.%s: expected depth to be an integer >= 0, got %s"):format(method, tostring(opts.depth)), 3)
  end
  return opts
end

local function filter_text(opts)
  local parts = {}
  if opts.phase then parts[#parts + 1] = "phase " .. opts.phase end
  if opts.module then parts[#parts + 1] = "module " .. opts.module end
  return #parts > 0 and (" [" .. table.concat(parts, ", ") .. "]") or ""
end

local function module_name(key) return key == "" and "(top level)" or key end

-- "layers.10" after "layers.9": numbers compare as numbers.
local function natural_less(a, b)
  local ia, ib = 1, 1
  while ia <= #a and ib <= #b do
    local na, nb = a:match("^%d+", ia), b:match("^%d+", ib)
    if na and nb then
      if tonumber(na) ~= tonumber(nb) then return tonumber(na) < tonumber(nb) end
      ia, ib = ia + #na, ib + #nb
    else
      local ca, cb = a:sub(ia, ia), b:sub(ib, ib)
      if ca ~= cb then return ca < cb end
      ia, ib = ia + 1, ib + 1
    end
  end
  return #a - ia < #b - ib
end

-- ---------------------------------------------------------------------------
-- rows

function Profile:_handle()
  if not self._c then error("ember.profile: this profile was closed", 3) end
  return self._c
end

--- Raw grouped rows (see ember.core profile.group): opts source, by, phase, module, depth, rollup, kernels_only.
function Profile:group(opts) return self:_handle():group(opts) end

--- The peaks this profile's roofline columns divide by: opts.peaks, then
-- ember.profiler.set_peaks, then the default (GPU: the current device's
-- datasheet entry, nil when unknown; host profile: the CPU measured once per
-- process, unless measure == false).
function Profile:peaks(opts, measure)
  if opts and opts.peaks then
    local pk = opts.peaks
    if type(pk) ~= "table" then
      error("ember.profile: expected option 'peaks' to be {gbs =, tflops =}, got " .. type(pk), 3)
    end
    return type(pk.tflops) == "table" and pk or peaks_lib.make(pk.gbs, pk.tflops, pk.name)
  end
  if M._peaks then return M._peaks end
  if self._peaks == nil then
    if self.backend == "host" then
      if measure == false or core.prof_running() then return nil end   -- measuring would be profiled
      self._peaks = peaks_lib.cpu()
    else
      self._peaks = peaks_lib.current() or false
    end
  end
  return self._peaks or nil
end

-- The rates of a row: GB/s and TF/s over the time of its calls with a
-- declared cost, % of peak (the roofline floor over that time), coverage.
local function add_rates(r)
  local t = r.cost_ms
  if t and t > 0 then
    r.gbs = r.bytes / t / 1e6
    r.tflops = r.flops / t / 1e9
    if r.floor_ms then r.pct_peak = 100 * r.floor_ms / t end
  end
  if r.roof_ms and r.roof_ms > 0 then r.cost_pct = 100 * (r.cost_ms or 0) / r.roof_ms end
  return r
end

local function group_with_rates(self, q, opts, measure)
  q.peaks = self:peaks(opts, measure)
  local rows = self:_handle():group(q)
  for _, r in ipairs(rows) do add_rates(r) end
  return rows
end

--- GPU rows by kernel name (or opts.by = "op" / "module" / "phase"); empty without CUPTI.
-- Each row has the roofline fields (bytes, flops, gbs, tflops, pct_peak, bound, cost_ms, roof_ms).
function Profile:kernels(opts)
  opts = check_opts("kernels", opts)
  return group_with_rates(self, {source = "gpu", by = opts.by or "name", phase = opts.phase, module = opts.module,
                                 depth = opts.depth, rollup = opts.rollup, kernels_only = opts.kernels_only},
                          opts, opts.measure)
end

--- Host rows by op (or opts.by = "module" / "phase"), with the roofline fields.
function Profile:ops(opts)
  opts = check_opts("ops", opts)
  return group_with_rates(self, {source = "ops", by = opts.by or "op", phase = opts.phase, module = opts.module,
                                 depth = opts.depth, rollup = opts.rollup}, opts, opts.measure)
end

--- Time per module path: GPU kernel time with CUPTI, else host self time of ops.
function Profile:modules(opts)
  opts = check_opts("modules", opts)
  local gpu = self:has_kernels()
  return self:_handle():group{source = gpu and "gpu" or "ops", by = "module", phase = opts.phase,
                              module = opts.module, depth = opts.depth, rollup = opts.rollup}, gpu
end

function Profile:has_kernels() return self.backend == "cupti" and (self._stats.kernels or 0) > 0 end

--- Whether kernels of CUDA-graph replays carry the context (and declared
-- cost) of the ops that were captured: then rows by op come from the kernels,
-- since the replayed ops left no host record in this profile.
function Profile:replayed() return self:has_kernels() and (self._stats.graph_kernels_attributed or 0) > 0 end

--- The summary numbers (ms; counts), with steps and per-step figures derived.
function Profile:stats()
  local s = self._stats
  local ph = s.phases
  local steps, how = s.steps_marked, "marked with ember.profiler.step()"
  if steps == 0 then
    for _, name in ipairs({"optimizer", "backward", "forward"}) do
      if ph[name].count > 0 then
        steps, how = ph[name].count, ("inferred: one per %s phase"):format(name)
        break
      end
    end
  end
  s.steps, s.steps_how = steps > 0 and steps or nil, how
  s.gpu_busy_pct = s.gpu_busy_ms and s.wall_ms > 0 and 100 * s.gpu_busy_ms / s.wall_ms or nil
  s.host_us_per_op = s.top_ops > 0 and 1e3 * s.top_op_ms / s.top_ops or nil
  return s
end

-- ---------------------------------------------------------------------------
-- tables

--- Per kernel: calls, total ms, avg/min/max µs, % of GPU time (in the filter).
-- opts: top (15), phase, module (glob), by ("name"), width (70).
function Profile:kernel_table(opts)
  opts = check_opts("kernel_table", opts)
  local title = ("Kernels%s: %s"):format(filter_text(opts), self.label)
  if self.backend ~= "cupti" then
    return title .. "\n(no per-kernel times without CUPTI: see op_table for time per op)"
  end
  local rows = self:kernels(opts)
  if #rows == 0 then return title .. "\n(no GPU activity recorded: CPU tensors? see op_table for host times)" end
  local sum = 0
  for _, r in ipairs(rows) do sum = sum + r.total_ms end
  local out, top, width = {}, opts.top or 15, opts.width or 70
  local split = opts.phase == nil
  for i = 1, math.min(top, #rows) do
    local r = rows[i]
    local row = {clip(r.key, width), tostring(r.calls), ms(r.total_ms), us(r.avg_us), us(r.min_us), us(r.max_us),
                 pct(sum > 0 and 100 * r.total_ms / sum or 0), pct(r.pct_peak)}
    if split then
      for _, ph in ipairs({"forward", "backward", "optimizer"}) do row[#row + 1] = ms(r[ph .. "_ms"] or 0) end
    end
    out[#out + 1] = row
  end
  local headers = {opts.by == "op" and "Op" or opts.by == "module" and "Module" or "Kernel", "Calls", "Total ms",
                   "Avg µs", "Min µs", "Max µs", "% GPU", "% peak"}
  if split then for _, h in ipairs({"Fwd ms", "Bwd ms", "Opt ms"}) do headers[#headers + 1] = h end end
  local s = self:stats()
  local footer = ("%d of %d rows; sum of their durations %.3f ms; the profile: GPU busy %s ms of %.3f ms wall (%s)")
    :format(#out, #rows, sum, ms(s.gpu_busy_ms), s.wall_ms, pct(s.gpu_busy_pct))
    .. "\n% peak: roofline floor of the declared bytes/FLOPs over the time (roofline_table for the columns behind it)"
  return render(title, headers, out, footer)
end

--- Per op: calls, host total/self ms, avg µs, kernels launched, device ms.
-- opts: top (20), phase, module, sort ("device" when known, else "self"; or "host", "calls").
function Profile:op_table(opts)
  opts = check_opts("op_table", opts)
  local rows = self:ops(opts)
  local sort = opts.sort or (self.backend == "host" and "self" or "device")
  local field = ({device = "device_ms", self = "self_ms", host = "total_ms", calls = "calls"})[sort]
  if not field then
    error(("ember.profile.op_table: expected sort to be \"device\", \"self\", \"host\" or \"calls\", got %s")
      :format(tostring(sort)), 2)
  end
  table.sort(rows, function(a, b)
    local x, y = a[field] or -1, b[field] or -1
    if x ~= y then return x > y end
    return a.key < b.key
  end)
  local device_note = self.backend == "cupti" and "device = kernels launched by the op itself"
    or self.backend == "events" and "device = CUDA events around the op, nested ops included"
    or "no device times"
  local title = ("Ops%s: %s; %s"):format(filter_text(opts), self.label, device_note)
  local out, top = {}, opts.top or 20
  for i = 1, math.min(top, #rows) do
    local r = rows[i]
    out[#out + 1] = {r.key, tostring(r.calls), ms(r.total_ms), ms(r.self_ms), us(r.avg_us),
                     r.kernels and tostring(r.kernels) or "-", ms(r.device_ms), pct(r.pct_peak)}
  end
  local s, calls = self:stats(), 0
  for _, r in ipairs(rows) do calls = calls + r.calls end
  local footer = ("%d of %d ops, %d calls; the profile: %d top-level op calls, %s µs host each on average")
    :format(#out, #rows, calls, s.top_ops, us(s.host_us_per_op))
  return render(title, {"Op", "Calls", "Host ms", "Self ms", "Avg µs", "Kernels", "Device ms", "% peak"}, out, footer)
end

--- The roofline table: per op (by = "op", default), kernel (by = "kernel")
-- or module (by = "module"), the time of the calls, the bytes and FLOPs
-- their ops declared (EM_OP_COST), the achieved GB/s and TF/s over the time
-- of the calls that declared a cost, and % of peak: the roofline floor
-- (per call max(bytes / peak GB/s, FLOPs / peak TF/s of its class)) over that
-- time, with the bound that floor comes from. opts: top (25), phase, module,
-- depth, rollup, peaks ({gbs =, tflops = {...}}), sort ("time" or "peak").
function Profile:roofline_table(opts)
  opts = check_opts("roofline_table", opts)
  local by = opts.by or "op"
  if by ~= "op" and by ~= "kernel" and by ~= "module" then
    error(("ember.profile.roofline_table: expected by to be \"op\", \"kernel\" or \"module\", got %s")
      :format(tostring(by)), 2)
  end
  local gpu = self:has_kernels()
  if by == "kernel" and not gpu then
    return ("Roofline by kernel%s: %s\n(no per-kernel times without CUPTI: use by = \"op\")")
      :format(filter_text(opts), self.label)
  end
  -- graph replays: op rows from the replayed kernels' capture-time ops (the backward's by autograd node)
  local q = {source = (by == "kernel" or (by ~= "op" and gpu) or self:replayed()) and "gpu" or "ops",
             by = by == "kernel" and "name" or by, phase = opts.phase, module = opts.module, depth = opts.depth,
             rollup = opts.rollup, kernels_only = by == "kernel" or nil}
  local rows = group_with_rates(self, q, opts)
  local pk = self:peaks(opts)
  if opts.sort == "peak" then
    table.sort(rows, function(a, b) return (a.pct_peak or 1e9) < (b.pct_peak or 1e9) end)
  elseif opts.sort ~= nil and opts.sort ~= "time" then
    error(("ember.profile.roofline_table: expected sort to be \"time\" or \"peak\", got %s"):format(tostring(opts.sort)), 2)
  else
    table.sort(rows, function(a, b)
      if a.roof_ms ~= b.roof_ms then return (a.roof_ms or 0) > (b.roof_ms or 0) end
      return a.key < b.key
    end)
  end
  local time_what = q.source == "gpu" and (by == "op" and "GPU time of the calls; graph replays: the ops of the capture"
                                         or "GPU time of the calls")
    or self.backend == "cupti" and "GPU time of the kernels each op call launched itself"
    or self.backend == "events" and "CUDA-event time per op call, nested ops included"
    or "host self time of the op calls"
  local title = ("Roofline by %s%s (%s): %s"):format(by, filter_text(opts), time_what, self.label)
  local out, top, total, costed = {}, opts.top or 25, 0, 0
  for _, r in ipairs(rows) do total, costed = total + (r.roof_ms or 0), costed + (r.cost_ms or 0) end
  for i = 1, math.min(top, #rows) do
    local r = rows[i]
    local key = by == "module" and module_name(r.key) or (r.key == "" and "(no op)" or r.key)
    local has = r.cost_ms and r.cost_ms > 0
    out[#out + 1] = {clip(key, opts.width or 60), tostring(r.calls), ms(r.roof_ms), has and pct(r.cost_pct) or "-",
                     has and si(r.bytes) or "-", has and si(r.flops) or "-", has and rate(r.gbs) or "-",
                     has and rate(r.tflops) or "-", pct(r.pct_peak), r.bound and (r.bound == "memory" and "mem" or "compute") or "-"}
  end
  local footer = {("%d of %d rows; declared costs cover %s of the %.3f ms in all rows (%.3f ms)"):format(#out, #rows,
    pct(total > 0 and 100 * costed / total or 0), total, costed),
    "rates over the time of calls with a declared cost; % peak = roofline floor / that time; peaks: " ..
      peaks_lib.describe(pk)}
  return render(title, {by == "kernel" and "Kernel" or by == "module" and "Module" or "Op", "Calls", "Time ms",
                        "Costed", "Bytes", "FLOPs", "GB/s", "TF/s", "% peak", "Bound"}, out, table.concat(footer, "\n"))
end

--- Declared-cost coverage of a profile: the fraction of the roofline time
-- (per op call: as roofline_table by op; GPU: every kernel) spent in calls
-- whose op declared a cost. Returns percent, covered ms, total ms.
function Profile:cost_coverage(opts)
  opts = opts or {}
  local gpu = self:has_kernels()
  local rows = self:_handle():group{source = gpu and "gpu" or "ops", by = gpu and "name" or "op", phase = opts.phase,
                                    module = opts.module}
  local total, costed = 0, 0
  for _, r in ipairs(rows) do total, costed = total + (r.roof_ms or 0), costed + (r.cost_ms or 0) end
  return total > 0 and 100 * costed / total or 0, costed, total
end

--- Time per module path and phase. opts: depth (keep N path components),
-- rollup (numbered children as "*": "layers.*"), phase, module (glob), top
-- (40), sort ("total" or "path").
function Profile:module_table(opts)
  opts = check_opts("module_table", opts)
  local rows, gpu = self:modules(opts)
  if opts.sort == "path" then
    table.sort(rows, function(a, b) return natural_less(a.key, b.key) end)
  elseif opts.sort ~= nil and opts.sort ~= "total" then
    error(("ember.profile.module_table: expected sort to be \"total\" or \"path\", got %s"):format(tostring(opts.sort)), 2)
  end
  local what = gpu and "GPU kernel time" or "host self time of ops"
  local shape = {}
  if opts.depth and opts.depth > 0 then shape[#shape + 1] = "depth " .. opts.depth end
  if opts.rollup then shape[#shape + 1] = "numbered children rolled up" end
  local title = ("Modules%s (%s%s): %s"):format(filter_text(opts), what,
    #shape > 0 and ", " .. table.concat(shape, ", ") or "", self.label)
  -- GPU rows: kernel time; op rows: self time (inclusive times would count nested ops twice)
  local function time(r) return gpu and r.total_ms or r.self_ms end
  if opts.sort ~= "path" then table.sort(rows, function(a, b) return time(a) > time(b) end) end
  local total = 0
  for _, r in ipairs(rows) do total = total + time(r) end
  local out, top = {}, opts.top or 40
  for i = 1, math.min(top, #rows) do
    local r = rows[i]
    out[#out + 1] = {module_name(r.key), ms(r.forward_ms or 0), ms(r.backward_ms or 0), ms(r.optimizer_ms or 0),
                     ms(r.none_ms or 0), ms(time(r)), pct(total > 0 and 100 * time(r) / total or 0)}
  end
  local headers = {"Module", "Forward ms", "Backward ms", "Optimizer ms", "Other ms", "Total ms", "%"}
  return render(title, headers, out, ("%d of %d modules"):format(#out, #rows))
end

--- Launches per phase and per step, GPU busy %, host dispatch per op.
function Profile:summary()
  local s = self:stats()
  local lines = {("Summary: %s"):format(self.label)}
  local function add(k, v) lines[#lines + 1] = ("  %-22s %s"):format(k, v) end
  add("wall window", ("%.3f ms (start to stop%s)"):format(s.wall_ms,
    self.backend == "host" and "" or ", device synchronised at both"))
  if s.gpu_busy_ms then
    add("GPU busy", ("%.3f ms = %s of the window; sum of kernel durations %.3f ms, copies %.3f ms")
      :format(s.gpu_busy_ms, pct(s.gpu_busy_pct), s.kernel_ms, s.copy_ms))
    add("kernels", ("%d (+ %d memcpy, %d memset)%s"):format(s.kernels, s.memcpys, s.memsets,
      s.graph_kernels > 0 and ("; %d from graph replays, %d with capture-time context")
        :format(s.graph_kernels, s.graph_kernels_attributed) or ""))
  elseif s.op_device_ms then
    add("device time in ops", ("%.3f ms (CUDA events around top-level ops)"):format(s.op_device_ms))
  end
  if s.steps then add("steps", ("%d (%s)"):format(s.steps, s.steps_how)) end
  for _, name in ipairs({"forward", "backward", "optimizer"}) do
    local ph = s.phases[name]
    if ph.count > 0 or ph.kernels > 0 then
      local k = self.backend == "cupti"
        and ("%d kernels (%.1f per step), %.3f ms of kernels; "):format(ph.kernels,
          ph.kernels / (s.steps or 1), ph.kernel_ms) or ""
      add(name, ("%s%d interval(s), %.3f ms wall"):format(k, ph.count, ph.wall_ms))
    end
  end
  if self.backend == "cupti" and s.steps then
    add("kernels per step", ("%.1f"):format(s.kernels / s.steps))
  end
  -- on CUDA tensors this is dispatch cost (kernels run asynchronously); on CPU tensors it is the compute
  add("host time per op", ("%s µs on average over %d top-level ops (%.3f ms in ops; %d op calls in all)")
    :format(us(s.host_us_per_op), s.top_ops, s.top_op_ms, s.ops))
  if s.ranges > 0 or s.marks > 0 then add("user ranges", ("%d ranges, %d marks"):format(s.ranges, s.marks)) end
  if s.dropped > 0 then add("DROPPED", ("%d records lost (buffers full): totals are low"):format(s.dropped)) end
  return table.concat(lines, "\n")
end

--- Print the summary and the tables. opts: top (kernel and op tables).
function Profile:print(opts)
  opts = opts or {}
  print(self:summary())
  print()
  if self.backend == "cupti" then
    print(self:kernel_table{top = opts.top})
    print()
  end
  print(self:op_table{top = opts.top})
  print()
  print(self:roofline_table{top = opts.top, peaks = opts.peaks})
  print()
  print(self:module_table{depth = opts.depth or 3, rollup = opts.rollup ~= false})
end

--- Everything as JSON (string); with a path, also written there.
function Profile:to_json(path)
  local cjson = require "cjson"
  local doc = {tool = "ember", backend = self.backend, label = self.label, reason = self.reason,
               stats = self:stats(), kernels = self:kernels(), ops = self:ops(), modules = (self:modules())}
  local s = cjson.encode(doc)
  if path ~= nil then
    if type(path) ~= "string" then error("ember.profile.to_json: expected a path string or nil, got " .. type(path), 2) end
    local f, err = io.open(path, "w")
    if not f then error("ember.profile.to_json: cannot open " .. path .. ": " .. tostring(err), 2) end
    f:write(s, "\n")
    f:close()
  end
  return s
end

--- Chrome trace-event JSON (Perfetto, chrome://tracing); returns bytes written.
function Profile:export_chrome_trace(path)
  if type(path) ~= "string" then
    error("ember.profile.export_chrome_trace: expected a path string, got " .. type(path), 2)
  end
  return self:_handle():write_chrome_trace(path)
end

--- Free the records now (the GC does it otherwise).
function Profile:close()
  if self._c then self._c:close() self._c = nil end
end
Profile.__close = Profile.close

function Profile:__tostring()
  return ("ember.Profile(%s: %d ops, %d kernels, %.3f ms)"):format(self.backend, self._stats.ops,
    self._stats.kernels, self._stats.wall_ms)
end

M.Profile = Profile
return M
