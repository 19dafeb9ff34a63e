-- flash_bwd_wg_model.lua — the tile logic of kernels/flash_bwd_wg.cu replayed
-- on scalars in f64 (plain Lua 5.4, no Ember, no GPU): the dk/dv blocks of
-- 128 keys split over two 64-key consumers, the q tiles of 64 rows from
-- qstart over every q head of the group, the causal skip of whole tiles, the
-- per-warp diagonal mask on one offset per tile (e0 > 8m + bit), lse = +inf
-- and Δ = 0 past Tq, TMA's zero rows; the dq blocks of 128 queries, 64-key
-- tiles up to kend, the per-warp edge mask. Checked against the gradients
-- from the full P matrix, to 1e-9, for the masks, GQA, Tq ≠ Tk and ragged
-- lengths. A check of the index logic only (the wgmma layouts and
-- descriptors are the forward's, run on an H100); written before the kernels
-- ran on a GPU. Breaking a condition (the skip, the diagonal offset) fails it.
--     lua5.4 tools/flash_bwd_wg_model.lua
local LOG2E = 1.4426950408889634
local function randn() return (math.random() - 0.5) * 2 end
local function run(B, H, Hkv, Tq, Tk, D, causal_mode)
  local group = H // Hkv
  local causal = causal_mode ~= "none"
  local off = causal_mode == "bottom_right" and Tk - Tq or 0
  local scale = 1 / math.sqrt(D)
  local function mat(n, m) local t = {} for i = 0, n - 1 do t[i] = {} for d = 0, m - 1 do t[i][d] = randn() end end return t end
  local q, dO, k, v = {}, {}, {}, {}
  for h = 0, H - 1 do q[h] = mat(Tq, D); dO[h] = mat(Tq, D) end
  for h = 0, Hkv - 1 do k[h] = mat(Tk, D); v[h] = mat(Tk, D) end
  local function dot(a, b) local s = 0 for d = 0, D - 1 do s = s + a[d] * b[d] end return s end
  local function seen(i, j) return (not causal) or j <= i + off end
  -- reference: P, lse, o, delta, grads
  local lse, delta, rdq, rdk, rdv = {}, {}, {}, {}, {}
  for h = 0, Hkv - 1 do rdk[h] = {} rdv[h] = {} for j = 0, Tk - 1 do rdk[h][j] = {} rdv[h][j] = {} for d = 0, D - 1 do rdk[h][j][d] = 0 rdv[h][j][d] = 0 end end end
  for h = 0, H - 1 do
    local hk = h // group
    lse[h], delta[h], rdq[h] = {}, {}, {}
    for i = 0, Tq - 1 do
      local m, sum = -math.huge, 0
      local s = {}
      for j = 0, Tk - 1 do if seen(i, j) then s[j] = dot(q[h][i], k[hk][j]) * scale; if s[j] > m then m = s[j] end end end
      for j = 0, Tk - 1 do if s[j] then sum = sum + math.exp(s[j] - m) end end
      lse[h][i] = m + math.log(sum)
      local o = {} for d = 0, D - 1 do o[d] = 0 end
      local P = {}
      for j = 0, Tk - 1 do if s[j] then P[j] = math.exp(s[j] - lse[h][i]); for d = 0, D - 1 do o[d] = o[d] + P[j] * v[hk][j][d] end end end
      delta[h][i] = dot(o, dO[h][i])
      rdq[h][i] = {} for d = 0, D - 1 do rdq[h][i][d] = 0 end
      for j = 0, Tk - 1 do if P[j] then
        local dp = dot(dO[h][i], v[hk][j])
        local ds = P[j] * (dp - delta[h][i])
        for d = 0, D - 1 do
          rdv[hk][j][d] = rdv[hk][j][d] + P[j] * dO[h][i][d]
          rdk[hk][j][d] = rdk[hk][j][d] + ds * q[h][i][d] * scale
          rdq[h][i][d] = rdq[h][i][d] + ds * k[hk][j][d] * scale
        end
      end end
    end
  end
  local function qrow(h, i) return i < Tq and q[h][i] or nil end
  -- dk/dv kernel model
  local RES, STR = 128, 64
  local gdk, gdv = {}, {}
  for hk = 0, Hkv - 1 do gdk[hk] = {} gdv[hk] = {} end
  local nblk = (Tk + RES - 1) // RES
  for kb = 0, nblk - 1 do
    for hk = 0, Hkv - 1 do
      local k0 = kb * RES
      local qstart = causal and (math.max(0, k0 - off) // STR) * STR or 0
      local nq = math.max(0, (Tq - qstart + STR - 1) // STR)
      local ntile = group * nq
      for cw = 0, 1 do
        local kw0 = k0 + cw * 64
        local dk, dv = {}, {}
        for r = 0, 63 do dk[r] = {} dv[r] = {} for d = 0, D - 1 do dk[r][d] = 0 dv[r][d] = 0 end end
        for j = 0, ntile - 1 do
          local hg = j // nq
          local i0 = qstart + (j - hg * nq) * STR
          local h = hk * group + hg
          local i0c = qstart + (j % nq) * STR   -- the consumer's formula
          assert(i0c == i0)
          if not (causal and kw0 > i0 + STR - 1 + off) then
            for warp = 0, 3 do for g = 0, 7 do for half = 0, 1 do
              local r = warp * 16 + g + 8 * half
              local key = kw0 + r
              local key0 = kw0 + warp * 16 + g
              local diag = causal and kw0 + warp * 16 + 15 > i0 + off
              for t = 0, 3 do
                local e0 = key0 - i0 - off - 2 * t
                for m = 0, 7 do for bit = 0, 1 do
                  local c = 8 * m + 2 * t + bit
                  local qi = i0 + c
                  local kk = key < Tk and k[hk][key] or nil
                  local qq = qi < Tq and q[h][qi] or nil
                  local s = (kk and qq) and dot(kk, qq) or 0
                  local l2 = qi < Tq and lse[h][qi] * LOG2E or math.huge
                  local pr = 2 ^ (s * scale * LOG2E - l2)
                  if diag then
                    local e = half == 1 and e0 + 8 or e0
                    if e > 8 * m + bit then pr = 0 end
                  end
                  local vv = key < Tk and v[hk][key] or nil
                  local oo = qi < Tq and dO[h][qi] or nil
                  local dp = (vv and oo) and dot(vv, oo) or 0
                  local dl = qi < Tq and delta[h][qi] or 0
                  local ds = pr * (dp - dl)
                  for d = 0, D - 1 do
                    dv[r][d] = dv[r][d] + pr * (oo and oo[d] or 0)
                    dk[r][d] = dk[r][d] + ds * (qq and qq[d] or 0)
                  end
                end end
              end
            end end end
          end
        end
        for r = 0, 63 do
          local key = kw0 + r
          if key < Tk then
            gdk[hk][key] = {} gdv[hk][key] = {}
            for d = 0, D - 1 do gdk[hk][key][d] = dk[r][d] * scale; gdv[hk][key][d] = dv[r][d] end
          end
        end
      end
    end
  end
  -- dq kernel model
  local gdq = {}
  for h = 0, H - 1 do gdq[h] = {} end
  local nqb = (Tq + RES - 1) // RES
  for bx = 0, nqb - 1 do
    local qblk = nqb - 1 - bx
    for h = 0, H - 1 do
      local hk = h // group
      local q0 = qblk * RES
      local kend = causal and math.min(Tk, q0 + RES + off) or Tk
      local ntile = math.max(0, (kend + STR - 1) // STR)
      for cw = 0, 1 do
        local qw0 = q0 + cw * 64
        local dq = {}
        for r = 0, 63 do dq[r] = {} for d = 0, D - 1 do dq[r][d] = 0 end end
        for j = 0, ntile - 1 do
          local k0 = j * STR
          if not (causal and k0 > qw0 + 63 + off) then
            for warp = 0, 3 do
              local wrow = qw0 + warp * 16
              local edge = k0 + STR > Tk or (causal and k0 + STR - 1 > wrow + off)
              for g = 0, 7 do for half = 0, 1 do
                local r = warp * 16 + g + 8 * half
                local row = wrow + g + 8 * half
                local l = row < Tq and lse[h][row] * LOG2E or math.huge
                local dl = row < Tq and delta[h][row] or 0
                for c = 0, STR - 1 do
                  local col = k0 + c
                  local qq = row < Tq and q[h][row] or nil
                  local kk = col < Tk and k[hk][col] or nil
                  local s = (qq and kk) and dot(qq, kk) or 0
                  local pr = 2 ^ (s * scale * LOG2E - l)
                  if edge and (col >= Tk or (causal and col > row + off)) then pr = 0 end
                  local oo = row < Tq and dO[h][row] or nil
                  local vv = col < Tk and v[hk][col] or nil
                  local dp = (oo and vv) and dot(oo, vv) or 0
                  local ds = pr * (dp - dl)
                  for d = 0, D - 1 do dq[r][d] = dq[r][d] + ds * (kk and kk[d] or 0) end
                end
              end end
            end
          end
        end
        for r = 0, 63 do
          local row = qw0 + r
          if row < Tq then gdq[h][row] = {} for d = 0, D - 1 do gdq[h][row][d] = dq[r][d] * scale end end
        end
      end
    end
  end
  -- compare
  local worst = 0
  local function cmp(a, b, n, what)
    for i = 0, n - 1 do
      assert(a[i], what .. " row " .. i .. " never written")
      for d = 0, D - 1 do local e = math.abs(a[i][d] - b[i][d]); if e > worst then worst = e end end
    end
  end
  for h = 0, H - 1 do cmp(gdq[h], rdq[h], Tq, "dq") end
  for h = 0, Hkv - 1 do cmp(gdk[h], rdk[h], Tk, "dk"); cmp(gdv[h], rdv[h], Tk, "dv") end
  print(string.format("H %d Hkv %d Tq %d Tk %d D %d %-12s max |err| %.3g", H, Hkv, Tq, Tk, D, causal_mode, worst))
  assert(worst < 1e-9, "mismatch")
end
math.randomseed(7)
for _, c in ipairs({{2, 2, 65, 65}, {2, 2, 257, 257}, {4, 2, 100, 300}, {4, 2, 300, 100}, {6, 2, 200, 170},
                    {2, 1, 17, 400}, {2, 2, 1, 1}, {2, 2, 130, 129}}) do
  for _, m in ipairs({"top_left", "bottom_right", "none"}) do
    if not (m == "bottom_right" and c[3] > c[4]) then run(1, c[1], c[2], c[3], c[4], 3, m) end
  end
end
