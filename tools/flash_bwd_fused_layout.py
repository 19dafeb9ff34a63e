#!/usr/bin/env python3
"""The index and layout logic of kernels/flash_bwd_fused.cu's new matmuls, replayed on
integers (no GPU; docs/flash.md "Step 5"): the consumers' dSᵀ accumulators, packed to A
fragments (pack_a) and stored by store_ds into a 128-byte-swizzled [key][query] tile; dq =
dS · k read through wgmma descriptors (issue_dq: A M-major from that tile, B N-major from the
TMA-loaded k, each consumer D/2 columns, at D 64 the descriptor 64 bytes into the rows); dk +=
dSᵀ q (issue_dk: A K-major from the same tile, B the q tile N-major); the accumulator layout
and add_dq's lane exchange and addresses into dq_accum; and Step 5b's bulk path: store_dq_half's order in the
shared half buffers, copied as is into dq_accum's tile and decoded by flash_dq_convert_kernel's bulk form (every
element once, rows past a Tq tail of 37 or 9 skipped). Checked against dS·k and dSᵀ·q computed directly, at D 64
and 128. The hardware model it assumes (stated, and the part only the GPU spec can confirm):
  - TMA writes box element (r, c) (64 columns a box, 16-bit) at base + 128 r + 2 c, swizzled;
  - a descriptor reads K-major element (mn, k) at start + SBO (mn / 8) + 128 (mn % 8) + 2 k, and
    MN-major element (mn, k) at start + LBO (mn / 64) + SBO (k / 8) + 128 (k % 8) + 2 (mn % 64),
    swizzled; the wgmma's k step advances start by 32 bytes (K-major) or 2048 (MN-major);
  - the 128-byte swizzle XORs address bits 4-6 with bits 7-9 (tiles 1024-byte aligned);
  - accumulator i of lane (g, t) of warp w: row 16 w + g + 8 ((i / 2) % 2), column 8 (i / 4) + 2 t + i % 2.
These are the rules the forward and the wg/wg2 backwards already run on (K-major ss, N-major rs);
the new parts are the M-major A (the transpose flag on A) and the 64-byte start offset.
Step 10 (EMBER_FLASH_DET_STORE_FIRST): the TOUCHED conversion's counter index of every float4, against the counter
the writer bumps for the tile half that holds it (and a conversion reading the other half's is caught).
Run: python3 tools/flash_bwd_fused_layout.py (exit status 0 when all match)
"""
import random
import sys

RES, STR = 128, 64


def swz(addr):
    return addr ^ (((addr >> 7) & 7) << 4)


class Smem:
    def __init__(s):
        s.m = {}

    def put(s, addr, v):          # one 16-bit element
        s.m[swz(addr)] = v

    def get(s, addr):
        return s.m[swz(addr)]


