--- memviz: one self-contained HTML page from an Ember memory snapshot (JSON,
-- from ember.memory.snapshot("x.json")): the active-memory timeline stacked
-- by category (or by module), the reserved memory of the caching allocator,
-- the phases (forward / backward / optimizer) under it, the largest
-- allocations with their call sites, and the peak bytes of every module path
-- and phase.
--
--   ember run scripts/memviz.lua step.json -o step.html
--   ember run scripts/memviz.lua step.json -o step.html --by module --depth 2 --top 30
--
-- Why it scales: the trace is read a line at a time (the JSON keeps one
-- event per line) and folded into --buckets time buckets by event index; each
-- bucket keeps the stack at the moment its total was highest, so the page has
-- a few thousand points per series whatever the trace length (a million
-- events make a page of a few hundred KB). The x axis counts events, as
-- PyTorch's memory_viz does: bursts of allocations get room, idle time none.
-- Memory that was allocated before recording began (live blocks without an
-- allocation in the trace, frees of unknown blocks) is a constant baseline.
local argparse = require "argparse"
local cjson = require "cjson"

local parser = argparse("memviz.lua", "HTML active-memory timeline of an Ember memory snapshot (JSON).")
parser:argument("snapshot", "Snapshot written by ember.memory.snapshot(\"x.json\").")
parser:option("-o --output", "HTML file to write.", "memviz.html")
parser:option("--by", "Stack the timeline by category or by module.", "category"):choices({"category", "module"})
parser:option("--depth", "Module path components that name a series with --by module.", "1")
  :convert(math.tointeger)
parser:option("--top", "Rows of the largest-allocations and module tables.", "20"):convert(math.tointeger)
parser:option("--device", "Device to plot (cpu, cuda:N); default: the first GPU with events, else cpu.")
parser:option("--buckets", "Time buckets of the timeline.", "1500"):convert(math.tointeger)
local args = parser:parse(arg)
if not args.depth or args.depth < 1 then parser:error("--depth must be a positive integer") end
if not args.top or args.top < 1 then parser:error("--top must be a positive integer") end
if not args.buckets or args.buckets < 10 then parser:error("--buckets must be an integer >= 10") end

local fmt = string.format
local tonumber = tonumber

-- ---------------------------------------------------------------------------
-- reading the snapshot

