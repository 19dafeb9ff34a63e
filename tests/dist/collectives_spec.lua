-- Every collective and dtype against a reference each rank computes locally
-- (every rank knows what every other rank contributed), sync and async forms,
-- list forms, argument errors, the order check and the counters. CPU tensors
-- over MPI here; tests/gpu/dist (make test-dist-gpu) runs the CUDA side.
local T = dofile("tests/dist/harness.lua")
local ember = require "ember"
local dist = ember.dist
local R, W = T.rank, T.world
local DEVICE = os.getenv("EMBER_DIST_DEVICE") or "cpu"

-- rank r's value at element i: small integers, exact in every dtype (bf16 too)
local function value(r, i, dtype)
  if dtype == "bool" then return (r + i) % 3 == 0 and 1 or 0 end
  if dtype == "u8" or dtype == "u16" then return (r * 7 + i * 3) % 13 end
  return ((r * 7 + i * 3) % 13) - 6
end

local function input(r, n, dtype)
  local v = {}
  for i = 1, n do v[i] = value(r, i, dtype) end
  return ember.tensor(v, {dtype = "f64"}):to({dtype = dtype, device = DEVICE})
end

local function reduce_ref(n, dtype, op)
  local out = {}
  for i = 1, n do
    local acc
    for r = 0, W - 1 do
      local x = value(r, i, dtype)
      if acc == nil then acc = x
      elseif op == "sum" or op == "avg" then acc = acc + x
      elseif op == "max" then acc = math.max(acc, x)
      else acc = math.min(acc, x) end
    end
    if op == "avg" then acc = acc / W end
    if dtype == "bool" then acc = acc ~= 0 and 1 or 0 end
    out[i] = acc
  end
  return ember.tensor(out, {dtype = "f64"})
end

local FLOATS = {"f32", "f64", "bf16", "f16"}
local ALL = {"f32", "f64", "bf16", "f16", "i32", "i64", "u8", "u16", "bool"}
if DEVICE ~= "cpu" then ALL = {"f32", "f64", "bf16", "f16", "i32", "i64", "u8"} end

local function is_float(dt) for _, f in ipairs(FLOATS) do if f == dt then return true end end return false end
-- avg of small integers in 16-bit floats rounds once: bf16 keeps 8 bits
local function tol(dt, op) return op == "avg" and (dt == "bf16" and 0.02 or dt == "f16" and 2e-3 or 1e-6) or 0 end

T.case("rank, world_size, local_rank and EMBER_RANK agree", function()
  assert(W >= 1)
  assert(R >= 0 and R < W)
  assert(dist.local_rank() == R, "one host: local rank " .. dist.local_rank() .. " ~= rank " .. R)
  assert(tonumber(os.getenv("EMBER_RANK")) == R, "EMBER_RANK " .. tostring(os.getenv("EMBER_RANK")))
  assert(tonumber(os.getenv("EMBER_WORLD_SIZE")) == W)
  assert(dist.is_initialized())
end)

for _, dt in ipairs(ALL) do
  for _, op in ipairs({"sum", "avg", "max", "min"}) do
    if (op ~= "avg" or is_float(dt)) and not (dt == "bool" and op == "avg") then
      T.case(("all_reduce %s %s"):format(op, dt), function()
        local n = 37
        local t = input(R, n, dt)
        local same = dist.all_reduce(t, {op = op})
        assert(same == t, "all_reduce returns its tensor")
        T.close(t, reduce_ref(n, dt, op), tol(dt, op), "all_reduce " .. op .. " " .. dt)
      end)
    end
  end
end

T.case("all_reduce avg on an integer tensor is refused", function()
  T.raises(function() dist.all_reduce(input(R, 4, "i32"), {op = "avg"}) end, "avg")
end)

T.case("async all_reduce: wait, is_completed, several in flight", function()
  local ts, ws = {}, {}
  for k = 1, 4 do
    ts[k] = input(R, 1000 + k, "f32")
    ws[k] = dist.all_reduce(ts[k], {async = true})
  end
  for k = 4, 1, -1 do
    assert(ws[k]:wait() == ws[k])
    assert(ws[k]:is_completed() == true)
    T.close(ts[k], reduce_ref(1000 + k, "f32", "sum"), 0, "async " .. k)
  end
end)

