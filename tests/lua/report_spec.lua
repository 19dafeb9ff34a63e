-- report_spec.lua — ember.report (Markdown, CSV, JSON lines, records) and
-- its SVG line plots (ember.svgplot), checked on their text.
--
-- Run from the repository root:  EMBER_BUILD=$PWD/build bash tests/run_all.sh
local report = require "ember.report"
local cjson = require "cjson"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local tmpfile, slurp, spit = os.tmpname, H.slurp, H.spit

local function count(s, pattern)
  local n = 0
  for _ in s:gmatch(pattern) do n = n + 1 end
  return n
end

-- Checks that the SVG is well-formed enough for any XML parser: every tag
-- closed in order, no stray < or unescaped & in text. Returns the tag names.
local function check_xml(svg)
  local stack, names = {}, {}
  local pos = 1
  while true do
    local s, e, tag = svg:find("<([^>]*)>", pos)
    local text = svg:sub(pos, (s or #svg + 1) - 1)
    assert(not text:find("<", 1, true), "stray < in text")
    for amp in text:gmatch("&[^;]*;?") do
      assert(amp:match("^&[%w#]+;$"), "unescaped & in text: " .. amp)
    end
    if not s then break end
    if tag:sub(1, 1) == "/" then
      local name = tag:match("^/([%w:-]+)")
      assert.equals(stack[#stack], name, "closing tag out of order")
      stack[#stack] = nil
    elseif tag:sub(1, 1) ~= "?" then
      local name = tag:match("^([%w:-]+)")
      assert(name, "bad tag <" .. tag .. ">")
      names[#names + 1] = name
      for v in tag:gmatch('[%w:-]+="([^"]*)"') do
        assert(not v:find("[<>]"), "unescaped < or > in an attribute")
      end
      if tag:sub(-1) ~= "/" then stack[#stack + 1] = name end
    end
    pos = e + 1
  end
  assert.equals(0, #stack, "unclosed tags: " .. table.concat(stack, ", "))
  return names
end

describe("ember.report.format_value", function()
  it("prints integers whole, floats to 4 significant figures, large numbers without decimals", function()
    assert.equals("128", report.format_value(128))
    assert.equals("128", report.format_value(128.0))
    assert.equals("12.35", report.format_value(12.3456))
    assert.equals("0.4123", report.format_value(0.41234))
    assert.equals("1616", report.format_value(1616.07))
    assert.equals("1.5e-05", report.format_value(1.5e-5))
  end)

  it("prints missing values (nil, JSON null) as empty and strings as they are", function()
    assert.equals("", report.format_value(nil))
    assert.equals("", report.format_value(cjson.null))
    assert.equals("OOM", report.format_value("OOM"))
    assert.equals("true", report.format_value(true))
    assert.equals("nan", report.format_value(0 / 0))
  end)
end)

describe("ember.report.text_table", function()
  it("pads preformatted cells to the widest in each column (multi-byte aware)", function()
    local t = report.text_table({"d", "fwd ms"}, {{"16", "8.71 ± 0.03"}, {"128", "OOM"}})
    assert.are.equal(table.concat({
      "| d   | fwd ms      |",
      "| --- | ----------- |",
      "| 16  | 8.71 ± 0.03 |",
      "| 128 | OOM         |"}, "\n"), t)
  end)
end)

describe("ember.report.markdown_table", function()
  local cols = {"model", {key = "ms", title = "ms/step", fmt = "%.2f"}, "status"}
  local rows = {
    {model = "small", ms = 12.3456, status = "ok"},
    {model = "xl", ms = "OOM", status = "OOM"},
    {model = "a|b", status = "crash"},
  }

  it("has a header, an alignment rule and one line per row", function()
    local md = report.markdown_table(cols, rows)
    local lines = {}
    for l in md:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equals(5, #lines)
    assert.matches("^| model +| ms/step +| status +|$", lines[1])
    assert.equals("| :---- | ------: | :----- |", lines[2])
    assert.equals("| small |   12.35 | ok     |", lines[3])
  end)

  it("prints OOM as it is, leaves missing cells blank and escapes pipes", function()
    local md = report.markdown_table(cols, rows)
    assert.truthy(md:find("| xl    |     OOM | OOM    |", 1, true))
    assert.truthy(md:find("| a\\|b  |         | crash  |", 1, true))
  end)

  it("right-aligns columns whose values are mostly numbers", function()
    local md = report.markdown_table({"n", "name"}, {{n = 1, name = "x"}, {n = 1000.25, name = "y"}})
    assert.equals("|    n | name |\n| ---: | :--- |\n|    1 | x    |\n| 1000 | y    |\n", md)
  end)

  it("computes derived columns with value(row)", function()
    local md = report.markdown_table({{title = "GiB", value = function(r) return r.bytes / 2 ^ 30 end, fmt = "%.1f"}},
      {{bytes = 3 * 2 ^ 30}})
    assert.truthy(md:find("| 3.0 |", 1, true))
  end)

  it("rejects a column that is neither a key nor a spec, naming it", function()
    local ok, err = pcall(report.markdown_table, {"a", 42}, {})
    assert.is_false(ok)
    assert.matches("column 2: expected a key string or {key=, title=, fmt=}, got number", err)
  end)
end)

describe("ember.report CSV", function()
  it("quotes fields with commas, quotes and newlines (RFC 4180) and ends lines with CRLF", function()
    local csv = report.csv({"a", "b", "c"}, {{a = 'say "hi"', b = "x,y", c = "two\nlines"}, {a = 1.5}})
    assert.equals('a,b,c\r\n"say ""hi""","x,y","two\nlines"\r\n1.5,,\r\n', csv)
  end)

  it("keeps full precision (no fmt) and uses keys as the header", function()
    local csv = report.csv({{key = "ms", title = "ms/step", fmt = "%.1f"}}, {{ms = 12.3456789}})
    assert.equals("ms\r\n12.3456789\r\n", csv)
  end)

  it("write_csv writes the same text to a file", function()
    local path = tmpfile()
    report.write_csv(path, {"k"}, {{k = "v"}})
    assert.equals("k\r\nv\r\n", slurp(path))
    os.remove(path)
  end)
end)

describe("ember.report JSON lines", function()
  it("round-trips records, integers staying integers", function()
    local path = tmpfile()
    os.remove(path)
    report.append_jsonl(path, {a = 128, b = 1.5, s = "x", list = {1, 2}, nested = {k = "v"}})
    report.append_jsonl(path, {a = 2})
    local recs, problems = report.read_jsonl(path)
    assert.equals(2, #recs)
    assert.equals(0, #problems)
    assert.equals("integer", math.type(recs[1].a))
    assert.equals(1.5, recs[1].b)
    assert.same({1, 2}, recs[1].list)
    assert.equals("v", recs[1].nested.k)
    os.remove(path)
  end)

  it("skips a truncated last line and reports it instead of failing", function()
    local path = tmpfile()
    spit(path, '{"a":1}\n{"a":2}\n{"a":3, "b"')
    local recs, problems = report.read_jsonl(path)
    assert.equals(2, #recs)
    assert.equals(1, #problems)
    assert.matches(":3: truncated last line skipped", problems[1])
    os.remove(path)
  end)

  it("starts a new line after a truncated one, so the next record is readable", function()
    local path = tmpfile()
    spit(path, '{"a":1}\n{"a":')
    report.append_jsonl(path, {a = 3})
    local recs, problems = report.read_jsonl(path)
    assert.equals(2, #recs)
    assert.equals(3, recs[2].a)
    assert.equals(1, #problems)
    os.remove(path)
  end)

  it("writes NaN and infinities as strings (JSON has none)", function()
    local path = tmpfile()
    os.remove(path)
    report.append_jsonl(path, {x = 0 / 0, y = math.huge})
    local recs = report.read_jsonl(path)
    assert.equals("nan", recs[1].x)
    assert.equals("inf", recs[1].y)
    os.remove(path)
  end)

  it("returns nil and a message for a file that is not there", function()
    local recs, err = report.read_jsonl("/nonexistent/dir/x.jsonl")
    assert.is_nil(recs)
    assert.matches("cannot open /nonexistent/dir/x.jsonl", err)
  end)
end)

describe("ember.report.record", function()
  it("merges runinfo facts, results and config into one flat record", function()
    local rec = report.record({model = "xl", opts = {lr = 1e-3}}, {mean_ms = 3.5, samples = {1, 2}}, "cpu")
    for _, k in ipairs({"commit", "device", "date", "ember", "host"}) do
      assert.is_string(rec[k], k)
    end
    assert.matches("^cpu", rec.device)
    assert.equals("xl", rec.model)
    assert.equals(1e-3, rec["opts.lr"])
    assert.equals(3.5, rec.mean_ms)
    assert.same({1, 2}, rec.samples)
  end)

  it("lets results override runinfo and config override results", function()
    local rec = report.record({status = "from config"}, {status = "from results", device = "GPU X"}, "cpu")
    assert.equals("from config", rec.status)
    assert.equals("GPU X", rec.device)
  end)
end)

describe("ember.report.svg_lines", function()
  local rows = {}
  for _, m in ipairs({"small", "xl"}) do
    for _, c in ipairs({128, 256, 512, 1024}) do
      local r = {model = m, context = c, ms = c / 100 * (m == "xl" and 5 or 1), status = "ok", mode = "fwd"}
      if m == "xl" and c == 1024 then r.ms, r.status = nil, "OOM" end
      rows[#rows + 1] = r
    end
  end

  it("is well-formed SVG with a point per numeric value and the series in the legend", function()
    local svg = report.svg_lines{rows = rows, x = "context", y = "ms", series = "model", xlog = true,
      ylog = true, title = "ms <per> step & more", xlabel = "context", ylabel = "ms"}
    local names = check_xml(svg)
    assert.equals("svg", names[1])
    assert.matches('^<svg xmlns="http://www.w3.org/2000/svg"', svg)
    assert.equals(7, count(svg, '<circle class="pt"'))
    assert.equals(4, count(svg, 'data%-series="small"'))
    assert.truthy(svg:find(">small<", 1, true))
    assert.truthy(svg:find("ms &lt;per&gt; step &amp; more", 1, true))
  end)

  it("marks a missing point (OOM) in the legend and at its x, and breaks no line through it", function()
    local svg = report.svg_lines{rows = rows, x = "context", y = "ms", series = "model", xlog = true}
    assert.truthy(svg:find("xl (OOM: 1)", 1, true))
    assert.equals(1, count(svg, 'class="missing"'))
    assert.equals(2, count(svg, '<polyline class="line"'))
  end)

  it("draws a gap where a value is missing between present ones", function()
    local r = {{x = 1, y = 1}, {x = 2, y = "crash", status = "crash"}, {x = 3, y = 3}, {x = 4, y = 4}}
    local svg = report.svg_lines{rows = r, x = "x", y = "y"}
    assert.equals(1, count(svg, '<polyline class="line"'))   -- 3-4 only; 1 is alone
    assert.equals(3, count(svg, '<circle class="pt"'))
    assert.truthy(svg:find("(crash: 1)", 1, true))
  end)

  it("draws one panel per facet value", function()
    local more = {}
    for _, r in ipairs(rows) do
      more[#more + 1] = r
      local t = {}
      for k, v in pairs(r) do t[k] = v end
      t.mode = "train"
      more[#more + 1] = t
    end
    local svg = report.svg_lines{rows = more, x = "context", y = "ms", series = "model", facet = "mode"}
    check_xml(svg)
    assert.equals(2, count(svg, '<g class="panel">'))
    assert.truthy(svg:find(">mode=fwd<", 1, true))
    assert.truthy(svg:find(">mode=train<", 1, true))
  end)

  it("uses a categorical axis for string x values and survives no data at all", function()
    local svg = report.svg_lines{rows = rows, x = "model", y = "ms", series = "context"}
    check_xml(svg)
    assert.truthy(svg:find('text%-anchor="middle">small</text>'))
    local empty = report.svg_lines{rows = {}, x = "a", y = "b"}
    check_xml(empty)
    assert.truthy(empty:find("no data", 1, true))
  end)

  it("rejects options without x or y, saying what it expected", function()
    local ok, err = pcall(report.svg_lines, {rows = {}, x = "a"})
    assert.is_false(ok)
    assert.matches("opts.y: expected a key %(string%) or a function of a row, got nil", err)
  end)
end)
