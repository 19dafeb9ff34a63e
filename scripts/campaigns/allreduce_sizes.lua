--- All-reduce bandwidth on 2 GPUs (NCCL): time, algbw and busbw by size and
-- dtype, Ember's ember.dist beside PyTorch's torch.distributed.
--
--   ember sweep scripts/campaigns/allreduce_sizes.lua        (12 points, sweeps/allreduce_sizes/)
--   ember sweep scripts/campaigns/allreduce_sizes.lua --filter dtype=f32 --dry-run
--
-- A point is `ember run scripts/bench_allreduce.lua --nproc 2 --sizes S`:
-- the script's driver mode launches Ember's ranks (`ember launch`) and then
-- PyTorch's (torchrun), one after the other, and writes one JSON line per
-- impl (busbw = algbw · 2(n−1)/n, nccl-tests' definitions).
return {
  name = "allreduce_sizes",
  description = "bench_allreduce.lua: all-reduce time, algbw and busbw (GB/s) by size (MiB) and dtype, " ..
    "Ember vs PyTorch, 2 GPUs over NCCL, 5 warm-up + 20 timed calls.",
  script = "scripts/bench_allreduce.lua",
  args = {"--nproc", "2", "--device", "cuda", "--warmup", "5", "--iters", "20"},
  device = "cuda",
  axes = {
    {name = "dtype", values = {"f32", "bf16"}},
    {name = "sizes", values = {0.0625, 1, 10, 100, 1000, 4000}},
  },
  timeout = 600,
  table = {columns = {
    "dtype", "sizes", "impl", "world_size",
    {key = "bytes", title = "bytes", fmt = "%d"},
    {key = "time_us", title = "time us", fmt = "%.1f"},
    {key = "algbw_gbs", title = "algbw GB/s", fmt = "%.2f"},
    {key = "busbw_gbs", title = "busbw GB/s", fmt = "%.2f"},
    "status",
  }},
  plots = {
    {x = "bytes", y = "busbw_gbs", series = "impl", facet = "dtype", xlog = true,
     title = "all-reduce busbw vs size", ylabel = "busbw GB/s", file = "busbw.svg"},
    {x = "bytes", y = "time_us", series = "impl", facet = "dtype", xlog = true, ylog = true,
     title = "all-reduce time vs size", ylabel = "us", file = "time_us.svg"},
  },
}