for _, dt in ipairs(ALL) do
  T.case("broadcast from every rank, " .. dt, function()
    for src = 0, W - 1 do
      local t = input(R, 11, dt)
      dist.broadcast(t, {src = src})
      T.close(t, input(src, 11, dt), 0, "broadcast src " .. src)
    end
  end)
end

T.case("async broadcast", function()
  local t = input(R, 64, "f64")
  local w = dist.broadcast(t, {src = W - 1, async = true})
  w:wait()
  T.close(t, input(W - 1, 64, "f64"), 0)
end)

for _, dt in ipairs(ALL) do
  T.case("all_gather into a flat tensor, " .. dt, function()
    local n = 9
    local out = ember.zeros({W * n}, {dtype = dt, device = DEVICE})
    dist.all_gather(out, input(R, n, dt))
    for r = 0, W - 1 do T.close(out:narrow(0, r * n, n), input(r, n, dt), 0, "slot " .. r) end
  end)
end

T.case("all_gather into a list, sync and async; in place at this rank's slot", function()
  local list = {}
  for r = 1, W do list[r] = ember.zeros({2, 3}, {device = DEVICE}) end
  local t = input(R, 6, "f32"):view(2, 3)
  dist.all_gather(list, t)
  for r = 0, W - 1 do T.close(list[r + 1], input(r, 6, "f32"), 0, "list " .. r) end
  for r = 1, W do list[r]:zero_() end
  local w = dist.all_gather(list, t, {async = true})
  w:wait()
  assert(w:is_completed())
  for r = 0, W - 1 do T.close(list[r + 1], input(r, 6, "f32"), 0, "async list " .. r) end
  -- t is a view of out at this rank's slot (what ZeRO's flat buffers do)
  local out = ember.zeros({W * 5}, {device = DEVICE})
  local mine = out:narrow(0, R * 5, 5)
  mine:copy_(input(R, 5, "f32"))
  dist.all_gather(out, mine)
  for r = 0, W - 1 do T.close(out:narrow(0, r * 5, 5), input(r, 5, "f32"), 0, "in place " .. r) end
end)

for _, dt in ipairs({"f32", "f64", "bf16", "i64"}) do
  for _, op in ipairs({"sum", "max", "min", "avg"}) do
    if op ~= "avg" or is_float(dt) then
      T.case(("reduce_scatter %s %s"):format(op, dt), function()
        local n = 5
        local out = ember.zeros({n}, {dtype = dt, device = DEVICE})
        dist.reduce_scatter(out, input(R, W * n, dt), {op = op})
        local full = reduce_ref(W * n, dt, op)
        T.close(out, full:narrow(0, R * n, n), tol(dt, op), "reduce_scatter")
      end)
    end
  end
end

T.case("reduce_scatter from a list, async, and with out inside t", function()
  local n = 4
  local parts = {}
  local full = input(R, W * n, "f32")
  for r = 1, W do parts[r] = full:narrow(0, (r - 1) * n, n):clone() end
  local out = ember.zeros({n}, {device = DEVICE})
  local w = dist.reduce_scatter(out, parts, {async = true})
  w:wait()
  T.close(out, reduce_ref(W * n, "f32", "sum"):narrow(0, R * n, n), 0, "list")
  local t = input(R, W * n, "f32")
  local inside = t:narrow(0, R * n, n)
  dist.reduce_scatter(inside, t)
  T.close(inside, reduce_ref(W * n, "f32", "sum"):narrow(0, R * n, n), 0, "in place")
end)

