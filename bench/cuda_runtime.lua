-- bench/cuda_runtime.lua — bandwidth of the CUDA runtime's copies, fills and
-- RNG, and the host cost of the caching allocator (kernels/copy.cu, rng.cu,
-- alloc.cu). One line per case: ms per call (CUDA events) and GB/s of
-- bytes read + written. Run on a GPU host:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" lua5.4 bench/cuda_runtime.lua
local ember = require "ember"
local cuda = ember.cuda
local core = require "ember.core"

local function time_ms(reps, fn)
  fn(); cuda.synchronize()
  local a, b = cuda.Event{enable_timing = true}, cuda.Event{enable_timing = true}
  a:record()
  for _ = 1, reps do fn() end
  b:record(); b:synchronize()
  return a:elapsed_time(b) / reps
end
local function line(name, ms, bytes)
  print(("%-34s %9.3f ms %8.1f GB/s"):format(name, ms, bytes / ms / 1e6))
end

print(cuda.device_name())
local N = 64 * 1024 * 1024
local x = ember.randn(N, {device = "cuda"})
local xb = ember.empty(N, {device = "cuda", dtype = "bf16"})
local y = ember.empty(N, {device = "cuda"})
line("copy f32 -> f32 (memcpy) 256 MiB", time_ms(20, function() y:copy_(x) end), N * 8)
line("convert f32 -> bf16 64M", time_ms(20, function() xb:copy_(x) end), N * 6)
line("convert bf16 -> f32 64M", time_ms(20, function() x:copy_(xb) end), N * 6)
line("fill f32 64M", time_ms(20, function() x:fill_(1.5) end), N * 4)
local m, mt = ember.randn(8192, 8192, {device = "cuda"}), ember.empty(8192, 8192, {device = "cuda"})
line("transpose f32 8192x8192", time_ms(10, function() mt:copy_(m:t()) end), 8192 * 8192 * 8)
line("broadcast row f32 8192x8192", time_ms(10, function() mt:copy_(m:narrow(0, 0, 1)) end), 8192 * 8192 * 4)
line("randn f32 64M", time_ms(10, function() x:normal_(0, 1) end), N * 4)
line("rand bf16 64M", time_ms(10, function() xb:uniform_(0, 1) end), N * 2)
line("trunc_normal_ f32 64M", time_ms(5, function() x:trunc_normal_(0, 0.02, -0.04, 0.04) end), N * 4)
local h = ember.randn(N)
local hp = h:pin_memory()
line("H2D pageable 256 MiB", time_ms(3, function() x:copy_(h) end), N * 4)
line("H2D pinned 256 MiB", time_ms(3, function() x:copy_(hp) end), N * 4)
line("D2H pageable 256 MiB", time_ms(3, function() h:copy_(x) end), N * 4)
line("D2H pinned 256 MiB", time_ms(3, function() hp:copy_(x) end), N * 4)
-- allocator: host time per empty()+free of a cached block (no kernel)
collectgarbage(); collectgarbage("stop")
local t0 = core.clock()
for i = 1, 20000 do local t <close> = ember.empty(1024, {device = "cuda"}) end
local dt = core.clock() - t0
collectgarbage("restart")
print(("alloc+free (cached, 4 KiB)          %9.2f us"):format(dt / 20000 * 1e6))
local s = cuda.memory_stats()
print(("cudaMalloc calls %d, allocs %d, reserved %.0f MiB"):format(s.num_cuda_mallocs, s.num_allocs,
  s.reserved_bytes / 2 ^ 20))
