-- ember.optim.ShardedOptimizer (ZeRO-1): the same steps and the same state as
-- the wrapped optimizer run unsharded.
-- Run: ember launch --nproc 2 tests/dist/zero_spec.lua (run_all.sh: 2 and 3 ranks).
--
-- Every rank computes the full-batch gradient itself (same seed, same data),
-- so the sharded run and the plain one see identical gradients; what differs
-- is only who updates which parameter and the broadcasts after. f64
-- parameters; RTOL 1e-7 as the brief's bound (in practice the two agree to the
-- last bit: the same kernel runs on the same numbers).
local T = dofile("tests/dist/harness.lua")
local ember = require "ember"
local nn, optim = ember.nn, ember.optim
local dist = ember.dist
if not dist.is_initialized() then dist.init() end

local RANK, WORLD = dist.rank(), dist.world_size()
local DEVICE = os.getenv("EMBER_DIST_DEVICE") or "cpu"   -- "cuda": make test-dist-gpu (NCCL)
local RTOL = 1e-7
local F64 = {dtype = "f64"}

-- |a - b| <= RTOL * |b| everywhere
local function assert_rel(a, b, what)
  local excess = ((a - b):abs() - b:abs() * RTOL):max():item()
  if not (excess <= 0) then
    error(("%s: relative difference above %g (by %g)"):format(what, RTOL, excess), 2)
  end
end

-- Parameters of different sizes, so the greedy split gives every rank some.
local Net = nn.Module:extend("Net")
function Net:__init()
  self.fc1 = nn.Linear(12, 24, F64)
  self.fc2 = nn.Linear(24, 16, F64)
  self.fc3 = nn.Linear(16, 4, F64)
  self.gain = nn.Parameter(ember.rand(4, F64):add(0.5))
end
function Net:forward(x) return self.fc3(self.fc2(self.fc1(x):tanh()):tanh()) * self.gain end

local function make_pair(seed)
  ember.manual_seed(seed)
  local a = Net():to(DEVICE)
  ember.manual_seed(seed)
  local b = Net():to(DEVICE)
  return a, b
end

local function backward(m, step)
  ember.manual_seed(500 + step)
  local x, y = ember.randn(8, 12, F64):to(DEVICE), ember.randn(8, 4, F64):to(DEVICE)
  local d = m(x) - y
  ;(d * d):mean():backward()
end

