--- ember.dist: collectives between the ranks of one job (torch.distributed's
-- spellings). CPU tensors go over MPI, CUDA tensors over NCCL on a comm
-- stream. Ranks come from `ember launch --nproc N script.lua`, or from
-- `mpirun -np N ember run script.lua` / `srun --mpi=pmix ember run ...` across
-- hosts. docs/distributed.md is the manual.
--
--   local dist = ember.dist
--   dist.init()                                   -- backend "auto"
--   dist.all_reduce(t, {op = "avg"})              -- in place
--   local w = dist.all_reduce(g, {async = true}) ; ... ; w:wait()
--
-- Every collective checks its tensors (contiguous, dtype, device, sizes) and
-- names itself in errors; with the order check on (default for CPU tensors,
-- EMBER_DIST_CHECK=1 for CUDA ones), ranks that call different collectives,
-- or the same one with different sizes, get an error naming the first rank
-- and call site that diverged. A collective that waits longer than the
-- timeout (EMBER_DIST_TIMEOUT, default 300 s) ends with an error, never a hang.
local core = require "ember.core"
local M = {}

local function is_tensor(v)
  local mt = type(v) == "userdata" and getmetatable(v)
  return mt and mt.__name == "ember.Tensor" or false
end

local function fail(fn, msg, level) error("ember.dist." .. fn .. ": " .. msg, (level or 2) + 1) end

