-- bf16_table_spec.lua (GPU) — issue 12: bf16 gelu and gelu tanh (gelu_tab) and the plain
-- binary_cross_entropy_with_logits forward (bce_fwd_tab) read a per-block
-- table of the same device function's results by the bits of x instead of
-- evaluating erff / log1pf(expf) per element. bf16 has 65536 values, so
-- running both over every one of them proves the tables change no bit:
--  * against the kernels they replaced, in a child process with the tables
--    off (EMBER_GELU_TAB=0 EMBER_BCE_LPTAB=0): every output bit, the sums'
--    and means' included (same grid, same partials);
--  * against the unaligned paths in this process (a view one element in:
--    ew_contig's scalar loop, bce's V = 1 kernel), which compute per element.
local ember = require "ember"
local F = ember.nn.functional
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local R = dofile(here .. "bf16_table_ref.lua")

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

-- equal texts, or the first differing element named
local function same_text(what, got, want)
  if got == want then return end
  local g, w, i = {}, {}, 1
  for v in got:gmatch("%S+") do g[#g + 1] = v end
  for v in want:gmatch("%S+") do w[#w + 1] = v end
  while i <= #g and g[i] == w[i] do i = i + 1 end
  error(("%s: element %d (bf16 bits 0x%04x when over all values) is %s, expected %s (%d vs %d elements)")
    :format(what, i, (i - 1) % 65536, tostring(g[i]), tostring(w[i]), #g, #w), 2)
end

describe("bf16 tables (gelu_tab, bce_fwd_tab) on CUDA", function()
  it("give the table-less kernels' bits for every bf16 value", function()
    local exe = (os.getenv("EMBER_BUILD") or "./build") .. "/ember"
    local pipe = io.popen("EMBER_GELU_TAB=0 EMBER_BCE_LPTAB=0 EMBER_BF16_TABLE_PRINT=1 " .. exe .. " run " .. here ..
      "bf16_table_ref.lua 2>&1")
    local out = pipe:read("a")
    pipe:close()
    local want = {}
    for name, text in out:gmatch("([^\n:]+): ([^\n]*)") do want[name] = text end
    local n = 0
    for _, c in ipairs(R.cases("cuda")) do
      assert.is_not_nil(want[c[1]], "the child run printed no '" .. c[1] .. "': " .. out:sub(1, 400))
      same_text(c[1], c[2](), want[c[1]])
      n = n + 1
    end
    assert.are.equal(7, n)
  end)

  it("agree with the per-element (unaligned) paths for every bf16 value", function()
    local x = R.all_bf16()
    ember.manual_seed(5)
    local y = ember.rand({65536}):to("bf16")
    -- one element in: the data pointer is 2 bytes past 16-byte alignment
    local function off(t) return ember.cat({t:narrow(0, 0, 1), t}):cuda():narrow(0, 1, 65536) end
    local xa, ya, xu, yu = x:cuda(), y:cuda(), off(x), off(y)
    same_text("gelu aligned vs unaligned", R.text(xa:gelu()), R.text(xu:gelu()))
    same_text("gelu tanh aligned vs unaligned", R.text(F.gelu(xa, {approximate = "tanh"})),
      R.text(F.gelu(xu, {approximate = "tanh"})))
    same_text("bce none aligned vs unaligned",
      R.text(F.binary_cross_entropy_with_logits(xa, ya, {reduction = "none"})),
      R.text(F.binary_cross_entropy_with_logits(xu, yu, {reduction = "none"})))
    same_text("bce none aligned vs unaligned y", R.text(F.binary_cross_entropy_with_logits(xa, ya, {reduction = "none"})),
      R.text(F.binary_cross_entropy_with_logits(xa, yu, {reduction = "none"})))
  end)
end)
