--- CPU reduction results written out for a bit-for-bit comparison of two builds
-- (issue 17: a faster kernel must give the bits the old one gave). Every case
-- (bf16 and f32 inputs of 26 shapes around the lane, step, sub-block, pass and
-- block edges; values spanning 2^0, 2^80 and 2^200 so a double sum's order
-- shows; integers with NaN, inf, -0 and ties) is saved as one .npy file:
--
--   old/build-cpu/ember run scripts/reduce_bits_cpu.lua /tmp/bits_old 1
--   build-cpu/ember run scripts/reduce_bits_cpu.lua /tmp/bits_new 3
--   for f in /tmp/bits_old/*.npy; do cmp -s $f /tmp/bits_new/${f##*/} || echo DIFF $f; done
local ember = require "ember"
local out, threads = arg[1], tonumber(arg[2] or 1)
ember.set_num_threads(threads)
os.execute("mkdir -p " .. out)
local function wide(shape, span)
  local e = ember.randint(-span, span + 1, shape):to("f32")
  return (ember.randn(shape) * ember.pow(2, e))
end
local function save(name, t)
  if t.dtype == "bf16" then t = t:to("f32") end
  ember.save_npy(out .. "/" .. name .. ".npy", t:contiguous())
end
local n = 0
local function cases(tag, x)
  save(tag .. "_sum", x:sum()); save(tag .. "_sumlast", x:sum(-1)); save(tag .. "_meanlast", x:mean(-1))
  save(tag .. "_sum0", x:sum(0))
  if x.dtype ~= "f64" then
    local v, i = x:max(-1); save(tag .. "_maxv", v); save(tag .. "_maxi", i)
    v, i = x:min(-1); save(tag .. "_minv", v); save(tag .. "_mini", i)
    save(tag .. "_maxall", x:max()); save(tag .. "_minall", x:min())
    save(tag .. "_amax", x:amax(-1))
  end
  n = n + 1
end
ember.manual_seed(7)
ember.no_grad(function()
  local shapes = {{3, 1}, {3, 7}, {5, 31}, {5, 32}, {5, 33}, {4, 63}, {4, 64}, {4, 65}, {3, 255}, {3, 256}, {3, 257},
    {2, 300}, {3, 1023}, {3, 4095}, {3, 4096}, {3, 4097}, {2, 8191}, {2, 8193}, {2, 32767}, {2, 32768}, {2, 32769},
    {1, 100003}, {9, 4100}, {260, 33}, {1000, 300}, {17, 4096}}
  for _, s in ipairs(shapes) do
    for _, span in ipairs({0, 40, 100}) do
      local x = wide(s, span)
      local tag = ("%dx%d_s%d"):format(s[1], s[2], span)
      cases(tag .. "_bf16", x:to("bf16"))
      cases(tag .. "_f32", x)
      -- specials: NaN, inf, -0, ties (small-integer values repeat)
      local y = ember.randint(-3, 4, s):to("f32")
      local m = ember.rand(s)
      y = y:masked_fill(m:lt(0.01), 0/0):masked_fill(m:gt(0.995), 1/0):masked_fill(m:lt(0.2):logical_and(y:eq(0)), -0.0)
      cases(tag .. "_sp_bf16", y:to("bf16"))
      local z = ember.randint(-3, 4, s):to("f32"):masked_fill(ember.rand(s):lt(0.3), -0.0)
      cases(tag .. "_ties_bf16", z:to("bf16"))
      cases(tag .. "_ties_f32", z)
    end
  end
end)
print("cases", n)
