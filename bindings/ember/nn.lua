--- ember.nn: modules with PyTorch's semantics, and the reference TransformerLM.
--
-- A module is a Lua table whose class is its metatable. Assigning a module or
-- a parameter to a field registers it, in assignment order, exactly as
-- PyTorch's `__setattr__` does, so `parameters()` comes out in PyTorch's
-- order and `named_parameters()` gives the dotted names a PyTorch
-- checkpoint uses ("layers.0.attn.q_proj.weight"). Registered things live in
-- `_parameters`, `_buffers` and `_modules` (never as raw fields), so
-- reassigning `self.weight` always goes through the registry.
--
-- A parameter is any leaf tensor with `requires_grad = true` (make one with
-- `nn.Parameter(t)`); a plain tensor assigned to a field is just a field. Use
-- `register_buffer` for state that belongs in `state_dict` but is not
-- trained.
--
--     local MLP = nn.Module:extend("MLP")
--     function MLP:__init(d)
--       self.fc1 = nn.Linear(d, 4 * d)
--       self.fc2 = nn.Linear(4 * d, d)
--     end
--     function MLP:forward(x) return self.fc2(F.relu(self.fc1(x))) end
--     local m = MLP(16)            -- m(x) calls m:forward(x)
--
-- `m:to(device|dtype)` converts parameters *in place* (p:set_), so the
-- tensors an optimizer already holds stay the model's parameters.
--
-- This file only gathers the package, as torch/nn/__init.py does: one module
-- a file under ember/nn/ (module.lua and module_state.lua the base class,
-- container, linear, embedding, norm, rope, attention, swiglu, transformer,
-- configs, utils, parallel). Each can be required alone
-- (`require "ember.nn.linear"` returns Linear); the names below are the API.
-- @module ember.nn

local nn = {}
-- Registered before requiring anything that may require "ember" (whose
-- init.lua loads us lazily) so that every path gets this one table.
package.loaded["ember.nn"] = nn

nn.functional = require "ember.functional"

local module = require "ember.nn.module"
local parameter = require "ember.nn.parameter"
nn.Module, nn.is_module = module.Module, module.is_module
nn.Parameter = parameter.Parameter
-- weak registry of parameters, read by ember.memory when recording starts
nn._live_parameters = parameter.live

local container = require "ember.nn.container"
nn.ModuleList, nn.Sequential = container.ModuleList, container.Sequential

nn.Linear = require "ember.nn.linear"
nn.Embedding = require "ember.nn.embedding"
nn.RMSNorm = require "ember.nn.norm"
nn.LayerNorm = require "ember.nn.layer_norm"
nn.RotaryEmbedding = require "ember.nn.rope"
nn.CausalSelfAttention = require("ember.nn.attention").CausalSelfAttention
nn.SwiGLU = require "ember.nn.swiglu"
-- issue 12: dropout, GELU and the loss modules
nn.Dropout = require "ember.nn.dropout"
nn.GELU = require("ember.nn.activation").GELU
do
  local loss = require "ember.nn.loss"
  nn.MSELoss, nn.L1Loss, nn.NLLLoss = loss.MSELoss, loss.L1Loss, loss.NLLLoss
  nn.BCEWithLogitsLoss, nn.CrossEntropyLoss = loss.BCEWithLogitsLoss, loss.CrossEntropyLoss
end

local transformer = require "ember.nn.transformer"
nn.TransformerBlock, nn.TransformerLM = transformer.TransformerBlock, transformer.TransformerLM
nn.KVCache = require "ember.nn.kv_cache"   -- nn.KVCache(model, opts): for generation (ember.generate)
nn.GPT2 = require("ember.nn.gpt2").GPT2   -- GPT-2-style decoder from public ops (issue 12)

local configs = require "ember.nn.configs"
nn.configs, nn.config_names = configs.configs, configs.config_names
nn.count_parameters = configs.count_parameters

nn.utils = require "ember.nn.utils"
-- ember.nn.parallel.DDP and its strategies live in ember/ddp*.lua, loaded on first use
nn.parallel = require "ember.nn.parallel"

return nn
