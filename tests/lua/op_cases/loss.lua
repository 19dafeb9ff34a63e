-- op_cases/loss.lua — losses and gelu's tanh form (issue 12): cross_entropy's
-- options (ignore_index, label_smoothing, reductions), mse_loss, l1_loss,
-- nll_loss, binary_cross_entropy_with_logits, gelu(approximate="tanh").
-- Loaded by tests/lua/op_cases.lua, which says what case() and perf() take.
return function(case, perf, ember, F)
  case("F.cross_entropy with ignore_index (mean over the rest)", "cross_entropy",
    function(x, t) return F.cross_entropy(x, t, {ignore_index = 1}) end,
    function(T) return {T.randn({5, 4}), T.long({0, 1, 3, 1, 2})} end)
  case("F.cross_entropy with label_smoothing 0.1 and the default ignore_index -100", "cross_entropy",
    function(x, t) return F.cross_entropy(x, t, {label_smoothing = 0.1}) end,
    function(T) return {T.randn({2, 3, 5}), T.long({{0, -100, 4}, {2, 2, 1}})} end)
  case("F.cross_entropy reduction none with label smoothing", "cross_entropy",
    function(x, t) return F.cross_entropy(x, t, {reduction = "none", label_smoothing = 0.2, ignore_index = 0}) end,
    function(T) return {T.randn({4, 3}), T.long({0, 1, 2, 1})} end)
  case("F.cross_entropy reduction sum", "cross_entropy",
    function(x, t) return F.cross_entropy(x, t, {reduction = "sum"}) end,
    function(T) return {T.randn({3, 6}), T.ids({3}, 6)} end)
  case("F.mse_loss mean, target broadcast", "mse_loss",
    function(x, y) return F.mse_loss(x, y) end,
    function(T) return {T.randn({3, 4}), T.randn({4})} end)
  case("F.mse_loss none", "mse_loss",
    function(x, y) return F.mse_loss(x, y, {reduction = "none"}) end,
    function(T) return {T.randn({2, 3}), T.randn({2, 3})} end)
  case("F.l1_loss sum (inputs kept away from x == y)", "l1_loss",
    function(x) return F.l1_loss(x, x:detach() * 0, {reduction = "sum"}) end,
    function(T) return {T.away({3, 4}, {0}, 0.1)} end)
  case("F.mse_loss sum, input broadcast to the target's shape, both differentiated", "mse_loss",
    function(x, y) return F.mse_loss(x, y, {reduction = "sum"}) end,
    function(T) return {T.randn({5}), T.randn({2, 5})} end)
  case("F.l1_loss mean, target broadcast and differentiated (|x| >= 0.1, |y| <= 0.05)", "l1_loss",
    function(x, y) return F.l1_loss(x, y) end,
    function(T) return {T.away({3, 4}, {0}, 0.1), T.uniform({4}, -0.05, 0.05)} end)
  case("F.l1_loss none (|x| >= 0.1, |y| <= 0.05)", "l1_loss",
    function(x, y) return F.l1_loss(x, y, {reduction = "none"}) end,
    function(T) return {T.away({2, 7}, {0}, 0.1), T.uniform({2, 7}, -0.05, 0.05)} end)
  case("F.nll_loss (N, C) with weight and ignore_index", "nll_loss",
    function(x, w, t) return F.nll_loss(x, t, {weight = w, ignore_index = 2}) end,
    function(T) return {T.randn({5, 4}), T.uniform({4}, 0.5, 2), T.long({0, 2, 3, 1, 3})} end)
  case("F.nll_loss (N, C, d) reduction none", "nll_loss",
    function(x, t) return F.nll_loss(x, t, {reduction = "none"}) end,
    function(T) return {T.randn({2, 3, 4}), T.long({{0, 1, 2, 2}, {1, 0, -100, 2}})} end)
  case("F.binary_cross_entropy_with_logits mean", "binary_cross_entropy_with_logits",
    function(x, y) return F.binary_cross_entropy_with_logits(x, y) end,
    function(T) return {T.randn({3, 4}), T.uniform({3, 4}, 0, 1)} end)
  case("F.binary_cross_entropy_with_logits with pos_weight and weight, sum", "binary_cross_entropy_with_logits",
    function(x, y, pw, w) return F.binary_cross_entropy_with_logits(x, y, {pos_weight = pw, weight = w, reduction = "sum"}) end,
    function(T) return {T.randn({2, 3}), T.uniform({2, 3}, 0, 1), T.uniform({3}, 0.5, 3), T.uniform({2, 3}, 0.5, 1.5)} end)
  case("F.binary_cross_entropy_with_logits none, weight row, pos_weight scalar, target broadcast", "binary_cross_entropy_with_logits",
    function(x, y, w, pw) return F.binary_cross_entropy_with_logits(x, y, {weight = w, pos_weight = pw, reduction = "none"}) end,
    function(T) return {T.randn({3, 5}), T.uniform({5}, 0, 1), T.uniform({5}, 0.5, 1.5), T.uniform({1}, 0.5, 3)} end)
  case("F.nll_loss (N, C) sum with weight", "nll_loss",
    function(x, w, t) return F.nll_loss(x, t, {weight = w, reduction = "sum"}) end,
    function(T) return {T.randn({6, 3}), T.uniform({3}, 0.5, 2), T.long({0, 2, 2, 1, 0, 2})} end)
  case("F.gelu approximate tanh", "gelu_tanh",
    function(x) return F.gelu(x, {approximate = "tanh"}) end,
    function(T) return {T.randn({3, 5})} end)

  perf("cross_entropy", "cross_entropy (8192, 50304) logits, label smoothing 0.1",
    function(x, t) return F.cross_entropy(x, t, {label_smoothing = 0.1}) end,
    function(T) return {T.randn({8192, 50304}), T.ids({8192}, 50304)} end, {backward = true, device = "cuda",
    torch = "F.cross_entropy(a, b, label_smoothing=0.1)"})
  perf("cross_entropy", "cross_entropy (512, 8192) logits, label smoothing 0.1, on the CPU",
    function(x, t) return F.cross_entropy(x, t, {label_smoothing = 0.1}) end,
    function(T) return {T.randn({512, 8192}), T.ids({512}, 8192)} end, {backward = true, device = "cpu", dtypes = {"f32"}})
  perf("nll_loss", "nll_loss (8192, 1024) log-probs", function(x, t) return F.nll_loss(x, t) end,
    function(T) return {T.randn({8192, 1024}), T.ids({8192}, 1024)} end, {backward = true, device = "cuda",
    torch = "F.nll_loss(a, b)"})
  perf("mse_loss", "mse_loss of 2^24 elements", function(x, y) return F.mse_loss(x, y) end,
    function(T) return {T.randn({4096, 4096}), T.randn({4096, 4096})} end, {backward = true, device = "cuda",
    torch = "F.mse_loss(a, b)"})
  perf("l1_loss", "l1_loss of 2^24 elements", function(x, y) return F.l1_loss(x, y) end,
    function(T) return {T.randn({4096, 4096}), T.randn({4096, 4096})} end, {backward = true, device = "cuda",
    torch = "F.l1_loss(a, b)"})
  -- 2^26 elements: past the H100's 50 MB L2, as sum's (issue 12's bandwidth bar)
  perf("mse_loss", "mse_loss of 2^26 elements", function(x, y) return F.mse_loss(x, y) end,
    function(T) return {T.randn({8192, 8192}), T.randn({8192, 8192})} end, {backward = true, device = "cuda",
    torch = "F.mse_loss(a, b)"})
  perf("l1_loss", "l1_loss of 2^26 elements", function(x, y) return F.l1_loss(x, y) end,
    function(T) return {T.randn({8192, 8192}), T.randn({8192, 8192})} end, {backward = true, device = "cuda",
    torch = "F.l1_loss(a, b)"})
  perf("binary_cross_entropy_with_logits", "BCE with logits of 2^24 elements",
    function(x, y) return F.binary_cross_entropy_with_logits(x, y) end,
    function(T) return {T.randn({4096, 4096}), T.uniform({4096, 4096}, 0, 1)} end, {backward = true, device = "cuda",
    torch = "F.binary_cross_entropy_with_logits(a, b)"})
  perf("binary_cross_entropy_with_logits", "BCE with logits of 2^26 elements",
    function(x, y) return F.binary_cross_entropy_with_logits(x, y) end,
    function(T) return {T.randn({8192, 8192}), T.uniform({8192, 8192}, 0, 1)} end, {device = "cuda",
    torch = "F.binary_cross_entropy_with_logits(a, b)"})
  perf("gelu_tanh", "gelu tanh of 2^24 elements", function(x) return F.gelu(x, {approximate = "tanh"}) end,
    function(T) return {T.randn({4096, 4096})} end, {backward = true, device = "cuda",
    torch = "F.gelu(a, approximate='tanh')"})
  perf("gelu_tanh", "gelu tanh of 2^26 elements", function(x) return F.gelu(x, {approximate = "tanh"}) end,
    function(T) return {T.randn({8192, 8192})} end, {device = "cuda", torch = "F.gelu(a, approximate='tanh')"})
  -- nll_loss's forward is a gather (one target and one picked value a row): its default byte count (all of
  -- logp) is not what it moves; 2^26 log-probs make the backward (d logp written once) a bandwidth figure
  perf("nll_loss", "nll_loss (65536, 1024) log-probs", function(x, t) return F.nll_loss(x, t) end,
    function(T) return {T.randn({65536, 1024}), T.ids({65536}, 1024)} end, {backward = true, device = "cuda",
    torch = "F.nll_loss(a, b)"})
end
