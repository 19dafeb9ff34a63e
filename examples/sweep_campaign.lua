--- A sweep campaign: a Lua file that returns a table. `ember sweep` runs the
-- script once per combination of the axes' values, each in its own process,
-- and collects every run's JSON line into sweeps/<name>/results.jsonl, then
-- writes results.md (a Markdown table), results.csv and one SVG per plot.
-- This one times the tiny model on the CPU (6 points, well under a minute):
--
--   ember sweep examples/sweep_campaign.lua             (again: skips what is done)
--   ember sweep examples/sweep_campaign.lua --dry-run   (the points and their commands)
--
-- The full format is docs/sweeps.md; scripts/campaigns/ has real ones.
return {
  name = "example_tiny",                 -- results go to sweeps/example_tiny/
  description = "The tiny TransformerLM on the CPU: ms per step by context and mode.",
  script = "scripts/bench_model.lua",    -- found from the working directory or the repo root
  -- arguments every point gets; the script's own --help lists them
  args = {"--model", "tiny", "--device", "cpu", "--vocab", "256", "--batch", "2",
          "--warmup", "1", "--steps", "3"},
  -- the grid: 3 contexts x 2 modes = 6 points; each value becomes `--context 16` etc.
  axes = {
    {name = "mode", values = {"fwd", "train"}},
    {name = "context", values = {16, 32, 64}},
  },
  timeout = 60,                          -- seconds per point; a hang is recorded as "timeout"
  -- columns of results.md / results.csv: record fields, with a title and a format
  table = {columns = {
    "mode", "context",
    {key = "mean_ms", title = "ms/step", fmt = "%.2f"},
    {key = "std_ms", title = "± std", fmt = "%.2f"},
    {key = "tokens_per_s", title = "tok/s", fmt = "%.0f"},
    "status",
  }},
  -- one SVG per entry: a line per `series` value, x and y from the records
  plots = {
    {x = "context", y = "mean_ms", series = "mode", xlog = true, ylog = true,
     title = "tiny model on the CPU", ylabel = "ms per step"},
  },
}
