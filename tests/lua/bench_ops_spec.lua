-- bench_ops_spec.lua — scripts/bench_ops.lua, the op registry's perf mode,
-- run as a user runs it: the entry list, one real measurement on the CPU with
-- its JSON line and Markdown table, and bad options refused by name.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local cjson = require "cjson"

local SCRIPT = "scripts/bench_ops.lua"

describe("scripts/bench_ops.lua", function()
  after_each(H.remove_temps)

  it("--list names every perf entry of the registry with its dtype", function()
    local out, err, status = H.ember({"run", SCRIPT, "--list"})
    assert.are.equal(0, status, err)
    assert.truthy(out:find("flash_attention%s+f32%s+flash_attention causal %(1,4,256,64%)"))
    assert.truthy(out:find("softmax%s+f32%s+softmax over the last dim"))
    assert.is_nil(("\n" .. out):find("\n%S+%s+bf16%s"), "the CPU times f32 unless --dtype asks for more")
    assert.truthy(out:find("to%s+f32%s+cast bf16 %-> f32"))
  end)

  it("--match keeps the entries whose name contains the text, as plain text", function()
    local out, err, status = H.ember({"run", SCRIPT, "--list", "--match", "last dim (4096"})
    assert.are.equal(0, status, err)
    assert.truthy(out:find("sum%s+f32%s+sum over the last dim %(4096,4096%)"))
    assert.truthy(out:find("logsumexp%s+f32%s+logsumexp over the last dim %(4096,4096%)"))
    assert.is_nil(out:find("sum over all"), "not a match")
    assert.is_nil(out:find("(2048,8192)", 1, true), "softmax's last dim is (2048,8192)")
  end)

  it("times an op: the header, a table row, DIR/ops.jsonl and DIR/ops.md", function()
    local dir = H.tmpdir()
    local out, err, status = H.ember({"run", SCRIPT, "--op", "transpose,view", "--reps", "2", "--warmup", "0",
                                      "--out", dir})
    assert.are.equal(0, status, err)
    assert.truthy(out:find("^device: cpu"))
    assert.truthy(out:find("\ncommit: "))
    assert.truthy(out:find("| transpose | transpose of (4096,4096) (a view: host time only) | f32 | ", 1, true))
    local recs = {}
    for line in H.slurp(dir .. "/ops.jsonl"):gmatch("[^\n]+") do recs[#recs + 1] = cjson.decode(line) end
    assert.are.equal(2, #recs)
    for _, r in ipairs(recs) do
      assert.is_true(r.fwd_ms > 0, r.op)
      assert.are.equal("f32", r.dtype)
      assert.are.equal(0, r.bytes, "a view moves no bytes")
      assert.is_nil(r.error)
    end
    assert.truthy(H.slurp(dir .. "/ops.md"):find("| op | case | dtype | fwd ms |", 1, true))
  end)

  it("reports TF/s from the FLOPs an entry counts", function()
    local dir = H.tmpdir()
    local _, err, status = H.ember({"run", SCRIPT, "--op", "flash_attention", "--reps", "1", "--warmup", "0",
                                    "--no-backward", "--json", dir .. "/r.jsonl"})
    assert.are.equal(0, status, err)
    local r = cjson.decode(H.slurp(dir .. "/r.jsonl"))
    assert.are.equal(4 * 1 * 4 * 256 * 256 * 64 / 2, r.flops)
    assert.near(r.flops / (r.fwd_ms * 1e-3) / 1e12, r.tflops, 1e-9)
    assert.is_nil(r.fwd_bwd_ms, "--no-backward")
  end)

  it("--peak-each holds each row to a copy (or read) timed right after it", function()
    local dir = H.tmpdir()
    local out, err, status = H.ember({"run", SCRIPT, "--op", "neg,sum", "--match", "(4096,4096)", "--reps", "2",
                                      "--warmup", "0", "--no-backward", "--stream-mb", "8", "--peak-each",
                                      "--json", dir .. "/r.jsonl"})
    assert.are.equal(0, status, err)
    local recs = {}
    for line in H.slurp(dir .. "/r.jsonl"):gmatch("[^\n]+") do recs[#recs + 1] = cjson.decode(line) end
    assert.is_true(#recs >= 2)
    local kinds = {}
    for _, r in ipairs(recs) do
      assert.is_true(r.peak_each, r.case)
      assert.is_true(r.peak_gbs > 0, r.case)
      assert.near(r.gbs / r.peak_gbs, r.peak_fraction, 1e-9)
      kinds[r.op] = r.peak_kind
      assert.truthy(out:find(("%%d+%%%% %sof %%d+ |"):format(r.peak_kind == "read" and "%(read%) " or "")), out)
    end
    assert.are.equal("copy", kinds.neg)
    assert.are.equal("read", kinds.sum)
    local _, err2, status2 = H.ember({"run", SCRIPT, "--op", "neg", "--peak-each", "--stream-mb", "0"})
    assert.are_not.equal(0, status2)
    assert.truthy(err2:find("--peak-each: needs --device cpu, no --peak-gbs and --stream-mb > 0", 1, true), err2)
  end)

  it("refuses an unknown op, a bad device and bad reps, naming them", function()
    local _, err, status = H.ember({"run", SCRIPT, "--op", "nope"})
    assert.are_not.equal(0, status)
    assert.truthy(err:find("--op: no perf entry for nope (entries: ", 1, true), err)
    _, err, status = H.ember({"run", SCRIPT, "--device", "tpu"})
    assert.are_not.equal(0, status)
    assert.truthy(err:find("--device: expected cpu or cuda[:N], got tpu", 1, true), err)
    _, err, status = H.ember({"run", SCRIPT, "--reps", "0", "--op", "view"})
    assert.are_not.equal(0, status)
    assert.truthy(err:find("--reps: expected an integer >= 1, got 0", 1, true), err)
  end)
end)
