--- ember.svgplot: line plots as self-contained SVG text (no fonts, scripts or
-- libraries to fetch), so a sweep's plots open in any browser and render on
-- GitHub next to its results.md.
--
--   svgplot.lines{rows = records, x = "context", y = "mean_ms", series = "model",
--                 facet = "mode", xlog = true, ylog = true, title = "ms per step"}
--
-- x and y are keys of the rows or functions of a row. Rows whose y is not a
-- number (nil, "OOM", an error) are not drawn: the line has a gap there, a
-- cross marks the x at the panel's top edge, and the legend counts them by
-- the row's `status` ("xl (OOM: 2)"). x values that are not numbers make a
-- categorical axis in order of appearance. `facet` (a key or a list of keys)
-- draws one panel per value, sharing axes unless share = false.
local M = {}

local PALETTE = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                 "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}
local DASHES = {"", "6,3", "2,2", "8,3,2,3"}

local function esc(s)
  return (tostring(s):gsub("[&<>\"']", {["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;",
                                         ['"'] = "&quot;", ["'"] = "&apos;"}))
end

local function num(v)
  if type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge then return v end
  return nil
end

local function label_of(v)
  if math.type(v) == "float" and v == math.floor(v) and math.abs(v) < 1e15 then
    return ("%d"):format(v)
  end
  return tostring(v)
end

local function getter(k)
  if type(k) == "function" then return k end
  return function(row) return row[k] end
end

local function tick_label(v)
  if v == 0 then return "0" end
  local a = math.abs(v)
  if v == math.floor(v) and a < 1e6 then return ("%d"):format(v) end
  if a >= 1e-3 and a < 1e6 then return (("%.3f"):format(v):gsub("0+$", ""):gsub("%.$", "")) end
  return ("%.2g"):format(v)
end

-- ---------------------------------------------------------------------------
-- scales: a domain, ticks and a map from data to [0, 1]

local function nice_step(span, count)
  local raw = span / count
  local mag = 10 ^ math.floor(math.log(raw, 10))
  for _, m in ipairs({1, 2, 2.5, 5, 10}) do
    if raw <= m * mag then return m * mag end
  end
  return 10 * mag
end

local function linear_scale(lo, hi)
  if lo == hi then
    local pad = lo == 0 and 1 or math.abs(lo) * 0.1
    lo, hi = lo - pad, hi + pad
  end
  local step = nice_step(hi - lo, 5)
  lo, hi = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
  local ticks = {}
  for i = 0, math.floor((hi - lo) / step + 0.5) do ticks[#ticks + 1] = lo + i * step end
  return {lo = lo, hi = hi, ticks = ticks, map = function(v) return (v - lo) / (hi - lo) end}
end

-- Log axes tick at 1-2-5 per decade when that gives a handful, else at
-- decades; a few distinct data values (context 128, 256, ...) tick themselves.
local function log_scale(lo, hi, values)
  local llo, lhi = math.log(lo, 10), math.log(hi, 10)
  if lhi - llo < 1e-9 then llo, lhi = llo - 0.3, lhi + 0.3 end
  local pad = (lhi - llo) * 0.05
  llo, lhi = llo - pad, lhi + pad
  local ticks = {}
  if values and #values >= 2 and #values <= 12 then
    ticks = values
  else
    for _, mult in ipairs((lhi - llo) <= 2.5 and {1, 2, 5} or {1}) do
      for e = math.floor(llo), math.ceil(lhi) do
        local t = mult * 10 ^ e
        local lt = math.log(t, 10)
        if lt >= llo - 1e-9 and lt <= lhi + 1e-9 then ticks[#ticks + 1] = t end
      end
    end
    table.sort(ticks)
    if #ticks > 10 then
      local thin = {}
      for i = 1, #ticks, math.ceil(#ticks / 8) do thin[#thin + 1] = ticks[i] end
      ticks = thin
    end
  end
  return {lo = 10 ^ llo, hi = 10 ^ lhi, ticks = ticks,
          map = function(v) return (math.log(v, 10) - llo) / (lhi - llo) end}
end

local function categorical_scale(cats)
  local n = #cats
  local ticks, index = {}, {}
  for i, c in ipairs(cats) do ticks[i], index[c] = i, i end
  return {ticks = ticks, labels = cats, index = index,
          map = function(v) return n == 1 and 0.5 or (v - 1) / (n - 1) * 0.9 + 0.05 end}
end

-- ---------------------------------------------------------------------------
-- data: rows -> panels -> series -> points

local function facet_key(row, keys)
  local parts = {}
  for i, k in ipairs(keys) do parts[i] = k .. "=" .. label_of(row[k]) end
  return table.concat(parts, ", ")
end

local function collect(opts)
  local gx, gy = getter(opts.x), getter(opts.y)
  local gs = opts.series and getter(opts.series) or function() return nil end
  local facets = opts.facet
  if type(facets) == "string" then facets = {facets} end
  local data = {panels = {}, series = {}, series_index = {}, xcats = {}, xcat_index = {},
                categorical = false, missing = {}}
  local panel_index = {}
  -- x is categorical if any present x value is not a number
  for _, row in ipairs(opts.rows) do
    local xv = gx(row)
    if xv ~= nil and not num(xv) and type(xv) ~= "userdata" then data.categorical = true end
  end
  for _, row in ipairs(opts.rows) do
    local pname = facets and facet_key(row, facets) or ""
    local panel = panel_index[pname]
    if not panel then
      panel = {name = pname, points = {}, missing = {}}
      panel_index[pname] = panel
      data.panels[#data.panels + 1] = panel
    end
    local s = gs(row)
    s = s == nil and (opts.series and "(none)" or (type(opts.y) == "string" and opts.y or "y")) or label_of(s)
    if not data.series_index[s] then
      data.series[#data.series + 1] = s
      data.series_index[s] = #data.series
    end
    local xv, yv = gx(row), gy(row)
    if data.categorical and xv ~= nil then
      xv = label_of(xv)
      if not data.xcat_index[xv] then
        data.xcats[#data.xcats + 1] = xv
        data.xcat_index[xv] = #data.xcats
      end
      xv = data.xcat_index[xv]
    else
      xv = num(xv)
      if xv and opts.xlog and xv <= 0 then xv = nil end
    end
    local y = num(yv)
    if y and opts.ylog and y <= 0 then y = nil end
    if xv and y then
      panel.points[#panel.points + 1] = {s = s, x = xv, y = y}
    else
      -- why the point is absent: the row's status, else the value itself
      local why = row.status
      if why == nil or why == "ok" then why = type(yv) == "string" and yv or "no value" end
      why = tostring(why)
      data.missing[s] = data.missing[s] or {}
      data.missing[s][why] = (data.missing[s][why] or 0) + 1
      if xv then panel.missing[#panel.missing + 1] = {s = s, x = xv, why = why} end
    end
  end
  return data
end

local function range_of(points, field)
  local lo, hi = math.huge, -math.huge
  for _, p in ipairs(points) do
    lo, hi = math.min(lo, p[field]), math.max(hi, p[field])
  end
  return lo, hi
end

local function distinct(points, field)
  local seen, out = {}, {}
  for _, p in ipairs(points) do
    if not seen[p[field]] then seen[p[field]] = true out[#out + 1] = p[field] end
  end
  table.sort(out)
  return out
end

local function make_scales(data, points, xmissing, opts)
  local xs
  if data.categorical then
    xs = categorical_scale(data.xcats)
  else
    local all = table.move(points, 1, #points, 1, {})
    for _, m in ipairs(xmissing) do all[#all + 1] = m end
    if #all == 0 then return nil end
    local lo, hi = range_of(all, "x")
    xs = opts.xlog and log_scale(lo, hi, distinct(all, "x")) or linear_scale(lo, hi)
  end
  if #points == 0 then return xs, nil end
  local lo, hi = range_of(points, "y")
  local ys = opts.ylog and log_scale(lo, hi) or linear_scale(lo, hi)
  return xs, ys
end

-- ---------------------------------------------------------------------------
-- drawing

local function f1(v) return ("%.1f"):format(v) end

local function style_of(i)
  local colour = PALETTE[(i - 1) % #PALETTE + 1]
  local dash = DASHES[((i - 1) // #PALETTE) % #DASHES + 1]
  return colour, dash
end

local function draw_panel(out, panel, data, xs, ys, box, opts)
  local x0, y0, w, h = box.x, box.y, box.w, box.h
  out[#out + 1] = ('<g class="panel"><rect x="%s" y="%s" width="%s" height="%s" fill="white" ' ..
    'stroke="#444"/>'):format(f1(x0), f1(y0), f1(w), f1(h))
  if panel.name ~= "" then
    out[#out + 1] = ('<text x="%s" y="%s" text-anchor="middle" font-weight="bold">%s</text>')
      :format(f1(x0 + w / 2), f1(y0 - 8), esc(panel.name))
  end
  if not xs or not ys then
    out[#out + 1] = ('<text x="%s" y="%s" text-anchor="middle" fill="#888">no data</text>')
      :format(f1(x0 + w / 2), f1(y0 + h / 2))
  end
  local function px(v) return x0 + xs.map(v) * w end
  local function py(v) return y0 + h - ys.map(v) * h end
  if xs then
    for i, t in ipairs(xs.ticks) do
      local X = px(t)
      out[#out + 1] = ('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#ddd"/>')
        :format(f1(X), f1(y0), f1(X), f1(y0 + h))
      out[#out + 1] = ('<text class="tick" x="%s" y="%s" text-anchor="middle">%s</text>')
        :format(f1(X), f1(y0 + h + 15), esc(xs.labels and xs.labels[i] or tick_label(t)))
    end
  end
  if ys then
    for _, t in ipairs(ys.ticks) do
      local Y = py(t)
      out[#out + 1] = ('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#ddd"/>')
        :format(f1(x0), f1(Y), f1(x0 + w), f1(Y))
      out[#out + 1] = ('<text class="tick" x="%s" y="%s" text-anchor="end">%s</text>')
        :format(f1(x0 - 5), f1(Y + 4), esc(tick_label(t)))
    end
  end
  if not xs or not ys then
    out[#out + 1] = "</g>"
    return
  end
  -- one polyline per run of consecutive present points: a missing y breaks it
  for si, s in ipairs(data.series) do
    local colour, dash = style_of(si)
    local pts = {}
    for _, p in ipairs(panel.points) do if p.s == s then pts[#pts + 1] = p end end
    for _, m in ipairs(panel.missing) do if m.s == s then pts[#pts + 1] = {x = m.x, gap = true} end end
    table.sort(pts, function(a, b) return a.x < b.x end)
    local run = {}
    local function flush()
      if #run >= 2 then
        out[#out + 1] = ('<polyline class="line" fill="none" stroke="%s" stroke-width="1.8"%s ' ..
          'points="%s"/>'):format(colour, dash ~= "" and (' stroke-dasharray="' .. dash .. '"') or "",
          table.concat(run, " "))
      end
      run = {}
    end
    for _, p in ipairs(pts) do
      if p.gap then flush() else run[#run + 1] = f1(px(p.x)) .. "," .. f1(py(p.y)) end
    end
    flush()
    for _, p in ipairs(pts) do
      if not p.gap then
        local xl = xs.labels and xs.labels[p.x] or tick_label(p.x)
        out[#out + 1] = ('<circle class="pt" data-series="%s" cx="%s" cy="%s" r="3" fill="%s">' ..
          '<title>%s: %s = %s, %s</title></circle>'):format(esc(s), f1(px(p.x)), f1(py(p.y)), colour,
          esc(s), esc(type(opts.x) == "string" and opts.x or "x"), esc(xl), esc(("%.4g"):format(p.y)))
      end
    end
  end
  for _, m in ipairs(panel.missing) do
    local colour = style_of(data.series_index[m.s])
    out[#out + 1] = ('<text class="missing" x="%s" y="%s" text-anchor="middle" fill="%s" ' ..
      'font-weight="bold">×<title>%s: %s</title></text>'):format(f1(px(m.x)), f1(y0 + 12), colour,
      esc(m.s), esc(m.why))
  end
  out[#out + 1] = "</g>"
end

local function legend_label(s, missing)
  if not missing then return s end
  local whys = {}
  for why in pairs(missing) do whys[#whys + 1] = why end
  table.sort(whys)
  for i, why in ipairs(whys) do whys[i] = why .. ": " .. missing[why] end
  return s .. " (" .. table.concat(whys, ", ") .. ")"
end

local function check(opts)
  if type(opts) ~= "table" then
    error("ember.svgplot.lines: expected an options table, got " .. type(opts), 3)
  end
  if type(opts.rows) ~= "table" then
    error("ember.svgplot.lines: opts.rows: expected a list of rows, got " .. type(opts.rows), 3)
  end
  for _, k in ipairs({"x", "y"}) do
    local t = type(opts[k])
    if t ~= "string" and t ~= "function" then
      error(("ember.svgplot.lines: opts.%s: expected a key (string) or a function of a row, got %s")
        :format(k, t), 3)
    end
  end
end

--- A self-contained SVG document (a string) of lines, one per series.
function M.lines(opts)
  check(opts)
  local data = collect(opts)
  if #data.panels == 0 then data.panels[1] = {name = "", points = {}, missing = {}} end
  local npanel = #data.panels
  local ncols = opts.panels_per_row or (npanel == 4 and 2 or math.min(npanel, 3))
  local nrows = math.ceil(npanel / ncols)
  local labels, longest = {}, 0
  for i, s in ipairs(data.series) do
    labels[i] = legend_label(s, data.missing[s])
    longest = math.max(longest, utf8.len(labels[i]) or #labels[i])
  end
  local note = next(data.missing) and "× = no value there" or nil
  if note then longest = math.max(longest, utf8.len(note) - 4) end
  local legend_w = 40 + 7 * longest
  if type(opts.series) == "string" then legend_w = math.max(legend_w, 24 + 9 * #opts.series) end
  legend_w = math.min(360, legend_w)
  local title_h = opts.title and 34 or 10
  local pw = opts.width and (opts.width - legend_w) / ncols or (npanel > 1 and 380 or 560)
  local ph = opts.height and (opts.height - title_h) / nrows or (npanel > 1 and 300 or 380)
  local W, H = ncols * pw + legend_w, nrows * ph + title_h
  local m = {l = 62, r = 14, t = npanel > 1 and 26 or 12, b = 46}

  -- shared scales: every panel's points at once
  local all, allmiss = {}, {}
  for _, p in ipairs(data.panels) do
    for _, q in ipairs(p.points) do all[#all + 1] = q end
    for _, q in ipairs(p.missing) do allmiss[#allmiss + 1] = q end
  end
  local shared_x, shared_y = make_scales(data, all, allmiss, opts)

  local out = {('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" ' ..
    'font-family="sans-serif" font-size="12">'):format(W, H, W, H)}
  out[#out + 1] = ('<rect width="%d" height="%d" fill="white"/>'):format(W, H)
  if opts.title then
    out[#out + 1] = ('<text x="%s" y="22" text-anchor="middle" font-size="16" font-weight="bold">%s</text>')
      :format(f1((W - legend_w) / 2), esc(opts.title))
  end
  local xlabel = opts.xlabel or (type(opts.x) == "string" and opts.x or "x")
  local ylabel = opts.ylabel or (type(opts.y) == "string" and opts.y or "y")
  if opts.xlog and not data.categorical then xlabel = xlabel .. " (log scale)" end
  if opts.ylog then ylabel = ylabel .. " (log scale)" end
  for i, panel in ipairs(data.panels) do
    local col, row = (i - 1) % ncols, (i - 1) // ncols
    local box = {x = col * pw + m.l, y = title_h + row * ph + m.t, w = pw - m.l - m.r, h = ph - m.t - m.b}
    local xs, ys = shared_x, shared_y
    if opts.share == false then xs, ys = make_scales(data, panel.points, panel.missing, opts) end
    draw_panel(out, panel, data, xs, ys, box, opts)
    out[#out + 1] = ('<text x="%s" y="%s" text-anchor="middle">%s</text>')
      :format(f1(box.x + box.w / 2), f1(box.y + box.h + 34), esc(xlabel))
    out[#out + 1] = ('<text x="%s" y="%s" text-anchor="middle" transform="rotate(-90 %s %s)">%s</text>')
      :format(f1(box.x - 46), f1(box.y + box.h / 2), f1(box.x - 46), f1(box.y + box.h / 2), esc(ylabel))
  end
  -- legend: a line sample per series; absent points counted by reason
  local lx, ly = ncols * pw + 8, title_h + m.t + 4
  out[#out + 1] = '<g class="legend">'
  if type(opts.series) == "string" then
    out[#out + 1] = ('<text x="%s" y="%s" font-weight="bold">%s</text>'):format(f1(lx), f1(ly + 4), esc(opts.series))
    ly = ly + 20
  end
  for i, s in ipairs(data.series) do
    local colour, dash = style_of(i)
    local y = ly + (i - 1) * 18
    out[#out + 1] = ('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2"%s/>')
      :format(f1(lx), f1(y), f1(lx + 22), f1(y), colour, dash ~= "" and (' stroke-dasharray="' .. dash .. '"') or "")
    out[#out + 1] = ('<text class="series" x="%s" y="%s">%s</text>'):format(f1(lx + 28), f1(y + 4), esc(labels[i]))
  end
  if note then
    out[#out + 1] = ('<text x="%s" y="%s" fill="#555">%s</text>')
      :format(f1(lx), f1(ly + #data.series * 18 + 6), note)
  end
  out[#out + 1] = "</g>"
  out[#out + 1] = "</svg>"
  return table.concat(out, "\n") .. "\n"
end

return M
