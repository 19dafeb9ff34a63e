-- ddp_spec.lua — ember.nn.parallel.DDP without a second process: option
-- errors (checked before ember.dist is needed) and the bucket plan of the
-- "bucketed" strategy. Training on 2 and 3 ranks is tests/dist/ddp_spec.lua.
--
-- Run from the repository root (after building into build):
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" \
--   LUA_CPATH="build/lua/?.so;;" busted tests/lua/ddp_spec.lua

local ember = require "ember"
local nn = ember.nn

local function errmsg(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

local function f32(n) return ember.zeros(n) end                          -- 4 bytes an element
local function names_of(buckets, params)
  local idx = {}
  for i, p in ipairs(params) do idx[p] = i end
  local out = {}
  for b, bucket in ipairs(buckets) do
    local ids = {}
    for j, p in ipairs(bucket.params) do ids[j] = tostring(idx[p]) end
    out[b] = table.concat(ids, ",")
  end
  return table.concat(out, " | ")
end

describe("ember.nn.parallel.DDP options", function()
  local model = nn.Linear(2, 2)

  it("names the strategies it expects and the one it got", function()
    local err = errmsg(nn.parallel.DDP, model, {strategy = "zero3"})
    assert.truthy(err:find('ember.nn.parallel.DDP: expected strategy "naive", "flat", "overlap" or ' ..
      '"bucketed"', 1, true), err)
    assert.truthy(err:find('got "zero3"', 1, true), err)
    err = errmsg(nn.parallel.DDP, model, {strategy = 3})
    assert.truthy(err:find("got number", 1, true), err)
  end)

  it("rejects unknown options, naming the known ones", function()
    local err = errmsg(nn.parallel.DDP, model, {strategy = "flat", bucket_cap_mb = 25})
    assert.truthy(err:find("unknown option 'bucket_cap_mb' (expected strategy, bucket_mb, first_bucket_mb)",
      1, true), err)
  end)

  it("wants positive bucket sizes", function()
    for _, v in ipairs({0, -1, "25", 0 / 0}) do
      local err = errmsg(nn.parallel.DDP, model, {strategy = "bucketed", bucket_mb = v})
      assert.truthy(err:find("expected bucket_mb to be a positive number of MiB, got " .. tostring(v),
        1, true), err)
    end
    local err = errmsg(nn.parallel.DDP, model, {first_bucket_mb = -2})
    assert.truthy(err:find("expected first_bucket_mb to be a positive number of MiB, got -2", 1, true), err)
  end)

  it("wants a module and an options table", function()
    assert.truthy(errmsg(nn.parallel.DDP, {}, {}):find("expected an nn.Module, got table", 1, true))
    assert.truthy(errmsg(nn.parallel.DDP, model, "naive"):find(
      "expected an options table {strategy=, bucket_mb=}, got string", 1, true))
  end)

  it("says to initialise ember.dist first", function()
    if ember.dist.is_initialized() then return end
    local err = errmsg(nn.parallel.DDP, model, {strategy = "naive"})
    assert.truthy(err:find("call ember.dist.init() first", 1, true), err)
  end)
end)

describe("bucketed strategy: the bucket plan", function()
  local plan = require("ember.ddp_bucketed").plan

  it("fills buckets in reverse registration order up to the cap", function()
    -- 40 B each; cap 100 B: two fit, a third would not
    local ps = {f32(10), f32(10), f32(10), f32(10), f32(10)}
    assert.are.equal("5,4 | 3,2 | 1", names_of(plan(ps, 100, 100), ps))
  end)

  it("starts with a smaller first bucket", function()
    local ps = {f32(10), f32(10), f32(10), f32(10), f32(10)}
    assert.are.equal("5 | 4,3 | 2,1", names_of(plan(ps, 100, 40), ps))
  end)

  it("gives a parameter larger than the cap a bucket of its own", function()
    local ps = {f32(2), f32(1000), f32(2), f32(2)}
    assert.are.equal("4,3 | 2 | 1", names_of(plan(ps, 64, 64), ps))
    -- a cap smaller than every parameter: one bucket each
    assert.are.equal("4 | 3 | 2 | 1", names_of(plan(ps, 1, 1), ps))
  end)

  it("closes a bucket that reached its cap exactly", function()
    local ps = {f32(5), f32(5), f32(5)}
    assert.are.equal("3,2 | 1", names_of(plan(ps, 40, 40), ps))
  end)

  it("starts a new bucket when the dtype changes", function()
    local ps = {f32(2), ember.zeros(2, {dtype = "f64"}), f32(2)}
    local b = plan(ps, 1e6, 1e6)
    assert.are.equal("3 | 2 | 1", names_of(b, ps))
    assert.are.same({"f32", "f64", "f32"}, {b[1].dtype, b[2].dtype, b[3].dtype})
    assert.are.same({8, 16, 8}, {b[1].bytes, b[2].bytes, b[3].bytes})
  end)
end)
