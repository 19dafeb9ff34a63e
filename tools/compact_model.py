"""Sequential model of kernels/compact.cu's tile index math (mark_lb_kernel with BT tiles a block and its
look-back, select_kernel with BT tiles, select1_kernel, store_run's 16-byte runs at every alignment), checked
against a plain masked_select; the look-back sees most earlier blocks as AGG only (random), so walks past 32
blocks happen. Threads and warps are loops; no GPU. Run: python3 tools/compact_model.py (~1 min)."""
import random, itertools
class _NP:
    uint64='u'; int64='i'
    @staticmethod
    def full(n, v, dtype=None): return [v]*int(n)
    @staticmethod
    def zeros(shape, dtype=None): return [[0]*shape[1] for _ in range(shape[0])]
    @staticmethod
    def concatenate(ls): return [a for l in ls for a in l]
    @staticmethod
    def cumsum(v): return list(itertools.accumulate(v))
    nan=float('nan')
    @staticmethod
    def array_equal(a,b): return list(a)==list(b)
np=_NP()
kThreads, kTile, kWords = 256, 4096, 128
def popc(x): return bin(x & 0xffffffff).count('1')

def mark_lb(m, n, BT, V, vec):
    G, S = 32 // V, kTile // V // kThreads
    ntiles = (n + kTile - 1) // kTile
    nb = (ntiles + BT - 1) // BT
    words = np.full(ntiles * kWords, 0xdeadbeef, dtype=np.uint64)
    off = np.full(ntiles + 1, -7, dtype=np.int64)
    status = [0] * nb
    aggs = [0] * nb
    count = None
    for blk in range(nb):
        tile0 = blk * BT
        c = np.zeros((kThreads, BT), dtype=np.int64)
        if vec and (tile0 + BT) * kTile <= n:
            for b in range(BT):
                wbase = (tile0 + b) * kWords
                for j in range(S):
                    bits_t = []
                    for t in range(kThreads):
                        q = j * kThreads + t
                        e = (tile0 + b) * kTile + q * V
                        bits = 0
                        for k in range(V):
                            if m[e + k]: bits |= 1 << k
                        c[t][b] += popc(bits)
                        bits_t.append((bits << ((t & 31) % G) * V) & 0xffffffff)
                    for t in range(kThreads):  # xor-shuffle OR within aligned groups of G
                        g0 = t - (t % G)
                        acc = 0
                        for u in range(g0, g0 + G): acc |= bits_t[u]
                        if (t & 31) % G == 0:
                            q = j * kThreads + t
                            words[wbase + q * V // 32] = acc
        else:
            for b in range(BT):
                tile = tile0 + b; base = tile * kTile
                if tile >= ntiles: continue
                for j in range(kTile // kThreads):
                    for w0 in range(0, kThreads, 32):
                        bal = 0
                        for lane in range(32):
                            t = w0 + lane; e = j * kThreads + t
                            bit = base + e < n and m[base + e]
                            if bit: bal |= 1 << lane; c[t][b] += 1
                        e0 = j * kThreads + w0
                        words[tile * kWords + e0 // 32] = bal
        wsum = [[sum(c[t][b] for t in range(w*32,(w+1)*32)) for b in range(BT)] for w in range(8)]
        tc = [sum(wsum[w][l] for w in range(8)) if l < BT else 0 for l in range(32)]
        inc = tc[:]
        o = 1
        while o < BT:
            y = inc[:]
            inc = [inc[l] + (y[l - o] if l >= o else 0) for l in range(32)]
            o <<= 1
        agg = inc[BT - 1]
        # look-back (sequential: every earlier block INC)
        excl = 0
        aggs[blk] = agg
        if blk == 0: status[0] = ('I', agg)
        else:
            status[blk] = ('A', agg)
            pos = blk - 1
            while True:
                sts = [status[pos - l] if pos - l >= 0 else ('I', 0) for l in range(32)]
                sts = [('A', aggs[pos - l]) if pos - l > 0 and random.random() < 0.97 else st for l, st in enumerate(sts)]
                incs = [l for l in range(32) if sts[l][0] == 'I']
                if incs:
                    f = incs[0]; excl += sum(sts[l][1] for l in range(f + 1)); break
                excl += sum(s[1] for s in sts); pos -= 32
            status[blk] = ('I', excl + agg)
        for l in range(BT):
            if tile0 + l < ntiles: off[tile0 + l] = excl + inc[l] - tc[l]
        if blk == nb - 1: off[ntiles] = excl + agg; count = excl + agg
    return words, off, count

def store_run(stage_buf, h, cnt, oa_base, out, V, vout):
    if not vout:
        for k in range(cnt): out[oa_base + h + k] = stage_buf[k]
        return
    end = h + cnt; nv = (end + V - 1) // V
    for q in range(nv):
        i0 = q * V
        if i0 >= h and i0 + V <= end:
            assert (oa_base + i0) % V == 0
            out[oa_base + i0: oa_base + i0 + V] = stage_buf[i0:i0 + V]
        else:
            for i in range(max(i0, h), min(i0 + V, end)): out[oa_base + i] = stage_buf[i]

def rank_of(rw, rpre, e): return rpre[e >> 5] + popc(int(rw[e >> 5]) & ((1 << (e & 31)) - 1))

def select(words, off, x, n, BT, V, vec, vout, out_shift):
    ntiles = (n + kTile - 1) // kTile
    out = np.full(off[ntiles] + out_shift + 64, -999.0)
    S = kTile // V // kThreads
    nb = (ntiles + BT - 1) // BT
    for blk in range(nb):
        tile0 = blk * BT
        wd = [int(words[(tile0 + t // kWords) * kWords + t % kWords]) if t < BT * kWords and tile0 + t // kWords < ntiles else 0 for t in range(kThreads)]
        for b in range(BT):
            tile = tile0 + b; base = tile * kTile
            if tile >= ntiles: break
            vals = [popc(wd[t]) if t // kWords == b else 0 for t in range(kThreads)]
            p = np.concatenate([[0], np.cumsum(vals)[:-1]])
            rw = [0] * kWords; rpre = [0] * kWords
            for t in range(kThreads):
                if t // kWords == b: rw[t % kWords] = wd[t]; rpre[t % kWords] = int(p[t])
            cnt = int(off[tile + 1] - off[tile])
            o = out_shift + int(off[tile])  # element index of o in out (out base 16B-aligned + out_shift elems)
            h = (o % V) if vout else 0
            stage_buf = np.full(kTile + V, np.nan)
            if vec and base + kTile <= n:
                for j in range(S):
                    for t in range(kThreads):
                        e0 = (j * kThreads + t) * V
                        bits = rw[e0 >> 5] >> (e0 & 31)
                        k = rank_of(rw, rpre, e0)
                        for i in range(V):
                            if bits >> i & 1: stage_buf[h + k] = x[base + e0 + i]; k += 1
            else:
                for e in range(kTile):
                    if base + e >= n: break
                    if rw[e >> 5] >> (e & 31) & 1: stage_buf[h + rank_of(rw, rpre, e)] = x[base + e]
            store_run(stage_buf, h, cnt, o - h, out, V, vout)
    return out[out_shift: out_shift + off[ntiles]]

def select1(m, x, n, V, vec, out_shift):
    ntiles = (n + kTile - 1) // kTile
    out = np.full(n + out_shift + 64, -999.0)
    S = kTile // V // kThreads
    excl_run = 0
    for blk in range(ntiles):
        base = blk * kTile
        full = vec and base + kTile <= n
        half = []
        for t in range(kThreads):
            hbits = 0
            for k in range(16):
                e = base + 16 * t + k
                if e < n and m[e]: hbits |= 1 << k
            half.append(hbits)
        rw = [0] * kWords
        for t in range(0, kThreads, 2):
            hi = half[t + 1]  # shfl_down 1 (t even, t+1 same warp)
            rw[t >> 1] = half[t] | hi << 16
        vals = [popc(rw[t]) if t < kWords else 0 for t in range(kThreads)]
        agg = sum(vals); p = np.concatenate([[0], np.cumsum(vals)[:-1]])
        rpre = [int(p[t]) for t in range(kWords)]
        excl = excl_run; excl_run += agg
        o = out_shift + excl; h = o % V
        stage_buf = np.full(kTile + V, np.nan)
        if full:
            for j in range(S):
                for t in range(kThreads):
                    e0 = (j * kThreads + t) * V
                    bits = rw[e0 >> 5] >> (e0 & 31); k = rank_of(rw, rpre, e0)
                    for i in range(V):
                        if bits >> i & 1: stage_buf[h + k] = x[base + e0 + i]; k += 1
        else:
            for e in range(kTile):
                if base + e >= n: break
                if rw[e >> 5] >> (e & 31) & 1: stage_buf[h + rank_of(rw, rpre, e)] = x[base + e]
        store_run(stage_buf, h, agg, o - h, out, V, True)
    return out[out_shift: out_shift + excl_run], excl_run

random.seed(1)
for n in [1, 31, 4095, 4096, 4097, 3 * 4096 + 17, 9 * 4096, 37 * 4096 + 5]:
    for p in [0.5, 0.03, 0.97]:
        m = [random.random() < p for _ in range(n)]
        if n > 3 * 4096:
            for i in range(4096, 8192): m[i] = False
            for i in range(2 * 4096 + 7, 3 * 4096 + 7): m[i] = True
        x = [random.gauss(0, 1) for _ in range(n)]
        ref = [x[i] for i in range(n) if m[i]]
        msum = sum(m)
        for (V, BTm, BTs) in [(16, 4, 1), (8, 2, 2), (8, 2, 1), (4, 1, 1), (2, 1, 1)]:
            for vec in [True, False]:
                if n > 40 * 4096 and not (vec and V == 16) or n > 40 * 4096 and p != 0.5: continue
                words, off, count = mark_lb(m, n, BTm if V in (16, 8) else 1, 16 if BTm == 4 else V, vec)
                assert count == msum, (n, p, V, count, msum)
                for vout in ([True, False] if BTs == 1 else [True]):
                    for sh in ([0, 1, V - 1] if vout else [0]):
                        got = select(words, off, x, n, BTs, V, vec, vout, sh)
                        assert np.array_equal(got, ref), (n, p, V, BTs, vec, vout, sh)
            if V in (8, 4):
                got, c1 = select1(m, x, n, V, True, 3 % V)
                assert c1 == msum and np.array_equal(got, ref), ("select1", n, p, V)
                got, c1 = select1(m, x, n, V, False, 1)
                assert c1 == msum and np.array_equal(got, ref), ("select1 scalar", n, p, V)
        print("ok", n, p, flush=True)

