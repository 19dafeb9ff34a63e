-- data_spec.lua (GPU) — ember.data on CUDA: batches put on the device from
-- CPU tokens, and from tokens already there, equal the CPU's under one seed.
local ember = require "ember"

describe("ember.data on CUDA", function()
  it("get_batch with device = 'cuda' gives the CPU's windows, on the GPU", function()
    local tokens = ember.randint(0, 50257, {50000}):to("u16")
    ember.manual_seed(5)
    local xc, yc = ember.data.get_batch(tokens, 16, 128)
    ember.manual_seed(5)
    local xg, yg = ember.data.get_batch(tokens, 16, 128, {device = "cuda"})
    assert.are.equal("cuda:0", xg.device)
    assert.same(xc:tolist(), xg:cpu():tolist())
    assert.same(yc:tolist(), yg:cpu():tolist())
    ember.manual_seed(5)
    local xd = ember.data.get_batch(tokens:to({dtype = "i32", device = "cuda"}), 16, 128)
    assert.are.equal("cuda:0", xd.device)
    assert.same(xc:tolist(), xd:cpu():tolist())
  end)

  it("batches walks the same windows on the GPU", function()
    local tokens = ember.arange(1001):cuda()
    local n = 0
    for x, y in ember.data.batches(tokens, 3, 100) do
      assert.are.equal("cuda:0", x.device)
      assert.are.equal(0, (y:narrow(1, 0, 99) - x:narrow(1, 1, 99)):abs():sum():item())
      n = n + x.shape[1]
    end
    assert.are.equal(10, n)
  end)
end)
