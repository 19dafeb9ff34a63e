"""Sequential model of kernels/compact.cu's mark_st_kernel (gpumark): the grid launch_mark_st picks (cap blocks at
most, R rounds, tpb = 8 R tiles a block, nb blocks), the tiles each warp marks (block b, round r, warp w: tile
b tpb + 8 r + w), each block's offset from its predecessors' totals (the statuses), and its counts turned into
offsets kThreads at a time; against a plain exclusive scan of the tile counts. Also checks that every tile is
marked exactly once and that the workspace's status area (nt + 4 words) holds acc and the nb statuses.
Run: python3 tools/compact_st_model.py (a few seconds)."""
import random

def grid(nt, cap):
    wmax = cap * 8
    rounds = (nt + wmax - 1) // wmax
    tpb = rounds * 8
    nb = (nt + tpb - 1) // tpb
    return tpb, nb

def mark_st(counts, cap):
    nt = len(counts)
    tpb, nb = grid(nt, cap)
    assert 1 <= nb <= cap and 2 + nb <= nt + 4
    off = [None] * (nt + 1)
    seen = [0] * nt
    status = [None] * nb
    for b in range(nb):   # streaming: each warp's tiles, counts stored
        t0, t1 = b * tpb, min(b * tpb + tpb, nt)
        assert t0 < t1, "an empty block"
        tot = 0
        for w in range(8):
            tile = t0 + w
            while tile < t1:
                seen[tile] += 1
                off[tile] = counts[tile]
                tot += counts[tile]
                tile += 8
        status[b] = tot
    total = None
    for b in range(nb):   # look-back over all predecessors, then the block's own scan
        t0, t1 = b * tpb, min(b * tpb + tpb, nt)
        excl = sum(status[i] for i in range(b))
        if b == nb - 1: total = excl + status[b]
        carry = excl
        for c0 in range(t0, t1, 256):
            vals = [off[i] if i < t1 else 0 for i in range(c0, c0 + 256)]
            p = 0
            for k, i in enumerate(range(c0, c0 + 256)):
                if i < t1: off[i] = carry + p
                p += vals[k]
            carry += p
    off[nt] = total
    assert all(s == 1 for s in seen)
    return off

random.seed(5)
cases = 0
for nt in [1, 2, 3, 7, 8, 9, 65, 255, 256, 257, 513, 4224, 4225, 14649, 16384, 16385]:
    for cap in [1, 2, 3, 7, 132 * 4, 1024]:
        counts = [random.choice([0, 4096, random.randrange(4097)]) for _ in range(nt)]
        ref, run = [], 0
        for c in counts: ref.append(run); run += c
        ref.append(run)
        assert mark_st(counts, cap) == ref, (nt, cap)
        cases += 1
print("mark_st model: %d cases agree with the plain scan; (8192,8192) on 132 SMs: tpb, nb =" % cases, grid(16384, 528))
