"""Sequential models of two CUDA scan kernels, no GPU. Run: python3 tools/scan_models.py (seconds).

1. kernels/scan_rows_pair.cuh: the stream of P-tile steps (copy and scan cursors, ring stages, stores, carry reset
   at row ends) against a tile-by-tile model of scan_rows_ring, both with cub's raking block scan of 256 x 4 f32
   (the arithmetic rake_scan writes out); every element written once, the same bits.
2. kernels/scan_strips_flow.cuh: the walker / movers hand-over by named barriers (count 160: walker 32, movers 128),
   random interleavings of 1 to 100 tiles: no deadlock, no barrier phase over-filled, every tile landed before it
   is walked, walked before it is written back, written back before its stage is refilled."""
import random, struct

_F = struct.Struct('f')
def f(x): return _F.unpack(_F.pack(x))[0]   # round to f32 (exact for a sum or product of two f32 values)
def bits(x): return _F.pack(x)

B, I = 256, 4
TILE = B * I

def cub_tile(v):
    """cub::BlockScan<float, 256> (BLOCK_SCAN_RAKING) InclusiveScan of v[t][0..3]: (scans, aggregate)."""
    part = []
    for t in range(B):
        r = v[t][0]
        for i in range(1, I): r = f(r + v[t][i])
        part.append(r)
    inc = []
    for l in range(32):
        u = part[8 * l]
        for k in range(1, 8): u = f(u + part[8 * l + k])
        inc.append(u)
    off = 1
    while off < 32:
        inc = [f(inc[l - off] + inc[l]) if l >= off else inc[l] for l in range(32)]
        off *= 2
    exc = [inc[l - 1] if l else inc[0] for l in range(32)]
    slot = [None] * B
    for l in range(32):
        run = part[8 * l] if l == 0 else f(exc[l] + part[8 * l])
        slot[8 * l] = exc[l]
        for k in range(1, 8):
            nxt = f(run + part[8 * l + k]); slot[8 * l + k] = run; run = nxt
    out = []
    for t in range(B):
        r = v[t][0] if t == 0 else f(slot[t] + v[t][0])
        row = [r]
        for i in range(1, I): r = f(r + v[t][i]); row.append(r)
        out.append(row)
    return out, inc[31]

def ring_model(x, outer, L):
    y = [0.0] * (outer * L)
    for o in range(outer):
        carry = 0.0
        for b in range(0, L, TILE):
            v = [x[o * L + b + t * I:o * L + b + t * I + I] if b + t * I < L else [0.0] * I for t in range(B)]
            out, tot = cub_tile(v)
            for t in range(B):
                j = b + t * I
                if j < L: y[o * L + j:o * L + j + I] = [f(carry + out[t][i]) for i in range(I)]
            carry = f(carry + tot)
    return y

def pair_model(x, outer, L, G, P, S):
    step = P * TILE
    y, written = [None] * (outer * L), [0] * (outer * L)
    for b in range(G):   # blocks in turn; within a block, threads in lockstep
        nrows = (outer - b + G - 1) // G
        ring = [[[None] * B for _ in range(P)] for _ in range(S)]
        crow, cj, crows, cs = [b * L] * B, [t * I for t in range(B)], [nrows] * B, 0
        def copy_next():
            nonlocal cs
            for t in range(B):
                if crows[t] > 0:
                    for p in range(P):
                        if cj[t] + p * TILE < L:
                            a = crow[t] + cj[t] + p * TILE
                            ring[cs][p][t] = list(x[a:a + I])
                cj[t] += step
                if cj[t] - t * I >= L: cj[t] = t * I; crow[t] += G * L; crows[t] -= 1
            cs = (cs + 1) % S
        for _ in range(S - 1): copy_next()
        carry, ss, orow, j0, rows = 0.0, 0, b * L, [t * I for t in range(B)], nrows
        while rows > 0:
            copy_next()
            vs = []
            for p in range(P):
                v = []
                for t in range(B):
                    if j0[t] + p * TILE < L:
                        assert ring[ss][p][t] is not None, "slot read before it was copied"
                        v.append(ring[ss][p][t]); ring[ss][p][t] = None
                    else: v.append([0.0] * I)
                vs.append(v)
            for p in range(P):
                out, tot = cub_tile(vs[p])
                for t in range(B):
                    j = j0[t] + p * TILE
                    if j < L:
                        y[orow + j:orow + j + I] = [f(carry + out[t][i]) for i in range(I)]
                        for q in range(I): written[orow + j + q] += 1
                carry = f(carry + tot)
            ss = (ss + 1) % S
            j0 = [j + step for j in j0]
            if j0[0] >= L:
                j0, orow, rows, carry = [t * I for t in range(B)], orow + G * L, rows - 1, 0.0
    assert all(w == 1 for w in written), "an element written %s times" % sorted(set(written))
    return y

