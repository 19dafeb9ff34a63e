-- linear_bwd_stream_child.lua — not a spec: run by tests/gpu/linear_bwd_stream_spec.lua in a child process per
-- value of EMBER_LINEAR_BWD_STREAM (read once a process). Trains a two-layer TransformerLM (bf16 autocast,
-- shadow weights, flash attention, AdamW) a few steps in each way the switch meets: eager; gradient accumulation
-- (grad W added into .grad by the gemm, beta = 1); DDP-style bucket views as .grad (the same); captured with ember.cuda.graph and replayed; the overlapped
-- optimizer (step_in_backward: the hooks fire when grad W is final), eager and captured; and free_grads. Saves
-- every loss, weight and gradient to SCAN_SPEC_OUT, and to TRACE_OUT (JSON) the linear kernels of one profiled
-- eager step and one profiled replay: per (kernel name, op, module, phase) the count, and the streams the
-- backward's linear kernels ran on (eager).
local ember = require "ember"
local cjson = require "cjson"
local nn, F = ember.nn, ember.nn.functional

-- M = B·T = 1024 tokens, d_model 512: grad W of q/k/v/o (512 x 512) is still running when grad x's
-- gemm starts, so a missing fork or join shows as different bits or a wrong attribution
local V, T, B = 4096, 256, 4
local out, trace = {}, {}

local function setup(o)
  ember.manual_seed(11)
  local model = nn.TransformerLM(nn.configs.tiny{vocab_size = V, context_length = T, d_model = 512, d_ff = 1536,
    num_layers = 2, num_heads = 8, device = "cuda"})
  local opt = ember.optim.AdamW(model:parameters(), {lr = 1e-3, weight_decay = 0.1, shadow_weights = true,
    overlap_bucket_mb = o.bucket_mb})
  ember.manual_seed(12)
  local data = ember.randint(0, V, {(o.micro or 1) * B, T + 1}, {device = "cuda"})
  return model, opt, data
end

local function step_fn(model, opt, data, o)
  local micro, xs, ys = o.micro or 1, {}, {}
  for k = 1, micro do
    local d = data:narrow(0, (k - 1) * B, B)
    xs[k], ys[k] = d:narrow(1, 0, T), d:narrow(1, 1, T)
  end
  local flat
  if o.views then   -- DDP's bucket views: every .grad a view of one zeroed buffer, which the gemms add into
    local total, off = 0, 0
    for _, p in ipairs(model:parameters()) do total = total + p:numel() end
    flat = ember.zeros({total}, {device = "cuda"})
    for _, p in ipairs(model:parameters()) do
      p.grad = flat:narrow(0, off, p:numel()):view(p.shape)
      off = off + p:numel()
    end
  end
  return function()
    if flat then flat:zero_() else opt:zero_grad() end
    local last
    for k = 1, micro do
      local loss = ember.autocast("bf16", function() return F.cross_entropy(model(xs[k]), ys[k]) end)
      if micro > 1 then loss = loss / micro end
      if o.overlap and k == micro then opt:step_in_backward{free_grads = o.free_grads} end
      loss:backward()
      last = loss
    end
    opt:step()
    return last
  end
end

local function save(name, model, losses)
  out[name .. ".losses"] = ember.tensor(losses, {dtype = "f64"})
  for _, np in ipairs(model:named_parameters()) do
    out[name .. ".w." .. np[1]] = np[2]:detach():cpu()
    if np[2].grad then out[name .. ".g." .. np[1]] = np[2].grad:cpu() end
  end
end

-- the linear kernels of a profile, by (name, op, module, phase); the streams of the backward's (eager)
local function linear_kernels(p, what)
  local path = os.tmpname() .. ".json"
  p:export_chrome_trace(path)
  local f = assert(io.open(path))
  local doc = cjson.decode(f:read("a"))
  f:close()
  os.remove(path)
  local keys, streams, n_streams = {}, {}, 0
  for _, e in ipairs(doc.traceEvents) do
    local a = e.args or {}
    if e.pid >= 100 and e.ph == "X" and e.cat == "kernel" and a.op == "linear" then
      local key = table.concat({e.name, a.op, tostring(a.m), tostring(a.p)}, "|")
      keys[key] = (keys[key] or 0) + 1
      if a.p == "backward" and not streams[e.tid] then streams[e.tid], n_streams = true, n_streams + 1 end
    end
  end
  trace[what] = {keys = keys, backward_streams = n_streams}
end

local function run(name, o)
  local model, opt, data = setup(o)
  local step = step_fn(model, opt, data, o)
  local losses, steps = {}, o.steps or 3
  if o.graph then
    for s = 1, 2 do losses[s] = step():item() end           -- eager warm-up: state, shadows, streams exist
    opt:zero_grad()
    local loss
    local g = ember.cuda.graph(function() loss = step() end, {warmup = 0})
    for s = 3, steps do
      if o.profile and s == steps then linear_kernels(ember.profile(function() g:replay() end, {print = false}), name)
      else g:replay() end
      ember.cuda.synchronize()
      losses[s] = loss:item()
    end
    save(name, model, losses)
    g:close()
  else
    for s = 1, steps do
      if o.profile and s == steps then
        local loss
        linear_kernels(ember.profile(function() loss = step() end, {print = false}), name)
        losses[s] = loss:item()
      else
        losses[s] = step():item()
      end
    end
    save(name, model, losses)
  end
  ember.cuda.synchronize()
end

run("eager", {profile = true})
run("accum2", {micro = 2, steps = 2})
run("views", {})
run("graph", {graph = true, steps = 5, profile = true})
run("overlap", {overlap = true, bucket_mb = 0})
run("overlap_graph", {overlap = true, bucket_mb = 8, graph = true, steps = 4})
run("overlap_free", {overlap = true, bucket_mb = 0, free_grads = true})
ember.save(os.getenv("SCAN_SPEC_OUT"), out)
local f = assert(io.open(os.getenv("TRACE_OUT"), "w"))
f:write(cjson.encode(trace))
f:close()
print("switch", tostring(ember.backends.linear_bwd_stream()))