local function check_opts(fn, opts, allowed)
  if opts == nil then return {} end
  if type(opts) ~= "table" then fail(fn, "expected an options table, got " .. type(opts), 3) end
  for k in pairs(opts) do
    if not allowed[k] then
      local names = {}
      for a in pairs(allowed) do names[#names + 1] = a end
      table.sort(names)
      fail(fn, ("unknown option '%s' (expected %s)"):format(tostring(k), table.concat(names, ", ")), 3)
    end
  end
  return opts
end

local function check_tensor(fn, arg, v)
  if not is_tensor(v) then fail(fn, ("expected %s to be a tensor, got %s"):format(arg, type(v)), 3) end
end

-- "file:line" of the code that called into ember.dist (the order check and
-- the timeout errors name it).
local function site()
  for level = 3, 12 do
    local info = debug.getinfo(level, "Sl")
    if not info then break end
    if info.currentline and info.currentline > 0 then return info.short_src .. ":" .. info.currentline end
  end
  return "?"
end

--- What this build can do: "mpi nccl", "mpi", or "" (no collectives).
function M.available() return core.dist_available() end

--- init{backend = "auto"|"mpi"|"nccl", timeout = seconds, check = bool}.
-- backend defaults to $EMBER_DIST_BACKEND (set by `ember launch --backend`)
-- or "auto": CPU tensors over MPI, CUDA tensors over NCCL (created at the
-- first CUDA collective). Each rank uses GPU local_rank % device_count.
function M.init(opts)
  opts = check_opts("init", opts, {backend = true, timeout = true, check = true})
  if opts.backend ~= nil and type(opts.backend) ~= "string" then
    fail("init", "expected backend to be a string, got " .. type(opts.backend))
  end
  if opts.timeout ~= nil and (type(opts.timeout) ~= "number" or opts.timeout <= 0) then
    fail("init", "expected timeout to be a positive number of seconds, got " .. tostring(opts.timeout))
  end
  core.dist_init(opts.backend, opts.timeout, opts.check)
end

function M.rank() return core.dist_rank() end
function M.world_size() return core.dist_world_size() end
function M.local_rank() return core.dist_local_rank() end
function M.is_initialized() return core.dist_is_initialized() end
--- "auto", "mpi", "nccl" (or "none" before init).
function M.backend() return core.dist_backend() end
--- The collective timeout in seconds.
function M.timeout() return core.dist_timeout() end
--- Whether the order check is on: for CPU tensors, for CUDA tensors.
function M.check_enabled() return core.dist_check() end
function M.destroy() core.dist_destroy() end

local RED = {op = true, async = true}

--- all_reduce(t, {op = "sum"|"avg"|"max"|"min", async = false}): in place.
-- Returns t, or a work handle (w:wait(), w:is_completed()) with async = true.
function M.all_reduce(t, opts)
  check_tensor("all_reduce", "t", t)
  opts = check_opts("all_reduce", opts, RED)
  local w = core.dist_all_reduce(t, opts.op, opts.async, site())
  return w or t
end

--- broadcast(t, {src = 0, async = false}): rank src's t into every rank's t.
function M.broadcast(t, opts)
  check_tensor("broadcast", "t", t)
  opts = check_opts("broadcast", opts, {src = true, async = true})
  if opts.src ~= nil and math.type(opts.src) ~= "integer" then
    fail("broadcast", "expected src to be an integer rank, got " .. tostring(opts.src))
  end
  local w = core.dist_broadcast(t, opts.src or 0, opts.async, site())
  return w or t
end

-- A list form's work: the C work, then copies out of the flat buffer.
local ListWork = {}
ListWork.__index = ListWork
function ListWork:wait()
  self.work:wait()
  if not self.copied then self.copied = true ; self.after() end
  return self
end
function ListWork:is_completed()
  return self.copied or self.work:is_completed()
end

local function flat_of(list, fn, arg, like)
  if #list ~= core.dist_world_size() then
    fail(fn, ("expected %s to hold world_size (%d) tensors, got %d"):format(arg, core.dist_world_size(), #list), 3)
  end
  for i, x in ipairs(list) do
    check_tensor(fn, arg .. "[" .. i .. "]", x)
    if x:numel() ~= like:numel() then
      fail(fn, ("expected %s[%d] to have %d elements like t, got %d"):format(arg, i, like:numel(), x:numel()), 3)
    end
  end
  return require("ember").empty({#list * like:numel()}, {dtype = like.dtype, device = like.device})
end

--- all_gather(out, t, {async = false}): out is a tensor of world_size *
-- t:numel() elements (rank r's t at r * t:numel()) or a list of world_size
-- tensors shaped like t.
function M.all_gather(out, t, opts)
  check_tensor("all_gather", "t", t)
  opts = check_opts("all_gather", opts, {async = true})
  if type(out) == "table" then
    local list = out
    local flat = flat_of(list, "all_gather", "out", t)
    local n = t:numel()
    local function after()
      for i, x in ipairs(list) do x:copy_(flat:narrow(0, (i - 1) * n, n):view(x.shape)) end
    end
    local w = core.dist_all_gather(flat, t, opts.async, site())
    if not w then after() ; return out end
    return setmetatable({work = w, after = after}, ListWork)
  end
  check_tensor("all_gather", "out", out)
  return core.dist_all_gather(out, t, opts.async, site()) or out
end

--- reduce_scatter(out, t, {op = "sum", async = false}): t has world_size *
-- out:numel() elements (or is a list of world_size tensors shaped like out);
-- rank r receives the reduction over ranks of chunk r.
function M.reduce_scatter(out, t, opts)
  check_tensor("reduce_scatter", "out", out)
  opts = check_opts("reduce_scatter", opts, RED)
  if type(t) == "table" then
    local flat = flat_of(t, "reduce_scatter", "t", out)
    local n = out:numel()
    for i, x in ipairs(t) do flat:narrow(0, (i - 1) * n, n):copy_(x:reshape({n})) end
    t = flat
  end
  check_tensor("reduce_scatter", "t", t)
  return core.dist_reduce_scatter(out, t, opts.op, opts.async, site()) or out
end

--- Every rank reaches this point (with its queued GPU work finished).
function M.barrier() core.dist_barrier(site()) end

--- Point to point (blocking; the receiver's t must have the sender's size).
function M.send(t, dst)
  check_tensor("send", "t", t)
  core.dist_send(t, dst, site())
end
function M.recv(t, src)
  check_tensor("recv", "t", t)
  core.dist_recv(t, src, site())
  return t
end

--- Counters since init or reset_stats(): {all_reduce = {calls =, bytes =}, ...}
-- (payload bytes of the tensors handed in; docs/distributed.md gives the
-- bytes on the wire per algorithm).
function M.stats() return core.dist_stats() end
function M.reset_stats() core.dist_stats_reset() end

return M