def check_pair():
    random.seed(1)
    for outer, L, G in [(3, 1028, 2), (5, 12, 2), (2, 8192, 1), (7, 3072, 3), (4, 2060, 4), (6, 4, 5), (3, 1024, 1),
                        (5, 5120, 2)]:
        x = [f(random.gauss(0, 1)) for _ in range(outer * L)]
        ref = ring_model(x, outer, L)
        for P, S in [(2, 4), (4, 2)]:
            got = pair_model(x, outer, L, G, P, S)
            assert all(bits(a) == bits(b) for a, b in zip(ref, got)), (outer, L, G, P)
    print("scan_rows_pair model: same bits as the tile-by-tile model")

NS = 6
def flow_walker(n, log):
    for t in range(n):
        yield ('sync', 1 + t % NS, 32); log.append(('walk', t)); yield ('arrive', 1 + NS + t % NS, 32)

def flow_movers(n, log):
    issued, landed = [], set()
    def fetch(t):
        issued.append(t)
        if t < n: log.append(('fetch', t))
    def wait_group(k): landed.update(issued[:len(issued) - k])
    for t in range(NS): fetch(t)
    wait_group(NS - 1); log.append(('landed', 0))
    yield ('arrive', 1, 128)
    for t in range(n):
        if t + 1 < n:
            wait_group(NS - 2); assert t + 1 in landed; log.append(('landed', t + 1))
            yield ('arrive', 1 + (t + 1) % NS, 128)
        yield ('sync', 1 + NS + t % NS, 128)
        log.append(('writeback', t)); fetch(t + NS)

def flow_run(n, seed):
    rnd, log = random.Random(seed), []
    procs = {'walker': flow_walker(n, log), 'movers': flow_movers(n, log)}
    waiting, bars, alive = {}, {}, set(procs)
    while alive:
        runnable = sorted(p for p in alive if p not in waiting)
        assert runnable, "deadlock at %d tiles: %s" % (n, waiting)
        p = rnd.choice(runnable)
        try: kind, bid, cnt = next(procs[p])
        except StopIteration: alive.discard(p); continue
        c, w = bars.get(bid, (0, []))
        c += cnt
        assert c <= 160, "barrier %d over-filled" % bid
        if kind == 'sync': w = w + [p]
        if c == 160:
            for q in w: waiting.pop(q, None)
            bars[bid] = (0, [])
        else:
            bars[bid] = (c, w)
            if kind == 'sync': waiting[p] = bid
    pos = {e: i for i, e in enumerate(log)}
    for t in range(n):
        assert pos[('fetch', t)] < pos[('landed', t)] < pos[('walk', t)] < pos[('writeback', t)], t
        if t >= NS: assert pos[('writeback', t - NS)] < pos[('fetch', t)], t
    assert all(v == (0, []) for v in bars.values())

def check_flow():
    for n in list(range(1, 20)) + [64, 65, 100]:
        for seed in range(200): flow_run(n, seed)
    print("scan_strips_flow hand-over: no deadlock, tiles in order")

if __name__ == "__main__":
    check_pair()
    check_flow()