def tma_tile(sm, base, rows, mat, D):
    """mat[r][c] (rows x D) as TMA stores it: 64-column chunks at base + chunk * rows * 128."""
    for r in range(rows):
        for c in range(D):
            sm.put(base + (c // 64) * rows * 128 + r * 128 + (c % 64) * 2, mat[r][c])


def rd_kmajor(sm, start, sbo, mn, k):
    return sm.get(start + (mn // 8) * sbo + (mn % 8) * 128 + k * 2)


def rd_mnmajor(sm, start, lbo, sbo, mn, k):
    return sm.get(start + (mn // 64) * lbo + (k // 8) * sbo + (k % 8) * 128 + (mn % 64) * 2)


def acc_pos(w, lane, i):
    g, t = lane >> 2, lane & 3
    return 16 * w + g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * t + (i & 1)


def check(D, seed, broken=None):
    rnd = random.Random(seed)
    sm = Smem()
    sK = 0
    ds_base = 1 << 20                         # a 1024-aligned buffer
    sQ = 2 << 20
    K = [[rnd.randint(-3, 3) for _ in range(D)] for _ in range(RES)]
    Qt = [[rnd.randint(-3, 3) for _ in range(D)] for _ in range(STR)]
    dST = [[rnd.randint(-3, 3) for _ in range(STR)] for _ in range(RES)]   # dSᵀ[key][query]
    tma_tile(sm, sK, RES, K, D)
    tma_tile(sm, sQ, STR, Qt, D)
    # each consumer's accumulators (64 keys x 64 queries), pack_a, store_ds
    for cw in range(2):
        for w in range(4):
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                c = [None] * 32
                for i in range(32):
                    r, col = acc_pos(w, lane, i)
                    c[i] = dST[cw * 64 + r][col]
                a = [[(c[8 * kk + 2 * e], c[8 * kk + 2 * e + 1]) for e in range(4)] for kk in range(4)]   # pack_a
                r0 = cw * 64 + w * 16 + g
                row, sw = ds_base + r0 * 128, r0 & 7
                for kk in range(4):
                    for h in range(2):
                        at = row + ((((2 * kk + h) ^ (0 if broken == 'no-swizzle' else sw))) << 4) + 4 * t
                        for word, addr in ((a[kk][2 * h], at), (a[kk][2 * h + 1], at + 8 * 128)):
                            # st.shared.b32 at a physical address: undo the swizzle the reader applies
                            sm.m[addr] = word[0]
                            sm.m[addr + 2] = word[1]
    bad = 0
    tiles_bulk = []
    for cw in range(2):
        # issue_dq: A = dS (m = query, k = key) M-major at ds + 2048 kk; B = k (k = key, n = column) N-major
        kb = sK + (cw * (D // 2) // 64) * RES * 128 + (0 if broken == 'no-offset' else (cw * (D // 2) % 64) * 2)
        N = D // 2
        dq = [[0] * N for _ in range(64)]
        for kk in range(RES // 16):
            for m in range(64):
                for n in range(N):
                    s = 0
                    for k in range(16):
                        a = rd_mnmajor(sm, ds_base + kk * 16 * 128, RES * 128, 1024, m, k)
                        b = rd_mnmajor(sm, kb + kk * 16 * 128, RES * 128, 1024, n, k)
                        s += a * b
                    dq[m][n] += s
        # add_dq: lanes t, t ^ 1 trade a pair (shfl.xor 1), then one 4-float add each into dq_accum (row
        # stride D), this consumer's columns
        got = {}
        for w in range(4):
            accs = {}
            for lane in range(32):
                accs[lane] = [dq[acc_pos(w, lane, i)[0]][acc_pos(w, lane, i)[1]] for i in range(D // 4)]
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                odd = t & 1
                r0 = 16 * w + g
                row = r0 + (8 if odd else 0)
                c0 = 2 * (t & ~1)
                a, p = accs[lane], accs[lane ^ 1]
                for m in range(D // 16):
                    # the partner sends (odd partner: its a[0], a[1]; even partner: its a[2], a[3])
                    pod = (t ^ 1) & 1
                    x0, x1 = (p[4 * m], p[4 * m + 1]) if pod else (p[4 * m + 2], p[4 * m + 3])
                    v = [x0, x1, a[4 * m + 2], a[4 * m + 3]] if odd else [a[4 * m], a[4 * m + 1], x0, x1]
                    for e in range(4):
                        key = (row, cw * (D // 2) + 8 * m + c0 + e)
                        if key in got:
                            bad += 1   # two adds to one element
                        got[key] = v[e]
        for q in range(64):
            for n in range(N):
                want = sum(dST[key][q] * K[key][cw * N + n] for key in range(RES))
                if got.get((q, cw * N + n)) != want:
                    bad += 1
        # the bulk path (Step 5b): store_dq_half puts float4 m of thread tid at float 4 (128 m + tid) of the
        # consumer's half; the bulk reduce copies the half as it is to float cw · 32 D of the tile's region of
        # dq_accum; flash_dq_convert_kernel (bulk) decodes one float4 a thread
        tilebuf = {}
        for w in range(4):
            for lane in range(32):
                tid = 32 * w + lane
                acc = [dq[acc_pos(w, lane, i)[0]][acc_pos(w, lane, i)[1]] for i in range(D // 4)]
                for m in range(D // 16):
                    for e in range(4):
                        at = cw * 32 * D + 4 * (128 * m + tid) + e
                        if at in tilebuf:
                            bad += 1
                        tilebuf[at] = acc[4 * m + e]
        tiles_bulk.append(tilebuf)
        # issue_dk: A = this consumer's dSᵀ rows (m = key, k = query) K-major, B = q (k = query, n = d) N-major
        for m in range(64):
            for n in range(D):
                s = 0
                for kk in range(STR // 16):
                    for k in range(16):
                        a = sm.get(ds_base + cw * 64 * 128 + kk * 32 + (m // 8) * 1024 + (m % 8) * 128 + k * 2)
                        b = rd_mnmajor(sm, sQ + kk * 16 * 128, STR * 128, 1024, n, k)
                        s += a * b
                want = sum(dST[cw * 64 + m][q] * Qt[q][n] for q in range(STR))
                if s != want:
                    bad += 1
    # flash_dq_convert_kernel's bulk index arithmetic (one tile: bh = 0, mt = 0, Tq = 64 or a tail), against
    # dS · k directly
    region = {}
    for tb in tiles_bulk:
        for at, x in tb.items():
            if at in region:
                bad += 1
            region[at] = x
    if sorted(region) != list(range(64 * D)):
        bad += 1
    for tq in (64, 37, 9):
        out = convert_tiled(region, D, tq, broken)
        for q in range(64):
            for col in range(D):
                want = sum(dST[key][q] * K[key][col] for key in range(RES)) if q < tq else None
                if out.get((q, col)) != want:
                    bad += 1
    return bad


def convert_tiled(region, D, tq, broken=None):
    """flash_dq_convert_kernel (bulk) for one 64-query tile (tqp = 64, b·H + h = 0): {(row, col): value}."""
    out = {}
    for idx in range(64 * D // 4):
        tid, m = idx % 128, idx // 128 % (D // 16)
        half = idx // (128 * (D // 16))
        tile, cw = half >> 1, half & 1
        assert tile == 0
        i = 16 * (tid >> 5) + ((tid & 31) >> 2)
        c = cw * (D // 2) + 8 * m + 2 * (tid & 3)
        if i >= tq:
            continue
        v = [region[4 * idx + e] for e in range(4)]
        out[(i, c)], out[(i, c + 1)] = v[0], v[1]
        if i + 8 < tq:
            r2 = i + (0 if broken == 'no-row8' else 8)
            out[(r2, c)], out[(r2, c + 1)] = v[2], v[3]
    return out


def touched_counters(D, broken=None):
    """EMBER_FLASH_DET_STORE_FIRST (docs/flash.md "Step 10"): the TOUCHED conversion reads, for the float4 at
    4·idx of copy c, counter c·nacc / (STR·D/2) + half (half = idx / (128·D/16)); it must be the counter the writer
    bumps for the tile half that holds it — counter(jt, h) = c·(B·H·(tqp/STR)·2) + (bh·(tqp/STR) + mt)·2 + h — with
    the element inside that half's range of dq_accum (dst = ((bh·(tqp/STR) + mt)·STR·D) + h·STR·D/2). Mismatches."""
    bad = 0
    for B, H, tqp, chains in ((1, 1, 64, 1), (2, 3, 192, 2), (1, 4, 128, 3)):
        nacc = B * H * tqp * D
        ntile = tqp // STR
        for c in range(chains):
            for idx in range(nacc // 4):
                half = idx // (128 * (D // 16))
                conv = c * nacc // (STR * D // 2) + (half if broken != 'half-off' else half ^ 1)
                at = 4 * idx
                tile, h = (at // (STR * D)), (at % (STR * D)) // (STR * D // 2)   # the writer's tile and half
                bh, mt = tile // ntile, tile % ntile
                if conv != c * (B * H * ntile * 2) + (bh * ntile + mt) * 2 + h:
                    bad += 1
    return bad


def main():
    total = 0
    for D in (64, 128):
        b = check(D, 1000 + D)
        t = touched_counters(D)
        print('D %d: %d mismatches, %d in store first\'s counter indices' % (D, b, t))
        total += b + t
    if touched_counters(64, 'half-off') == 0:
        print('a conversion reading the other half\'s counter not caught')
        total += 1
    # it must see these break: dSᵀ stored unswizzled, D 64's second consumer without the 64-byte offset, and the
    # tiled conversion writing a float4's second row to the first
    caught = check(128, 7, 'no-swizzle') > 0 and check(64, 7, 'no-offset') > 0 and check(64, 7, 'no-row8') > 0
    print('broken layouts caught:', caught)
    return 0 if total == 0 and caught else 1


if __name__ == '__main__':
    sys.exit(main())
