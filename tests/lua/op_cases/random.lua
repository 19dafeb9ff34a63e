-- op_cases/random.lua — random ops and dropout (issue 12): bernoulli,
-- randperm, multinomial, uniform_/normal_ (no gradient: eval mode compares
-- the draws, which must be the same numbers on both devices) and dropout
-- (differentiable: gradcheck with the mask held fixed by the seed).
-- Every fn calls ember.manual_seed itself, so each call -- gradcheck's many
-- evaluations, the GPU's run and the CPU reference -- draws the same stream.
-- Loaded by tests/lua/op_cases.lua, which says what case() and perf() take.
return function(case, perf, ember, F)
  local NOGRAD = {grad = false}

  ---------------------------------------------------------------------------
  -- dropout
  ---------------------------------------------------------------------------
  case("F.dropout p=0.5 over (3,5), gradient through the same mask", "dropout",
    function(x) ember.manual_seed(11); return F.dropout(x, 0.5) end,
    function(T) return {T.randn({3, 5})} end)
  case("F.dropout p=0.2 over an odd length (7) and a transposed view", "dropout",
    function(x) ember.manual_seed(12); return F.dropout(x:t(), 0.2) end,
    function(T) return {T.randn({7, 3})} end)

  ---------------------------------------------------------------------------
  -- sampling (no gradient)
  ---------------------------------------------------------------------------
  case("bernoulli of a (4,6) probability tensor", "bernoulli",
    function(p) ember.manual_seed(21); return ember.bernoulli(p:detach()) end,
    function(T) return {T.uniform({4, 6}, 0, 1)} end, nil, NOGRAD)
  case("bernoulli_ with p = 0.3 into a (5,3) tensor", "bernoulli_",
    function(x) ember.manual_seed(22); return x:detach():clone():bernoulli_(0.3) end,
    function(T) return {T.randn({5, 3})} end, nil, NOGRAD)
  case("uniform_(-2, 3) into a (3,7) tensor", "uniform_",
    function(x) ember.manual_seed(23); return x:detach():clone():uniform_(-2, 3) end,
    function(T) return {T.randn({3, 7})} end, nil, NOGRAD)
  case("normal_(1, 2) into a (4,5) tensor", "normal_",
    function(x) ember.manual_seed(24); return x:detach():clone():normal_(1, 2) end,
    function(T) return {T.randn({4, 5})} end, nil, NOGRAD)
  case("randperm(37) on the inputs' device", "randperm",
    function(x) ember.manual_seed(25); return ember.randperm(37, {device = x.device}) end,
    function(T) return {T.const({1})} end, nil, NOGRAD)
  case("multinomial with replacement, (3,6) probs, 8 samples", "multinomial",
    function(p) ember.manual_seed(26); return ember.multinomial(p:detach(), 8, {replacement = true}) end,
    function(T) return {T.uniform({3, 6}, 0.05, 1)} end, nil, NOGRAD)
  case("multinomial without replacement, (5) probs, 4 samples", "multinomial",
    function(p) ember.manual_seed(27); return ember.multinomial(p:detach(), 4) end,
    function(T) return {T.uniform({5}, 0.05, 1)} end, nil, NOGRAD)

  ---------------------------------------------------------------------------
  -- perf
  ---------------------------------------------------------------------------
  perf("dropout", "F.dropout p=0.1 of 2^24 elements", function(x) return F.dropout(x, 0.1) end,
    function(T) return {T.randn({4096, 4096})} end, {backward = true, device = "cuda",
    torch = "F.dropout(a, 0.1)"})
  perf("dropout", "F.dropout p=0.1 of 2^20 elements on the CPU", function(x) return F.dropout(x, 0.1) end,
    function(T) return {T.randn({1024, 1024})} end, {backward = true, device = "cpu", dtypes = {"f32"}})
  perf("bernoulli", "bernoulli of 2^24 probabilities", function(p) return ember.bernoulli(p) end,
    function(T) return {T.uniform({4096, 4096}, 0, 1)} end, {device = "cuda", torch = "torch.bernoulli(a)"})
  perf("randperm", "randperm(2^24)", function(x) return ember.randperm(1 << 24, {device = x.device}) end,
    function(T) return {T.const({1})} end, {dtypes = {"f32"}, device = "cuda",
    torch = "torch.randperm(1 << 24, device=a.device)"})
  perf("multinomial", "multinomial (64, 50304) probs, 1 sample with replacement",
    function(p) return ember.multinomial(p, 1, {replacement = true}) end,
    function(T) return {T.uniform({64, 50304}, 0, 1)} end, {dtypes = {"f32"}, device = "cuda",
    torch = "torch.multinomial(a, 1, replacement=True)"})
  -- in-place fills write their tensor once and read nothing
  local function written(_, out) return out:numel() * out:element_size() end
  perf("bernoulli_", "bernoulli_(0.3) into 2^24 elements", function(x) return x:bernoulli_(0.3) end,
    function(T) return {T.const({4096, 4096})} end, {bytes = written, torch = "a.bernoulli_(0.3)"})
  perf("uniform_", "uniform_(-2, 3) into 2^24 elements", function(x) return x:uniform_(-2, 3) end,
    function(T) return {T.const({4096, 4096})} end, {bytes = written, torch = "a.uniform_(-2, 3)"})
  perf("normal_", "normal_(1, 2) into 2^24 elements", function(x) return x:normal_(1, 2) end,
    function(T) return {T.const({4096, 4096})} end, {bytes = written, torch = "a.normal_(1, 2)"})
  -- 2^26 elements on CUDA (issue 12's bar is judged on large shapes): every buffer past the H100's 50 MB L2
  local L = {8192, 8192}
  perf("dropout", "F.dropout p=0.1 of 2^26 elements", function(x) return F.dropout(x, 0.1) end,
    function(T) return {T.randn(L)} end, {backward = true, device = "cuda", torch = "F.dropout(a, 0.1)"})
  perf("bernoulli", "bernoulli of 2^26 probabilities", function(p) return ember.bernoulli(p) end,
    function(T) return {T.uniform(L, 0, 1)} end, {device = "cuda", torch = "torch.bernoulli(a)"})
  perf("bernoulli_", "bernoulli_(0.3) into 2^26 elements", function(x) return x:bernoulli_(0.3) end,
    function(T) return {T.const(L)} end, {bytes = written, device = "cuda", torch = "a.bernoulli_(0.3)"})
  perf("uniform_", "uniform_(-2, 3) into 2^26 elements", function(x) return x:uniform_(-2, 3) end,
    function(T) return {T.const(L)} end, {bytes = written, device = "cuda", torch = "a.uniform_(-2, 3)"})
  perf("normal_", "normal_(1, 2) into 2^26 elements", function(x) return x:normal_(1, 2) end,
    function(T) return {T.const(L)} end, {bytes = written, device = "cuda", torch = "a.normal_(1, 2)"})
end
