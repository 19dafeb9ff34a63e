--- ember.nn.Embedding: a lookup table of vectors (torch/nn/modules/sparse.py).
-- forward gathers rows with F.embedding; the backward scatters into a dense
-- weight gradient (no sparse gradients in Ember).
-- @module ember.nn.embedding

local F = require "ember.functional"
local module = require "ember.nn.module"
local parameter = require "ember.nn.parameter"

local fmt = string.format

--- A lookup table of n vectors of size d, initialised truncated normal
-- std 1 cut at ±3.
-- @type Embedding
local Embedding = module.Module:extend("Embedding")

function Embedding:__init(num_embeddings, embedding_dim, opts)
  opts = module.check_ctor("ember.nn.Embedding", opts, "num_embeddings", num_embeddings,
    "embedding_dim", embedding_dim)
  self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
  self.weight = parameter.new({num_embeddings, embedding_dim}, opts.dtype, opts.device,
    function(t) t:trunc_normal_(0, 1, -3, 3) end)
end

function Embedding:forward(ids)
  return F.embedding(ids, self.weight)
end

function Embedding:extra_repr()
  return fmt("%d, %d", self.num_embeddings, self.embedding_dim)
end

return Embedding
