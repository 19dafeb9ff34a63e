--- Model sizes on one GPU: ms per training / forward-backward / forward step
-- of the reference TransformerLM for every size x precision x context
-- (5 x 3 x 2 x 4 = 120 points, one process each; OOM is a result).
--
--   ember sweep scripts/campaigns/model_sizes.lua                  (resumes; sweeps/model_sizes/)
--   ember sweep scripts/campaigns/model_sizes.lua --filter model=small,medium --dry-run
--
-- Each point: scripts/bench_model.lua, 5 untimed warm-up steps, 10 timed.
local GiB = 2 ^ 30

local function num(v) return type(v) == "number" and v or nil end

return {
  name = "model_sizes",
  description = "bench_model.lua: ms per step by model size, mode, precision and context " ..
    "(batch 4, vocab 10000, 5 warm-up + 10 timed steps, attention auto: flash for bf16 on CUDA).",
  script = "scripts/bench_model.lua",
  args = {"--device", "cuda", "--batch", "4", "--warmup", "5", "--steps", "10"},
  device = "cuda",
  axes = {
    {name = "model", values = {"small", "medium", "large", "xl", "2.7b"}},
    {name = "mode", values = {"fwd", "fwd_bwd", "train"}},
    {name = "precision", values = {"fp32", "bf16"}},
    {name = "context", values = {128, 256, 512, 1024}},
  },
  timeout = 600,
  table = {columns = {
    "model", "mode", "precision", "context",
    {key = "mean_ms", title = "ms/step", fmt = "%.2f"},
    {key = "std_ms", title = "± std", fmt = "%.2f"},
    {key = "tokens_per_s", title = "tok/s", fmt = "%.0f"},
    {key = "mfu_pct", title = "MFU %", fmt = "%.1f",
     value = function(r) return num(r.mfu) and 100 * r.mfu end},
    {key = "peak_gib", title = "peak GiB", fmt = "%.2f",
     value = function(r) return num(r.peak_memory_bytes) and r.peak_memory_bytes / GiB end},
    "status",
  }},
  plots = {
    {x = "context", y = "mean_ms", series = "model", facet = {"mode", "precision"},
     xlog = true, ylog = true, title = "ms per step vs context, by model",
     ylabel = "ms per step", file = "ms_vs_context.svg"},
    {x = "context", y = function(r) return num(r.peak_memory_bytes) and r.peak_memory_bytes / GiB end,
     series = "model", facet = {"mode", "precision"}, xlog = true, ylog = true,
     title = "peak memory vs context, by model", ylabel = "peak GiB", file = "memory_vs_context.svg"},
    {x = "model", y = function(r) return num(r.mfu) and 100 * r.mfu end, series = "context",
     facet = "precision", where = {mode = "train"},
     title = "MFU of a training step", ylabel = "MFU %", file = "mfu_train.svg"},
  },
}
