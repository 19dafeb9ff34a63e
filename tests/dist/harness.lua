--- A tiny test harness for multi-rank specs (tests/dist/*_spec.lua), run by
-- tests/run_all.sh through `ember launch --nproc N` (2 and 3 ranks):
--
--   local T = dofile("tests/dist/harness.lua")
--   T.case("all_reduce sums", function() ... assert(...) end)
--   T.done()
--
-- Every rank runs every case; after each one the ranks agree (an all_reduce
-- of a failure flag) so a case fails when it fails on any rank. Rank 0 prints
-- "ok"/"FAIL" lines and last `dist: N passed, M failed`, the line run_all.sh
-- adds to the totals; a failing rank prints its own error and traceback.
local ember = require "ember"
local dist = ember.dist
if not dist.is_initialized() then dist.init() end

local T = {passed = 0, failed = 0, rank = dist.rank(), world = dist.world_size()}

function T.case(name, fn)
  local ok, err = xpcall(fn, debug.traceback)
  if not ok then io.stderr:write(("rank %d: FAIL %s: %s\n"):format(T.rank, name, tostring(err))) end
  local flag = ember.tensor({ok and 0 or 1}, {dtype = "i32"})
  dist.all_reduce(flag, {op = "max"})
  local all_ok = flag:item() == 0
  if all_ok then T.passed = T.passed + 1 else T.failed = T.failed + 1 end
  if T.rank == 0 then
    print((all_ok and "ok   " or "FAIL ") .. name .. (all_ok and "" or " (see the failing rank's error above)"))
    io.stdout:flush()
  end
end

--- Assert that fn raises an error whose message contains `needle` (plain text).
function T.raises(fn, needle)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error containing '" .. needle .. "', but the call succeeded")
  err = tostring(err)
  assert(err:find(needle, 1, true), ("expected an error containing '%s', got: %s"):format(needle, err))
  return err
end

--- Assert two tensors (or numbers) agree elementwise within tol (absolute).
function T.close(a, b, tol, what)
  tol = tol or 0
  local x = type(a) == "number" and {a} or a:to("f64"):flatten():tolist()
  local y = type(b) == "number" and {b} or b:to("f64"):flatten():tolist()
  assert(#x == #y, ("%s: %d elements vs %d"):format(what or "close", #x, #y))
  for i = 1, #x do
    if not (math.abs(x[i] - y[i]) <= tol) then
      error(("%s: element %d is %.17g, expected %.17g (tol %g)"):format(what or "close", i, x[i], y[i], tol), 2)
    end
  end
end

function T.done()
  if T.rank == 0 then print(("dist: %d passed, %d failed"):format(T.passed, T.failed)) end
  io.stdout:flush()
  dist.destroy()
  os.exit(T.failed == 0 and 0 or 1)
end

return T