-- two groups: biases and the gain without weight decay
local function groups(m)
  local decay, no_decay = {}, {}
  for _, np in ipairs(m:named_parameters()) do
    if np[1]:match("weight$") then decay[#decay + 1] = np[2] else no_decay[#no_decay + 1] = np[2] end
  end
  return {{params = decay, weight_decay = 0.1}, {params = no_decay, weight_decay = 0}}
end

local function assert_same_state(sd, ref, what)
  assert(#sd.param_groups == #ref.param_groups, what .. ": group count")
  for gi, g in ipairs(ref.param_groups) do
    local h = sd.param_groups[gi]
    for k, v in pairs(g) do
      if type(v) == "table" then
        assert(#h[k] == #v, ("%s: group %d %s length"):format(what, gi, k))
        for i = 1, #v do
          assert(h[k][i] == v[i], ("%s: group %d %s[%d]: %s vs %s"):format(what, gi, k, i,
            tostring(h[k][i]), tostring(v[i])))
        end
      else
        assert(h[k] == v, ("%s: group %d %s: %s vs %s"):format(what, gi, k, tostring(h[k]), tostring(v)))
      end
    end
  end
  local n = 0
  for i, st in pairs(ref.state) do
    n = n + 1
    local s = sd.state[i]
    assert(s ~= nil, ("%s: no state for parameter %d"):format(what, i))
    for k, v in pairs(st) do
      if type(v) == "number" then
        assert(s[k] == v, ("%s: state[%d].%s: %s vs %s"):format(what, i, k, tostring(s[k]), tostring(v)))
      else
        assert_rel(s[k], v, ("%s: state[%d].%s"):format(what, i, k))
      end
    end
  end
  for i in pairs(sd.state) do n = n - 1; assert(ref.state[i] ~= nil, what .. ": extra state " .. i) end
  assert(n == 0, what .. ": state count")
end

T.case("ZeRO-1 + AdamW equals plain AdamW after 10 steps (two groups, an lr schedule)", function()
  local plain_m, zero_m = make_pair(7)
  local plain = optim.AdamW(groups(plain_m), {lr = 1e-2, betas = {0.9, 0.95}})
  local zero = optim.ShardedOptimizer(groups(zero_m), optim.AdamW, {lr = 1e-2, betas = {0.9, 0.95}})
  local lr = function(step) return 1e-2 * 0.8 ^ step end
  local s1, s2 = optim.LRScheduler(plain, lr), optim.LRScheduler(zero, lr)
  for step = 1, 10 do
    for _, c in ipairs({{plain_m, plain, s1}, {zero_m, zero, s2}}) do
      c[2]:zero_grad()
      backward(c[1], step)
      c[2]:step()
      c[3]:step()
    end
  end
  -- equal weights also say the schedule's lr reached the wrapped optimizer:
  -- with lr stuck at 1e-2 they would differ from step 2 on
  local a, b = zero_m:state_dict(), plain_m:state_dict()
  for name, t in pairs(b) do assert_rel(a[name], t, name) end
  assert(zero:get_lr() == plain:get_lr(), "param_groups lr")
end)

T.case("each rank holds the state of its shard only; shards cover every parameter once", function()
  local _, m = make_pair(7)
  local zero = optim.ShardedOptimizer(m:parameters(), optim.AdamW, {lr = 1e-3})
  backward(m, 1)
  zero:step()
  local params = m:parameters()
  local mine = ember.zeros(#params, {dtype = "f64", device = DEVICE})
  for i, p in ipairs(params) do
    local owned = zero:owner_of(p) == RANK
    assert((zero.optim.state[p] ~= nil) == owned,
      ("parameter %d: state present %s, owner %d, rank %d"):format(i, tostring(zero.optim.state[p] ~= nil),
        zero:owner_of(p), RANK))
    if owned then mine:narrow(0, i - 1, 1):fill_(1) end
  end
  dist.all_reduce(mine, {op = "sum"})
  for i, c in ipairs(mine:tolist()) do
    assert(c == 1, ("parameter %d is owned by %s ranks"):format(i, tostring(c)))
  end
  local mem = zero:memory_stats()
  local param_bytes = 0
  for _, p in ipairs(params) do param_bytes = param_bytes + p:numel() * p:element_size() end
  -- on CUDA AdamW's step counter is a 0-d f32 tensor per parameter (capturable)
  local want = 2 * param_bytes + (DEVICE == "cpu" and 0 or 4 * #params)
  assert(mem.unsharded == want,
    ("AdamW keeps exp_avg and exp_avg_sq: expected %d bytes unsharded, got %d"):format(want,
      mem.unsharded))
  -- greedy largest-first: no rank holds more than its share plus the largest parameter's state
  assert(mem.rank <= mem.unsharded / WORLD + 2 * 24 * 16 * 8,
    ("rank %d holds %d of %d bytes"):format(RANK, mem.rank, mem.unsharded))
  if WORLD > 1 then
    assert(mem.rank < mem.unsharded, "a sharded rank must hold less than the whole state")
  end
end)

T.case("state_dict gathers the full state: equal to the plain optimizer's; load round trip", function()
  local plain_m, zero_m = make_pair(11)
  local plain = optim.AdamW(groups(plain_m), {lr = 3e-3})
  local zero = optim.ShardedOptimizer(groups(zero_m), optim.AdamW, {lr = 3e-3})
  for step = 1, 3 do
    for _, c in ipairs({{plain_m, plain}, {zero_m, zero}}) do
      c[2]:zero_grad(); backward(c[1], step); c[2]:step()
    end
  end
  local ref = plain:state_dict()
  assert_same_state(zero:state_dict(), ref, "sharded state_dict")

  -- a fresh sharded optimizer loads the plain state and continues identically
  local _, m2 = make_pair(11)
  m2:load_state_dict(plain_m:state_dict())
  local zero2 = optim.ShardedOptimizer(groups(m2), optim.AdamW, {lr = 1})
  zero2:load_state_dict(ref)
  assert_same_state(zero2:state_dict(), ref, "after load_state_dict")
  for _, c in ipairs({{plain_m, plain}, {m2, zero2}}) do
    c[2]:zero_grad(); backward(c[1], 4); c[2]:step()
  end
  local a, b = m2:state_dict(), plain_m:state_dict()
  for name, t in pairs(b) do assert_rel(a[name], t, "step after load: " .. name) end
end)

T.case("any optimizer class: ZeRO-1 + SGD with momentum equals plain SGD", function()
  local plain_m, zero_m = make_pair(3)
  local plain = optim.SGD(plain_m:parameters(), {lr = 0.05, momentum = 0.9, weight_decay = 0.01})
  local zero = optim.ShardedOptimizer(zero_m:parameters(), optim.SGD,
    {lr = 0.05, momentum = 0.9, weight_decay = 0.01})
  for step = 1, 5 do
    for _, c in ipairs({{plain_m, plain}, {zero_m, zero}}) do
      c[2]:zero_grad(); backward(c[1], step); c[2]:step()
    end
  end
  local a, b = zero_m:state_dict(), plain_m:state_dict()
  for name, t in pairs(b) do assert_rel(a[name], t, name) end
  assert_same_state(zero:state_dict(), plain:state_dict(), "SGD state")
end)

T.case("ranks that start apart end equal: step broadcasts every parameter from its owner", function()
  ember.manual_seed(40 + RANK)
  local m = Net():to(DEVICE)
  local zero = optim.ShardedOptimizer(m:parameters(), optim.AdamW, {lr = 1e-3})
  backward(m, 1)
  zero:step()
  for _, p in ipairs(m:parameters()) do
    local lo, hi = p:clone(), p:clone()
    dist.all_reduce(lo, {op = "min"}); dist.all_reduce(hi, {op = "max"})
    local owner_value_spread = (hi - lo):abs():max():item()
    assert(owner_value_spread == 0, "parameters differ across ranks after step: " .. owner_value_spread)
  end
end)

T.case("clear errors", function()
  local ok, err = pcall(optim.ShardedOptimizer, {}, optim.AdamW, {})
  assert(not ok and err:find("ember.optim.ShardedOptimizer: expected a non%-empty array"), err)
  ok, err = pcall(optim.ShardedOptimizer, Net():parameters(), "AdamW", {})
  assert(not ok and err:find("expected an optimizer class"), err)
end)

T.done()
