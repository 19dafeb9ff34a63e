-- shape_ops_spec.lua — repeat/rep, tile, flip, roll and diag on the CPU: values
-- against hand-written expectations (PyTorch's documented results), every
-- dtype moving bit for bit, strided inputs, gradients (the registry's cases
-- in gradcheck_spec cover more) and the error messages.

local ember = require "ember"

local function ar(n, o) return ember.arange(n, o) end

describe("repeat", function()
  it("tiles (2,2) by (2,3) as torch.Tensor.repeat does", function()
    local x = ember.tensor({{1, 2}, {3, 4}})
    assert.same({{1, 2, 1, 2, 1, 2}, {3, 4, 3, 4, 3, 4}, {1, 2, 1, 2, 1, 2}, {3, 4, 3, 4, 3, 4}},
      x:rep(2, 3):tolist())
  end)

  it("adds leading dims when given more sizes than dims", function()
    local y = ember.tensor({1, 2, 3}):rep({2, 1, 2})
    assert.same({2, 1, 6}, y.shape)
    assert.same({{{1, 2, 3, 1, 2, 3}}, {{1, 2, 3, 1, 2, 3}}}, y:tolist())
  end)

  it("is reachable under its PyTorch name as ember['repeat'] and t['repeat']", function()
    local x = ember.tensor({1, 2})
    assert.same({1, 2, 1, 2}, ember["repeat"](x, 2):tolist())
    assert.same({1, 2, 1, 2}, x["repeat"](x, 2):tolist())
  end)

  it("reads a transposed (strided) input and keeps i64 and bool exact", function()
    local x = ar(6, {dtype = "i64"}):view(2, 3):t()
    assert.same({{0, 3, 0, 3}, {1, 4, 1, 4}, {2, 5, 2, 5}}, x:rep(1, 2):tolist())
    local b = ember.tensor({true, false}, {dtype = "bool"})
    assert.same({true, false, true, false}, b:rep(2):tolist())
  end)

  it("with a zero size gives an empty tensor", function()
    assert.same({0, 3}, ember.ones(2, 3):rep(0, 1).shape)
  end)

  it("sums the copies in backward", function()
    local x = ember.tensor({1, 2, 3}, {dtype = "f64", requires_grad = true})
    local w = ar(12, {dtype = "f64"}):view(2, 6)
    local loss = (x:rep(2, 2) * w):sum()
    loss:backward()
    -- x[i] meets w[r][c] at c = i and c = i + 3, in both rows
    assert.same({0 + 3 + 6 + 9, 1 + 4 + 7 + 10, 2 + 5 + 8 + 11}, x.grad:tolist())
  end)

  it("names the op when given fewer sizes than dims or a negative size", function()
    local x = ember.ones(2, 3)
    assert.error_matches(function() x:rep(2) end,
      "repeat: expected at least as many sizes as the tensor has dims (2), got 1 (shape [2, 3])", 1, true)
    assert.error_matches(function() x:rep(1, -1) end, "repeat: expected non-negative sizes, got -1 at position 1", 1, true)
  end)
end)

describe("tile", function()
  it("pads reps in front (tile((2,3), {2}) repeats the last dim)", function()
    local x = ember.tensor({{1, 2, 3}, {4, 5, 6}})
    assert.same({{1, 2, 3, 1, 2, 3}, {4, 5, 6, 4, 5, 6}}, x:tile({2}):tolist())
  end)
  it("pads the shape when reps are longer", function()
    assert.same({{1, 2, 1, 2}, {1, 2, 1, 2}}, ember.tensor({1, 2}):tile({2, 2}):tolist())
  end)
end)

describe("flip", function()
  it("reverses one dim, several dims, negative dims", function()
    local x = ar(8):view(2, 2, 2)
    assert.same({{{1, 0}, {3, 2}}, {{5, 4}, {7, 6}}}, x:flip(-1):tolist())
    assert.same({{{6, 7}, {4, 5}}, {{2, 3}, {0, 1}}}, x:flip({0, 1}):tolist())
    assert.same({{{7, 6}, {5, 4}}, {{3, 2}, {1, 0}}}, ember.flip(x, {0, 1, 2}):tolist())
  end)

  it("reads a transposed view and keeps bf16 bits", function()
    local x = ar(6):view(2, 3):t()          -- {{0,3},{1,4},{2,5}}
    assert.same({{2, 5}, {1, 4}, {0, 3}}, x:flip(0):tolist())
    local h = ember.tensor({0.1, 0.2, 0.3}):to("bf16")
    assert.same(h:tolist(), h:flip(0):flip(0):tolist())
    assert.are.equal("bf16", h:flip(0).dtype)
  end)

  it("flips the gradient back", function()
    local x = ember.tensor({1, 2, 3}, {dtype = "f64", requires_grad = true})
    local loss = (x:flip(0) * ember.tensor({10, 20, 30}, {dtype = "f64"})):sum()
    loss:backward()
    assert.same({30, 20, 10}, x.grad:tolist())
  end)

  it("names the op for a repeated or out-of-range dim", function()
    local x = ember.ones(2, 3)
    assert.error_matches(function() x:flip({0, -2}) end, "flip: dim 0 appears multiple times in the list of dims", 1, true)
    assert.error_matches(function() x:flip(2) end, "flip: dim 2 out of range for a tensor with 2 dims", 1, true)
    assert.error_matches(function() x:flip() end, "flip: expected dims to flip", 1, true)
  end)
end)

describe("roll", function()
  it("rolls along a dim, with negative and oversized shifts", function()
    local x = ar(5)
    assert.same({3, 4, 0, 1, 2}, x:roll(2, 0):tolist())
    assert.same({2, 3, 4, 0, 1}, x:roll(-2, 0):tolist())
    assert.same({4, 0, 1, 2, 3}, x:roll(11, 0):tolist())
  end)

  it("rolls several dims, and the flattened tensor when no dims are given", function()
    local x = ar(6):view(2, 3)
    assert.same({{5, 3, 4}, {2, 0, 1}}, x:roll({1, 1}, {0, 1}):tolist())
    assert.same({{5, 0, 1}, {2, 3, 4}}, x:roll(1):tolist())   -- torch.roll(x, 1)
    assert.same({{2, 0, 1}, {5, 3, 4}}, x:roll(1, {1}):tolist())
  end)

  it("adds the shifts of a dim given twice (PyTorch rolls twice)", function()
    assert.same({2, 3, 0, 1}, ar(4):roll({1, 1}, {0, -1}):tolist())
  end)

  it("rolls the gradient back", function()
    local x = ember.tensor({1, 2, 3, 4}, {dtype = "f64", requires_grad = true})
    local loss = (x:roll(1, 0) * ember.tensor({1, 10, 100, 1000}, {dtype = "f64"})):sum()
    loss:backward()
    assert.same({10, 100, 1000, 1}, x.grad:tolist())
  end)

  it("names the op when shifts and dims do not pair up", function()
    local x = ember.ones(2, 3)
    assert.error_matches(function() x:roll({1, 2}, 0) end,
      "roll: expected as many shifts as dims, got 2 shifts and 1 dim", 1, true)
    assert.error_matches(function() x:roll({1, 2}) end, "roll: expected one shift when no dims are given", 1, true)
    assert.error_matches(function() x:roll(1, 5) end, "roll: dim 5 out of range", 1, true)
  end)
end)

describe("diag", function()
  it("puts a vector on diagonal k of a square matrix", function()
    local v = ember.tensor({1, 2})
    assert.same({{1, 0}, {0, 2}}, v:diag():tolist())
    assert.same({{0, 1, 0}, {0, 0, 2}, {0, 0, 0}}, v:diag(1):tolist())
    assert.same({{0, 0, 0}, {1, 0, 0}, {0, 2, 0}}, ember.diag(v, -1):tolist())
  end)

  it("takes diagonal k of a rectangular matrix (a copy), empty past the edge", function()
    local m = ar(12):view(3, 4)
    assert.same({0, 5, 10}, m:diag():tolist())
    assert.same({2, 7}, m:diag(2):tolist())
    assert.same({4, 9}, m:diag(-1):tolist())
    assert.same({0}, m:diag(4).shape)
    assert.is_true(m:diag():is_contiguous())
  end)

  it("reads a transposed matrix and keeps integer dtypes", function()
    local m = ar(12, {dtype = "i32"}):view(3, 4):t()   -- (4,3)
    assert.same({0, 5, 10}, m:diag():tolist())
    assert.same({1, 6, 11}, m:diag(-1):tolist())
    assert.are.equal("i32", m:diag().dtype)
  end)

  it("passes gradients between the two directions", function()
    local v = ember.tensor({1, 2}, {dtype = "f64", requires_grad = true})
    local loss = (v:diag(1) * ar(9, {dtype = "f64"}):view(3, 3)):sum()
    loss:backward()
    assert.same({1, 5}, v.grad:tolist())
    local m = ember.zeros({2, 3}, {dtype = "f64", requires_grad = true})
    local loss = (m:diag(1) * ember.tensor({7, 8}, {dtype = "f64"})):sum()
    loss:backward()
    assert.same({{0, 7, 0}, {0, 0, 8}}, m.grad:tolist())
  end)

  it("names the op for a 3-D input", function()
    assert.error_matches(function() ember.ones(2, 2, 2):diag() end,
      "diag: expected a 1-D or 2-D tensor, got 3 dims (shape [2, 2, 2])", 1, true)
  end)
end)