-- A world of 1 (NCCL on a single-GPU host) has no peer and no mismatch to find.
if W >= 2 then
T.case("send/recv around a ring", function()
  local nxt, prev = (R + 1) % W, (R - 1) % W
  local got = ember.zeros({8}, {device = DEVICE})
  -- even ranks send first: no two blocking sends face each other
  if R % 2 == 0 then
    dist.send(input(R, 8, "f32"), nxt)
    dist.recv(got, prev)
  else
    dist.recv(got, prev)
    dist.send(input(R, 8, "f32"), nxt)
  end
  T.close(got, input(prev, 8, "f32"), 0, "ring")
end)
end

T.case("barrier", function()
  dist.barrier()
  dist.barrier()
end)

T.case("argument errors name the collective and what was expected", function()
  local t = ember.zeros({4, 4}, {device = DEVICE})
  T.raises(function() dist.all_reduce(t:transpose(0, 1)) end, "dist.all_reduce: expected t to be contiguous")
  T.raises(function() dist.all_reduce(t, {op = "prod"}) end, 'expected op "sum", "avg", "max" or "min", got "prod"')
  T.raises(function() dist.all_reduce(t, {opp = "sum"}) end, "unknown option 'opp'")
  T.raises(function() dist.all_reduce({}) end, "expected t to be a tensor, got table")
  T.raises(function() dist.broadcast(t, {src = W}) end, ("expected src in [0, %d), got %d"):format(W, W))
  T.raises(function() dist.all_gather(ember.zeros({3}), ember.zeros({2})) end,
           ("expected out to have world_size (%d) x 2 = %d elements, got 3"):format(W, 2 * W))
  T.raises(function() dist.all_gather(ember.zeros({2 * W}, {dtype = "f64"}), ember.zeros({2})) end,
           "expected out to have t's dtype f32, got f64")
  T.raises(function() dist.reduce_scatter(ember.zeros({2}), ember.zeros({2 * W + 1})) end,
           "dist.reduce_scatter: expected t to have world_size")
  local short = {}
  for i = 1, W + 1 do short[i] = ember.zeros(2) end
  T.raises(function() dist.all_gather(short, ember.zeros(2)) end,
           ("expected out to hold world_size (%d) tensors, got %d"):format(W, W + 1))
  T.raises(function() dist.send(t, R) end, "cannot send to this rank itself")
  T.raises(function() dist.init() end, "already initialized")
end)

if W >= 2 then
T.case("order check: a size mismatch names the ranks and call sites", function()
  local cpu_check = dist.check_enabled()
  assert(cpu_check == true, "the order check is on by default for CPU tensors")
  local n = R == W - 1 and 3 or 4
  local err = T.raises(function() dist.all_reduce(ember.zeros({n})) end, "collective mismatch")
  assert(err:find(("rank %d called all_reduce(f32, 3 elements"):format(W - 1), 1, true), err)
  assert(err:find("rank 0 called all_reduce(f32, 4 elements", 1, true), err)
  assert(err:find("collectives_spec.lua:", 1, true), "names the call site: " .. err)
end)

T.case("order check: different collectives at the same step", function()
  local err = T.raises(function()
    if R == 0 then dist.broadcast(ember.zeros({4}), {src = 0}) else dist.all_reduce(ember.zeros({4})) end
  end, "collective mismatch")
  assert(err:find("broadcast", 1, true) and err:find("all_reduce", 1, true), err)
end)
end

T.case("counters: calls and payload bytes per collective", function()
  dist.reset_stats()
  dist.all_reduce(ember.zeros({10}))
  dist.all_reduce(ember.zeros({6}, {dtype = "f64"}))
  dist.broadcast(ember.zeros({3}))
  local s = dist.stats()
  assert(s.all_reduce.calls == 2 and s.all_reduce.bytes == 10 * 4 + 6 * 8,
         ("all_reduce %d calls %d bytes"):format(s.all_reduce.calls, s.all_reduce.bytes))
  assert(s.broadcast.calls == 1 and s.broadcast.bytes == 12)
  assert(s.all_gather.calls == 0)
end)

T.case("empty tensors and 0-d tensors", function()
  dist.all_reduce(ember.zeros({0}))
  local s = ember.tensor(R + 1.0)
  dist.all_reduce(s)
  assert(s:item() == W * (W + 1) / 2)
end)

T.done()
