--- Attention implementations on one GPU: forward and backward time and the
-- memory held before backward, for naive (composed ops), graph (the naive
-- composition captured as a CUDA graph) and flash (Ember's FlashAttention-2
-- kernels), over head dim d x sequence length (3 x 4 x 5 = 60 points,
-- batch 8, 100 passes each; OOM is a result: naive at 16k tokens).
--
--   ember sweep scripts/campaigns/attention_grid.lua    (sweeps/attention_grid/)
--   ember sweep scripts/campaigns/attention_grid.lua --filter impl=flash --dry-run
--
-- scripts/bench_attention.lua writes one JSON line per (impl, d, seq) cell:
-- impl, d, seq, batch, fwd_ms, bwd_ms, mem_before_bwd_bytes, status.
local GiB = 2 ^ 30

return {
  name = "attention_grid",
  description = "bench_attention.lua: forward/backward ms and memory before backward, " ..
    "by implementation, head dim and sequence length (batch 8, 100 passes).",
  script = "scripts/bench_attention.lua",
  args = {"--device", "cuda", "--batch", "8", "--passes", "100"},
  device = "cuda",
  axes = {
    {name = "impl", values = {"naive", "graph", "flash"}},
    {name = "d", values = {16, 32, 64, 128}},
    {name = "seq", values = {256, 1024, 4096, 8192, 16384}},
  },
  timeout = 600,
  table = {columns = {
    "impl", "d", "seq",
    {key = "fwd_ms", title = "fwd ms", fmt = "%.3f"},
    {key = "bwd_ms", title = "bwd ms", fmt = "%.3f"},
    {key = "mem_before_bwd_gib", title = "mem before bwd GiB", fmt = "%.3f",
     value = function(r)
       return type(r.mem_before_bwd_bytes) == "number" and r.mem_before_bwd_bytes / GiB or nil
     end},
    "status",
  }},
  plots = {
    {x = "seq", y = "fwd_ms", series = "impl", facet = "d", xlog = true, ylog = true,
     title = "forward ms vs sequence length", ylabel = "forward ms", file = "fwd_ms.svg"},
    {x = "seq", y = "bwd_ms", series = "impl", facet = "d", xlog = true, ylog = true,
     title = "backward ms vs sequence length", ylabel = "backward ms", file = "bwd_ms.svg"},
    {x = "seq", y = function(r)
       return type(r.mem_before_bwd_bytes) == "number" and r.mem_before_bwd_bytes / GiB or nil
     end, series = "impl", facet = "d", xlog = true, ylog = true,
     title = "memory held before backward", ylabel = "GiB", file = "memory.svg"},
  },
}