-- Header (everything before the trace) and an iterator over trace rows.
-- Ember writes the trace one row a line after a line `"trace":[`; any other
-- layout of the same JSON (re-indented by a tool) is decoded whole.
local function open_snapshot(path)
  local f, err = io.open(path, "rb")
  if not f then error("memviz: cannot open " .. tostring(err), 0) end
  local head = {}
  for line in f:lines() do
    if line == '"trace":[' then
      local ok, doc = pcall(cjson.decode, table.concat(head, "\n") .. '"trace":[]}')
      if ok and type(doc) == "table" then
        local function rows()
          for l in f:lines() do
            if l:sub(1, 1) == "[" then return l end
          end
          f:close()
          return nil
        end
        return doc, rows, true
      end
      break
    end
    head[#head + 1] = line
  end
  f:seek("set", 0)
  local text = f:read("a")
  f:close()
  local ok, doc = pcall(cjson.decode, text)
  if not ok or type(doc) ~= "table" then error("memviz: " .. path .. " is not JSON: " .. tostring(doc), 0) end
  local i, trace = 0, doc.trace or {}
  return doc, function() i = i + 1 return trace[i] end, false
end

local doc, next_row, streamed = open_snapshot(args.snapshot)
if doc.format ~= "ember.memory_snapshot" then
  error("memviz: " .. args.snapshot .. " is not an Ember memory snapshot (no \"format\": " ..
    "\"ember.memory_snapshot\"); write one with ember.memory.snapshot(\"x.json\")", 0)
end
local strings = doc.strings or {}
local function str(i) i = tonumber(i) return i and i > 0 and strings[i + 1] or "" end

-- The device: the first GPU that appears in the segments or blocks, else cpu
-- (a streamed trace is read once, so this is decided from the header).
local device = args.device
if not device then
  device = "cpu"
  local found
  for _, s in ipairs(doc.segments or {}) do found = found or s.device end
  for _, b in ipairs(doc.blocks or {}) do if b.device ~= "cpu" then found = found or b.device end end
  device = found or "cpu"
end

-- ---------------------------------------------------------------------------
-- series

local CATEGORY_COLORS = {
  parameter = "#4e79a7", gradient = "#f28e2c", activation = "#59a14f", autograd = "#e15759",
  optimizer_state = "#af7aa1", workspace = "#9c755f", communication = "#ff9da7", other = "#bab0ab",
  unknown = "#d9d9d9",
}
local CATEGORY_ORDER = {"parameter", "optimizer_state", "gradient", "workspace", "communication", "other",
  "unknown", "activation", "autograd"}
local PALETTE = {"#4e79a7", "#f28e2c", "#e15759", "#76b7b2", "#59a14f", "#edc949", "#af7aa1", "#ff9da7",
  "#9c755f", "#86bcb6", "#d37295", "#b6992d", "#499894", "#8cd17d", "#fabfd2", "#79706e"}

local series_names, series_index = {}, {}
local function series(name)
  local s = series_index[name]
  if not s then
    s = #series_names + 1
    series_names[s] = name
    series_index[name] = s
  end
  return s
end
if args.by == "category" then for _, c in ipairs(CATEGORY_ORDER) do series(c) end end

local module_series = {}     -- module path -> series (by module)
local function series_of(category, module)
  if args.by == "category" then return series_index[category] or series("unknown") end
  local s = module_series[module]
  if not s then
    local parts = {}
    for p in (module or ""):gmatch("[^.]+") do
      if #parts >= args.depth then break end
      parts[#parts + 1] = p
    end
    s = series(#parts > 0 and table.concat(parts, ".") or "(no module)")
    module_series[module] = s
  end
  return s
end

-- ---------------------------------------------------------------------------
-- folding the trace

local n_events = math.tointeger((doc.history or {}).entries) or 0
if not streamed then n_events = #(doc.trace or {}) end
local B = math.max(1, math.min(args.buckets, n_events))
local cur, baseline = {}, {}                      -- per series: bytes relative to the start; before it
local bucket_vals = {}                            -- [bucket] = {per series bytes at the bucket's max}
local bucket_time, bucket_phase, bucket_reserved = {}, {}, {}
local total, reserved = 0, 0
local bmax, delta, touched = -math.huge, {}, {}
local phase_count = {}

local live_size, live_series, live_mp, live_top = {}, {}, {}, {}
local mp_key_of, mp_names, mp_cur, mp_peak, mp_count = {}, {}, {}, {}, {}
local top, top_min = {}, 0
local first_time

local function change(s, d)
  cur[s] = (cur[s] or 0) + d
  total = total + d
  if delta[s] == nil then touched[#touched + 1] = s; delta[s] = 0 end
  delta[s] = delta[s] + d
  if total > bmax then
    bmax = total
    for i = 1, #touched do delta[touched[i]] = nil; touched[i] = nil end
  end
end

local function close_bucket(b)
  local vals = {}
  for s = 1, #series_names do vals[s] = (cur[s] or 0) - (delta[s] or 0) end
  bucket_vals[b] = vals
  local best, bp = -1, "none"
  for p, c in pairs(phase_count) do if c > best then best, bp = c, p end end
  bucket_phase[b] = bp
  bucket_reserved[b] = reserved
  phase_count = {}
  bmax = total
  for i = 1, #touched do delta[touched[i]] = nil; touched[i] = nil end
end

local function add_top(entry)
  if #top >= args.top and entry.size <= top_min then return false end
  top[#top + 1] = entry
  table.sort(top, function(a, b) return a.size > b.size end)
  if #top > args.top then table.remove(top) end
  top_min = top[#top].size
  return true
end

-- A block seen for the first time at a free or a tag existed before the
-- trace: it belongs to the baseline (its free then takes it out of it).
local function preexisting(addr, size, s)
  baseline[s] = (baseline[s] or 0) + size
  live_size[addr], live_series[addr] = size, s
end

local idx, bucket = 0, 1
local edge = n_events // B                        -- the last event index of the current bucket
local last_t
local by_category = args.by == "category"
local top_n = args.top
local mp_of = {}                                  -- module string index -> phase -> module/phase key
local series_of_mod = {}                          -- module string index -> series (by module)

-- The module/phase row of an allocation (created on first sight).
local function mp_key(module, phase)
  local per = mp_of[module]
  if not per then per = {} mp_of[module] = per end
  local k = per[phase]
  if not k then
    k = #mp_names + 1
    per[phase], mp_names[k] = k, {str(module), phase}
    mp_cur[k], mp_peak[k], mp_count[k] = 0, 0, 0
  end
  return k
end

-- Hot path: a million calls. Strings stay strings (addresses are table keys
-- as read), numbers are converted only where arithmetic needs them.
local function fold(t, action, dev, addr, size, category, phase, op, module, site)
  idx = idx + 1
  while idx > edge and bucket < B do
    close_bucket(bucket)
    bucket = bucket + 1
    edge = bucket * n_events // B
  end
  if dev ~= device then return end
  last_t = t
  if not bucket_time[bucket] then
    bucket_time[bucket] = tonumber(t)
    first_time = first_time or bucket_time[bucket]
  end
  phase_count[phase] = (phase_count[phase] or 0) + 1
  if action == "alloc" then
    size = tonumber(size)
    local s
    if by_category then
      s = series_index[category] or series("unknown")
    else
      s = series_of_mod[module]
      if not s then s = series_of(category, str(module)) series_of_mod[module] = s end
    end
    live_size[addr], live_series[addr] = size, s
    local k = mp_key(module, phase)
    local c = mp_cur[k] + size
    mp_cur[k] = c
    mp_count[k] = mp_count[k] + 1
    if c > mp_peak[k] then mp_peak[k] = c end
    live_mp[addr] = k
    if size > top_min or #top < top_n then
      local e = {size = size, time = tonumber(t), category = category, phase = phase, op = str(op),
        module = str(module), site = str(site), event = idx}
      if add_top(e) then live_top[addr] = e end
    end
    change(s, size)
  elseif action == "free" then
    local sz = live_size[addr]
    if not sz then
      sz = tonumber(size)
      preexisting(addr, sz, series_of(category, ""))
    end
    change(live_series[addr], -sz)
    local k = live_mp[addr]
    if k then mp_cur[k] = mp_cur[k] - sz; live_mp[addr] = nil end
    local e = live_top[addr]
    if e then e.freed = tonumber(t); live_top[addr] = nil end
    live_size[addr], live_series[addr] = nil, nil
  elseif action == "tag" then
    size = tonumber(size)
    local s = by_category and series_of(category, "") or nil
    if not live_size[addr] then
      preexisting(addr, size, s or series_of("unknown", ""))
    elseif s and s ~= live_series[addr] then
      change(live_series[addr], -live_size[addr])
      change(s, live_size[addr])
      live_series[addr] = s
    end
    local e = live_top[addr]
    if e then e.category = category end
  elseif action == "segment_alloc" then
    reserved = reserved + tonumber(size)
  elseif action == "segment_free" then
    reserved = reserved - tonumber(size)
  end
end

local clock0 = os.clock()
if streamed then
  -- time, action, device, addr, size, (requested, stream), category, phase, op, module, call site
  local ROW = '^%[(%-?%d+),"([%a_]+)","([%w:]+)",(%d+),(%d+),%d+,%d+,"([%w_]+)","(%a+)",(%d+),(%d+),(%d+)%]'
  for line in next_row do
    local t, action, dev, addr, size, category, phase, op, module, site = line:match(ROW)
    if not t then error("memviz: cannot read trace row: " .. line:sub(1, 200), 0) end
    fold(t, action, dev, addr, size, category, phase, op, module, site)
  end
else
  for row in next_row do
    if type(row) == "table" and row[1] ~= nil then
      fold(fmt("%d", row[1]), row[2], row[3], fmt("%d", row[4]), row[5], row[8], row[9], fmt("%d", row[10]),
        fmt("%d", row[11]), fmt("%d", row[12]))
    elseif type(row) == "table" then    -- a snapshot() table re-encoded: named fields
      fold(row.time_ns, row.action, row.device, fmt("%d", row.addr), row.size, row.category, row.phase,
        0, 0, 0)
    end
  end
end
while bucket <= B do close_bucket(bucket); bucket = bucket + 1 end
local last_time = tonumber(last_t)

-- Live blocks at the end that the trace never allocated: there from the start.
local live_end_bytes = 0
for _, b in ipairs(doc.blocks or {}) do
  if b.device == device then
    local addr = fmt("%d", b.address)
    live_end_bytes = live_end_bytes + b.size
    if not live_size[addr] then
      local s = series_of(b.category, "")
      baseline[s] = (baseline[s] or 0) + b.size
    end
  end
end
local reserved_end = 0
for _, s in ipairs(doc.segments or {}) do
  if s.device == device then reserved_end = reserved_end + s.total_size end
end
local reserved0 = reserved_end - reserved    -- reserved memory when the trace began

-- ---------------------------------------------------------------------------
-- the page

local function bytes(n)
  local units = {"B", "KiB", "MiB", "GiB", "TiB"}
  local u = 1
  n = n or 0
  while math.abs(n) >= 1024 and u < #units do n = n / 1024; u = u + 1 end
  return u == 1 and fmt("%d B", math.floor(n)) or fmt("%.2f %s", n, units[u])
end
local function esc(s)
  return (tostring(s):gsub("[&<>\"]", {["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;"}))
end
local function ms(t) return t and first_time and fmt("%.3f ms", (t - first_time) / 1e6) or "" end

local nb = #bucket_vals
local ns = #series_names
-- absolute values per bucket and series; series ordered for stacking; small ones merged
local peak_of = {}
for s = 1, ns do
  local p = 0
  for b = 1, nb do
    local v = (bucket_vals[b][s] or 0) + (baseline[s] or 0)
    if v > p then p = v end
  end
  peak_of[s] = p
end
local order = {}
for s = 1, ns do if peak_of[s] > 0 then order[#order + 1] = s end end
local MAX_SERIES = 14
if args.by == "module" then
  table.sort(order, function(a, b) return peak_of[a] > peak_of[b] end)
end
local merged = {}
if #order > MAX_SERIES then
  for i = MAX_SERIES, #order do merged[#merged + 1] = order[i] end
  for i = #order, MAX_SERIES, -1 do order[i] = nil end
end
local shown = {}                                  -- {name, color, values[b]}
for i, s in ipairs(order) do
  local vals = {}
  for b = 1, nb do vals[b] = math.max(0, (bucket_vals[b][s] or 0) + (baseline[s] or 0)) end
  local name = series_names[s]
  shown[#shown + 1] = {name = name, color = args.by == "category" and CATEGORY_COLORS[name] or PALETTE[(i - 1) % #PALETTE + 1],
    vals = vals, peak = peak_of[s]}
end
if #merged > 0 then
  local vals, peak = {}, 0
  for b = 1, nb do
    local v = 0
    for _, s in ipairs(merged) do v = v + math.max(0, (bucket_vals[b][s] or 0) + (baseline[s] or 0)) end
    vals[b] = v
    if v > peak then peak = v end
  end
  shown[#shown + 1] = {name = fmt("(%d more)", #merged), color = "#79706e", vals = vals, peak = peak}
end

local totals, peak_total, peak_bucket = {}, 0, 1
for b = 1, nb do
  local t = 0
  for _, sh in ipairs(shown) do t = t + sh.vals[b] end
  totals[b] = t
  if t > peak_total then peak_total, peak_bucket = t, b end
end
local peak_reserved = 0
for b = 1, nb do
  bucket_reserved[b] = bucket_reserved[b] + reserved0
  if bucket_reserved[b] > peak_reserved then peak_reserved = bucket_reserved[b] end
end

local W, H, LEFT, TOP, PH = 1000, 360, 80, 10, 14
local ymax = math.max(peak_total, device ~= "cpu" and peak_reserved or 0, 1)
local function X(b) return LEFT + (b - 0.5) * W / math.max(nb, 1) end
local function Y(v) return TOP + H - v / ymax * H end

local svg = {}
local function add(s) svg[#svg + 1] = s end
add(fmt('<svg id="plot" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="100%%">',
  LEFT + W + 20, TOP + H + PH + 50))
-- grid and y axis
for i = 0, 4 do
  local v = ymax * i / 4
  add(fmt('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>', LEFT, Y(v), LEFT + W, Y(v)))
  add(fmt('<text x="%d" y="%.1f" class="ax" text-anchor="end">%s</text>', LEFT - 4, Y(v) + 4, bytes(v)))
end
-- stacked areas
local below = {}
for b = 1, nb do below[b] = 0 end
for _, sh in ipairs(shown) do
  local top_pts, bot_pts = {}, {}
  for b = 1, nb do
    top_pts[b] = fmt("%.1f,%.1f", X(b), Y(below[b] + sh.vals[b]))
    bot_pts[nb - b + 1] = fmt("%.1f,%.1f", X(b), Y(below[b]))
    below[b] = below[b] + sh.vals[b]
  end
  add(fmt('<polygon points="%s %s" fill="%s" stroke="none"><title>%s: peak %s</title></polygon>',
    table.concat(top_pts, " "), table.concat(bot_pts, " "), sh.color, esc(sh.name), bytes(sh.peak)))
end
if device ~= "cpu" and reserved_end > 0 then
  local pts = {}
  for b = 1, nb do pts[b] = fmt("%.1f,%.1f", X(b), Y(bucket_reserved[b])) end
  add(fmt('<polyline points="%s" fill="none" stroke="#333" stroke-dasharray="4 3" stroke-width="1">' ..
    '<title>reserved (segments)</title></polyline>', table.concat(pts, " ")))
end
-- phase strip: runs of the bucket's most frequent phase
local PHASE_COLORS = {forward = "#59a14f", backward = "#e15759", optimizer = "#af7aa1", none = "#eeeeee"}
local run_start = 1
for b = 1, nb + 1 do
  if b > nb or bucket_phase[b] ~= bucket_phase[run_start] then
    local p = bucket_phase[run_start]
    add(fmt('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"><title>%s</title></rect>',
      X(run_start) - W / nb / 2, TOP + H + 4, (b - run_start) * W / nb, PH - 4, PHASE_COLORS[p] or "#ccc", esc(p)))
    run_start = b
  end
end
-- x axis: events and time
for i = 0, 4 do
  local b = math.max(1, math.min(nb, math.floor(i * nb / 4 + 0.5)))
  local ev = math.floor((b - 1) * n_events / math.max(nb, 1))
  add(fmt('<text x="%.1f" y="%d" class="ax" text-anchor="%s">event %d%s</text>', X(b), TOP + H + PH + 16,
    i == 0 and "start" or i == 4 and "end" or "middle", ev, bucket_time[b] and (" · " .. ms(bucket_time[b])) or ""))
end
add(fmt('<rect id="hover" x="%d" y="%d" width="%d" height="%d" fill="transparent"/>', LEFT, TOP, W, H + PH))
add(fmt('<line id="cursor" x1="0" y1="%d" x2="0" y2="%d" stroke="#000" stroke-width="0.5" visibility="hidden"/>',
  TOP, TOP + H))
add("</svg>")

-- data for the hover read-out: per bucket totals, time and the stack
local js_series, js_vals = {}, {}
for i, sh in ipairs(shown) do
  js_series[i] = fmt("%q", sh.name)
  local v = {}
  for b = 1, nb do v[b] = fmt("%.0f", sh.vals[b]) end
  js_vals[i] = "[" .. table.concat(v, ",") .. "]"
end
local js_time, js_phase = {}, {}
for b = 1, nb do
  js_time[b] = bucket_time[b] and fmt("%.3f", (bucket_time[b] - first_time) / 1e6) or "null"
  js_phase[b] = fmt("%q", bucket_phase[b] or "none")
end

local legend = {}
for _, sh in ipairs(shown) do
  legend[#legend + 1] = fmt('<span class="key"><i style="background:%s"></i>%s <small>(peak %s)</small></span>',
    sh.color, esc(sh.name), bytes(sh.peak))
end

local top_rows = {}
for i, e in ipairs(top) do
  top_rows[#top_rows + 1] = fmt("<tr><td>%d</td><td class=r>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td>" ..
    "<td><code>%s</code></td><td class=r>%s</td><td class=r>%s</td></tr>", i, bytes(e.size), esc(e.op),
    esc(e.module ~= "" and e.module or "—"), esc(e.phase), esc(e.category), esc((e.site or ""):gsub("\n", " ← ")),
    ms(e.time), e.freed and ms(e.freed) or "live")
end

local mp_order = {}
for k = 1, #mp_names do mp_order[k] = k end
table.sort(mp_order, function(a, b) return mp_peak[a] > mp_peak[b] end)
local mp_rows = {}
for i = 1, math.min(#mp_order, args.top * 2) do
  local k = mp_order[i]
  mp_rows[#mp_rows + 1] = fmt("<tr><td>%s</td><td>%s</td><td class=r>%s</td><td class=r>%d</td></tr>",
    esc(mp_names[k][1] ~= "" and mp_names[k][1] or "(no module)"), esc(mp_names[k][2]), bytes(mp_peak[k]), mp_count[k])
end

local hist = doc.history or {}
local page = {fmt([[<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Memory timeline: %s</title>
<style>
body{font:14px system-ui,sans-serif;margin:20px;color:#222}
h1{font-size:20px} h2{font-size:16px;margin-top:28px}
.ax{font-size:11px;fill:#555}
.key{display:inline-block;margin:2px 12px 2px 0} .key i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px}
table{border-collapse:collapse;font-size:13px} td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:left}
.r{text-align:right} code{font-size:12px} #readout{font-family:monospace;font-size:12px;min-height:3.5em;white-space:pre}
</style></head><body>
<h1>Active memory on %s</h1>
<p>%s · %d events%s · %s · by %s<br>
peak active %s (at %s) · peak reserved %s · live at snapshot %s · read in %.1f s</p>
]], esc(args.snapshot), esc(device), esc(args.snapshot), n_events,
  (hist.dropped or 0) > 0 and fmt(" (%d older ones dropped)", hist.dropped) or "",
  first_time and fmt("%.3f ms recorded", (last_time - first_time) / 1e6) or "no events", args.by,
  bytes(peak_total), bucket_time[peak_bucket] and ms(bucket_time[peak_bucket]) or "-", bytes(peak_reserved),
  bytes(live_end_bytes), os.clock() - clock0)}
page[#page + 1] = "<div>" .. table.concat(legend) .. "</div>\n"
page[#page + 1] = table.concat(svg, "\n")
page[#page + 1] = [[
<div>phases: <span class="key"><i style="background:#59a14f"></i>forward</span><span class="key"><i style="background:#e15759"></i>backward</span><span class="key"><i style="background:#af7aa1"></i>optimizer</span><span class="key"><i style="background:#eee"></i>none</span> · dashed: reserved (segments)</div>
<div id="readout">hover the timeline</div>
]]
page[#page + 1] = fmt("<h2>Largest allocations</h2>\n<table><tr><th>#</th><th class=r>size</th><th>op</th><th>module</th>" ..
  "<th>phase</th><th>category</th><th>call site</th><th class=r>allocated</th><th class=r>freed</th></tr>\n%s</table>\n",
  table.concat(top_rows, "\n"))
page[#page + 1] = fmt("<h2>Peak by module and phase</h2>\n<p>Bytes allocated in the module's forward (or " ..
  "backward, optimizer) and alive at the same time, at their highest.</p>\n<table><tr><th>module</th><th>phase</th>" ..
  "<th class=r>peak</th><th class=r>allocations</th></tr>\n%s</table>\n", table.concat(mp_rows, "\n"))
page[#page + 1] = fmt([[
<script>
const S=[%s], V=[%s], T=[%s], P=[%s], N=%d, L=%d, W=%d;
function fmtB(n){const u=['B','KiB','MiB','GiB','TiB'];let i=0;while(n>=1024&&i<4){n/=1024;i++}return i?n.toFixed(2)+' '+u[i]:n+' B'}
const svg=document.getElementById('plot'), out=document.getElementById('readout'), cur=document.getElementById('cursor');
document.getElementById('hover').addEventListener('mousemove',e=>{
  const p=svg.createSVGPoint(); p.x=e.clientX; p.y=e.clientY;
  const q=p.matrixTransform(svg.getScreenCTM().inverse());
  const b=Math.max(0,Math.min(N-1,Math.floor((q.x-L)/W*N)));
  cur.setAttribute('x1',q.x); cur.setAttribute('x2',q.x); cur.setAttribute('visibility','visible');
  let t=0, lines=[];
  for(let i=S.length-1;i>=0;i--){t+=V[i][b]; if(V[i][b]>0) lines.push(S[i]+': '+fmtB(V[i][b]));}
  out.textContent='bucket '+b+(T[b]!==null?' · '+T[b]+' ms':'')+' · '+P[b]+' · total '+fmtB(t)+'\n'+lines.join(' · ');
});
</script>
</body></html>
]], table.concat(js_series, ","), table.concat(js_vals, ","), table.concat(js_time, ","),
  table.concat(js_phase, ","), nb, LEFT, W)

local f, err = io.open(args.output, "wb")
if not f then error("memviz: cannot write " .. tostring(err), 0) end
f:write(table.concat(page))
f:close()
print(fmt("memviz: %s -> %s (%d events, %s, peak active %s)", args.snapshot, args.output, n_events, device,
  bytes(peak_total)))
