--- AdamW overlapped with backward (issue 16 item 4): each parameter's update
-- runs as soon as backward has made its gradient final, from the
-- post-accumulate-grad hook that DDP's overlap uses, instead of after the
-- whole backward.
--
--     opt:zero_grad()
--     for m = 1, M do                          -- gradient accumulation
--       if m == M then opt:step_in_backward() end   -- the backward that completes the step
--       loss(m):backward()                     -- updates run as gradients become final
--     end
--     opt:step()                               -- the rest, and the join (always call it)
--
-- Why it is exact: the autograd engine fires a leaf's hooks once its last
-- contribution in this backward is summed in (engine/autograd.c: finish_leaf
-- runs when the leaf's dependency count reaches zero), and AdamW is per
-- element: updating a parameter alone, or in any bucket, gives the bits of
-- the one multi-tensor step (engine/ops/optim.c). The step count, weight
-- decay and lr are the group's at the time the bucket runs, as opt:step()
-- would read them: set the lr before the armed backward.
--
-- On CUDA a full bucket (overlap_bucket_mb, default 32 MiB; 0: one
-- parameter per bucket) is prepared on the main stream (state made on first
-- use, the device lr refreshed: everything that allocates), then an event
-- recorded there is waited on by a side stream, which launches the fused
-- kernel; opt:step() records an event on the side stream and makes the main
-- stream wait on it, so the next forward (and zero_grad's frees) come after
-- every update. Inside ember.cuda.graph that fork and join are what CUDA
-- needs to capture the side stream into the same graph. On the CPU the hook
-- runs the update inline.
--
-- Clipping needs the global norm before any update. step_in_backward{
-- max_norm = x} defaults to clip = "exact": the hooks do nothing and
-- opt:step() clips and steps as clip_grad_norm + step would (no overlap).
-- clip = "previous" scales this step's gradients by the factor of the
-- previous step's norm (not exact: documented in docs/training.md); the
-- first step has no previous norm and is clipped exactly with its own.
--
-- free_grads = true drops each gradient once its update has run (its
-- parameter's .grad becomes nil, as zero_grad() would make it), so at no
-- point are all the gradients alive at once: at 2.7B they are 12.7 GiB
-- that otherwise sit beside the bf16 shadow weights, the moments and the
-- master weights at the end of backward. Inline, a bucket's gradients go
-- right after its launch (stream order makes it safe). On the side stream
-- the update may still be reading them while the main stream allocates, and
-- a freed block goes back to the main stream's free list, so each bucket
-- records an event on the side stream after its launch, and the bucket
-- FREE_LAG flushes later the main stream waits on that event before the
-- gradients are dropped (the lag keeps the main stream from waiting on an
-- update that has just started); step() drops the rest after the join.
-- @module ember.optim_overlap

local core = require "ember.core"

local fmt = string.format
local M = {}

local CLIP_MODES = {exact = true, previous = true}
-- free_grads with the side stream: buckets whose gradients wait for their
-- update before the main stream may free them (see the module comment)
local FREE_LAG = 2

function M.install(AdamW, h)
  local update = h.update
  local base_zero_grad = AdamW.zero_grad

  -- Every parameter gets one hook, shared, holding the optimizer weakly: a
  -- parameter outliving its optimizer keeps a no-op hook, not the optimizer.
  function AdamW:_hook_params()
    self._where = self._where or {}
    if not self._weak then
      local weak = setmetatable({o = self}, {__mode = "v"})
      self._weak = weak
      self._hook = function(param)
        local o = weak.o
        if o and o._armed then o:_grad_ready(param) end
      end
    end
    local n = 0
    for gi, g in ipairs(self.param_groups) do
      for _, p in ipairs(g.params) do
        n = n + 1
        local w = self._where[p]
        if w == nil then
          self._where[p] = {gi = gi, idx = n}
          -- a parameter that does not require grad never gets a gradient
          if p.requires_grad then p:register_post_accumulate_grad_hook(self._hook) end
        else
          w.gi, w.idx = gi, n
        end
      end
    end
    self._nparams = n
  end

  --- Make the next backward pass complete this step: each parameter's
  -- update runs as soon as its gradient is final (see the module comment).
  -- Call it before the backward of the last micro-batch only, and call
  -- opt:step() after that backward.
  -- @tparam[opt] table opts max_norm (clip the global gradient norm to it),
  --   clip ("exact", the default with max_norm: no overlap; "previous": the
  --   previous step's norm), side_stream (true: CUDA updates on a side stream;
  --   false: inline on the main stream, same bits), free_grads (false: true
  --   drops each gradient once its update ran; .grad is nil after step())
  function AdamW:step_in_backward(opts)
    local fname = "ember.optim.AdamW.step_in_backward"
    if opts ~= nil and type(opts) ~= "table" then
      error(fmt("%s: expected an options table, got %s", fname, type(opts)), 2)
    end
    opts = opts or {}
    for k in pairs(opts) do
      if k ~= "max_norm" and k ~= "clip" and k ~= "side_stream" and k ~= "free_grads" then
        error(fmt("%s: unknown option '%s' (expected max_norm, clip, side_stream, free_grads)", fname,
          tostring(k)), 2)
      end
    end
    local max_norm, clip = opts.max_norm, opts.clip
    if max_norm ~= nil and (type(max_norm) ~= "number" or max_norm ~= max_norm or max_norm < 0) then
      error(fmt("%s: expected max_norm to be a number >= 0, got %s", fname, tostring(max_norm)), 2)
    end
    if clip ~= nil and max_norm == nil then
      error(fmt("%s: clip = %s needs max_norm", fname, tostring(clip)), 2)
    end
    if clip ~= nil and not CLIP_MODES[clip] then
      error(fmt("%s: expected clip = \"exact\" or \"previous\", got %s", fname, tostring(clip)), 2)
    end
    for _, k in ipairs({"side_stream", "free_grads"}) do
      if opts[k] ~= nil and type(opts[k]) ~= "boolean" then
        error(fmt("%s: expected %s = true or false, got %s", fname, k, type(opts[k])), 2)
      end
    end
    if self._armed then
      error(fname .. ": already armed for this step; call opt:step() to finish it first", 2)
    end
    clip = max_norm and (clip or "exact") or nil
    self:_hook_params()
    if clip == "previous" then self:_clip_slots(fname) end
    self._armed = {clip = clip, max_norm = max_norm, side_stream = opts.side_stream ~= false,
                   free_grads = opts.free_grads == true,
                   overlap = clip == nil or (clip == "previous" and self._clip_prev ~= nil)}
    self._done, self._pending, self._pending_order = {}, {}, {}
  end

  -- clip = "previous": one f32 slot per parameter for its gradient's sum of
  -- squares (zeroed here, at arming), on the parameters' one device.
  function AdamW:_clip_slots(fname)
    local dev
    for _, g in ipairs(self.param_groups) do
      for _, p in ipairs(g.params) do
        dev = dev or p.device
        if p.device ~= dev then
          error(fmt("%s: clip = \"previous\" needs every parameter on one device, got %s and %s",
            fname, dev, p.device), 3)
        end
      end
    end
    local s = self._clip_sumsq_slots
    if s == nil or s.device ~= dev or s.shape[1] ~= self._nparams then
      s = require("ember").zeros({self._nparams}, {dtype = "f32", device = dev})
      self._clip_sumsq_slots = s
      self._clip_prev = nil
    else
      s:zero_()
    end
  end

  -- A parameter's gradient is final in the armed backward.
  function AdamW:_grad_ready(p)
    local w = self._where[p]
    if self._done[p] then
      error(fmt("ember.optim.AdamW: parameter %d got a second final gradient in one step; after " ..
        "step_in_backward() one backward pass completes the step (arm it before the last " ..
        "micro-batch's backward only, and call step() after it)", w.idx), 0)
    end
    self._done[p] = true
    if not self._armed.overlap then return end
    local key = fmt("%d|%s|%s", w.gi, p.device, p.dtype)
    local b = self._pending[key]
    if b == nil then
      b = {gi = w.gi, params = {}, bytes = 0}
      self._pending[key] = b
      self._pending_order[#self._pending_order + 1] = key
    end
    b.params[#b.params + 1] = p
    b.bytes = b.bytes + p:numel() * (p.dtype == "f64" and 8 or 4)
    if b.bytes >= self.overlap_bucket_mb * 2 ^ 20 then self:_flush(key) end
  end

  -- The side stream of a CUDA device (and its fork/join events), or nil:
  -- on the CPU, with side_stream = false, or for a device that is not the
  -- current one (events belong to the current device), the update runs inline.
  function AdamW:_side(device)
    if device == "cpu" or not self._armed.side_stream then return nil end
    self._sides = self._sides or {}
    local s = self._sides[device]
    if s == nil then
      local cuda = require("ember").cuda
      local idx = math.tointeger(tonumber(device:match("^cuda:(%d+)$") or "0"))
      s = false
      if idx == core.cuda_current_device() then
        s = {device = idx, stream = cuda.Stream(idx), fork = cuda.Event(), join = cuda.Event()}
      end
      self._sides[device] = s
    end
    return s or nil
  end

  -- clip = "previous": record the raw gradients' sums of squares, then scale
  -- them by the previous step's factor.
  function AdamW:_clip_previous(params)
    local idx = {}
    for i, p in ipairs(params) do idx[i] = self._where[p].idx end
    core.grad_sumsq_into_(params, self._clip_sumsq_slots, idx)
    core.clip_param_grads_(params, self._armed.max_norm, self._clip_prev)
  end

  -- Run one bucket: prepared on the main stream, launched on the side one.
  function AdamW:_flush(key)
    local b = self._pending[key]
    self._pending[key] = nil
    local g = self.param_groups[b.gi]
    update(function()
      if self._armed.clip == "previous" then self:_clip_previous(b.params) end
      local work = AdamW._prepare(self, b.gi, g, b.params)
      local side = self:_side(b.params[1].device)
      if side then
        side.fork:record()                   -- on the main (current) stream
        side.stream:wait_event(side.fork)
        require("ember").cuda.stream(side.stream, AdamW._launch, g, work)
        self._joins = self._joins or {}
        self._joins[side] = true
        if self._armed.free_grads then self:_free_after(side, b.params) end
      else
        AdamW._launch(g, work)
        if self._armed.free_grads then core.zero_grad_(b.params, true) end
      end
    end)
  end

  -- free_grads on the side stream: an event after this bucket's update, and
  -- the gradients of the bucket FREE_LAG flushes back dropped once the main
  -- stream waits on its event.
  function AdamW:_free_after(side, params)
    side.spare = side.spare or {}
    local ev = table.remove(side.spare) or require("ember").cuda.Event()
    ev:record(side.stream)
    local q = self._freeing or {}
    self._freeing = q
    q[#q + 1] = {side = side, event = ev, params = params}
    while #q > FREE_LAG do self:_free_oldest(true) end
  end

  -- Drop the gradients of the oldest waiting bucket; `wait`: make the main
  -- stream wait for its update first (not needed after the join).
  function AdamW:_free_oldest(wait)
    local f = table.remove(self._freeing, 1)
    local side = f.side
    if wait then require("ember").cuda.current_stream(side.device):wait_event(f.event) end
    core.zero_grad_(f.params, true)
    side.spare[#side.spare + 1] = f.event
  end

  -- The main stream waits for every side stream used since the last join.
  function AdamW:_join()
    if not self._joins then return end
    local cuda = require("ember").cuda
    for side in pairs(self._joins) do
      side.join:record(side.stream)
      cuda.current_stream(side.device):wait_event(side.join)
    end
    self._joins = nil
  end

  -- Parameters with a gradient that no hook updated in this step (skip: the
  -- set of those updated, nil when the hooks were off).
  local function rest_of(self, skip)
    local rest = {}
    for _, g in ipairs(self.param_groups) do
      for _, p in ipairs(g.params) do
        if core.has_grad(p) and not (skip and skip[p]) then rest[#rest + 1] = p end
      end
    end
    return rest
  end

  -- opt:step() after step_in_backward(): the buckets still pending, the
  -- parameters no hook took (e.g. reached only by earlier micro-batches; all
  -- of them when the hooks were off for exact clipping), then the join.
  function AdamW:_finish_step()
    local a = self._armed
    local skip = a.overlap and self._done or nil
    local ok, err = pcall(update, function()
      for _, key in ipairs(self._pending_order) do
        if self._pending[key] then self:_flush(key) end
      end
      if a.clip == "exact" then
        local all = {}
        for _, g in ipairs(self.param_groups) do
          for _, p in ipairs(g.params) do all[#all + 1] = p end
        end
        self._grad_norm = require("ember.nn.utils").clip_grad_norm(all, a.max_norm)
        self:_update_rest(nil)
      elseif a.clip == "previous" then
        local rest = rest_of(self, skip)
        local slots = self._clip_sumsq_slots
        if a.overlap then
          self:_clip_previous(rest)
        else                                   -- the first step: clipped by its own norm
          local idx = {}
          for i, p in ipairs(rest) do idx[i] = self._where[p].idx end
          core.grad_sumsq_into_(rest, slots, idx)
          self._clip_prev = slots:sum()
          core.clip_param_grads_(rest, a.max_norm, self._clip_prev)
        end
        self:_update_rest(skip)
        -- this step's norm, for the next step (in place: a captured graph keeps reading it)
        local s = slots:sum()
        if self._clip_prev == nil then self._clip_prev = s:clone() else self._clip_prev:copy_(s) end
        self._grad_norm = s.device == "cpu" and math.sqrt(s:item()) or s:sqrt()
      else
        self:_update_rest(skip)
      end
    end)
    self:_join()
    if a.free_grads then
      -- after the join: every update is behind the main stream
      while self._freeing and #self._freeing > 0 do self:_free_oldest(false) end
      for _, g in ipairs(self.param_groups) do core.zero_grad_(g.params, true) end
    end
    self._freeing = nil
    self._armed, self._done, self._pending, self._pending_order = nil, nil, nil, nil
    if not ok then error(err, 0) end
  end

  --- The global gradient norm (before clipping) of the last step that
  -- clipped through step_in_backward{max_norm = ...}: a number on the CPU, a
  -- 0-d f32 device tensor on CUDA (as clip_grad_norm returns); nil otherwise.
  function AdamW:grad_norm() return self._grad_norm end

  --- zero_grad joins the side streams first: the gradients it drops may
  -- still be read by updates queued there.
  function AdamW:zero_grad(set_to_none)
    self:_join()
    return base_zero_grad(self, set_to_none)
  end
end

return M
