--- ember.nn.configs: the TransformerLM sizes (GPT-2 small to 2.7B, plus tiny
-- for CPU tests) and the parameter count of a config, without allocating.
-- @module ember.nn.configs

local util = require "ember.util"

local fmt = string.format
local M = {}

--- The keys every TransformerLM config must give as positive integers.
M.REQUIRED = {"vocab_size", "context_length", "d_model", "d_ff", "num_layers", "num_heads"}

--- Parameter count of a TransformerLM config, without allocating:
-- 2·V·D (embeddings + lm_head) + L·(4·D² + 3·D·F + 2·D) + D.
-- @tparam table cfg
-- @treturn integer
function M.count_parameters(cfg)
  for _, k in ipairs(M.REQUIRED) do
    if not util.is_positive_int(cfg[k]) then
      error(fmt("ember.nn.count_parameters: expected cfg.%s to be a positive integer, got %s",
        k, tostring(cfg[k])), 2)
    end
  end
  local V, D, F_, L = cfg.vocab_size, cfg.d_model, cfg.d_ff, cfg.num_layers
  return 2 * V * D + L * (4 * D * D + 3 * D * F_ + 2 * D) + D
end

--- Model sizes: `nn.configs.small{vocab_size = 32000}` returns a config
-- table for nn.TransformerLM (vocab 10000 and context 512 unless
-- overridden). tiny is for fast CPU tests.
M.configs = {}
local SIZES = {
  tiny = {d_model = 64, d_ff = 192, num_layers = 2, num_heads = 4},
  small = {d_model = 768, d_ff = 3072, num_layers = 12, num_heads = 12},
  medium = {d_model = 1024, d_ff = 4096, num_layers = 24, num_heads = 16},
  large = {d_model = 1280, d_ff = 5120, num_layers = 36, num_heads = 20},
  xl = {d_model = 1600, d_ff = 6400, num_layers = 48, num_heads = 25},
  ["2.7b"] = {d_model = 2560, d_ff = 10240, num_layers = 32, num_heads = 32},
}
--- Size names in increasing order.
M.config_names = {"tiny", "small", "medium", "large", "xl", "2.7b"}
for name, size in pairs(SIZES) do
  M.configs[name] = function(overrides)
    if overrides ~= nil and type(overrides) ~= "table" then
      error(fmt("ember.nn.configs.%s: expected an overrides table, got %s", name,
        type(overrides)), 2)
    end
    local cfg = {vocab_size = 10000, context_length = 512, rope_theta = 10000}
    for k, v in pairs(size) do cfg[k] = v end
    for k, v in pairs(overrides or {}) do cfg[k] = v end
    return cfg
  end
end

return M
