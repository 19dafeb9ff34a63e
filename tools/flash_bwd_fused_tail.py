#!/usr/bin/env python3
"""How long `fused`'s fixed dq order makes the fused backward's tail (docs/flash.md "Step 5b"), no GPU: the
key blocks of H (batch, kv head)s as agents on S resident slots (one block per SM), dispatched in blockIdx
order, each processing its q tiles one per time step; with the counters, a block waits before a tile until
every key block above it that adds to the tile has done so (`fused`'s order: highest key block first). Prints
the makespan in tile steps against the ideal (all work spread evenly) for fused_nd (longest first, no waits),
`fused` (highest first, the kernel's order) and, for comparison, `fused` dispatched longest first (the counters
then make low blocks hold their slots while their higher siblings wait for one: a convoy).
Unit tiles and free hand-overs: it measures the order's cost, not the kernel's.
Run: python3 tools/flash_bwd_fused_tail.py
"""
RES, STR = 128, 64


def makespan(T, heads, slots, order, wait=True, causal=True):
    nb = (T + RES - 1) // RES
    cnt = {}

    def nlast(mt):
        return min(nb - 1, (mt * STR + STR - 1) // RES) if causal else nb - 1

    def blk(hh, n):
        qstart = (n * RES // STR) * STR if causal else 0
        for mt in range(qstart // STR, (T + STR - 1) // STR):
            while wait and cnt.get((hh, mt), 0) != nlast(mt) - n:
                yield
            yield
            cnt[(hh, mt)] = cnt.get((hh, mt), 0) + 1

    seq = [nb - 1 - x for x in range(nb)] if order == 'highest' else list(range(nb))
    pending = [(hh, n) for hh in range(heads) for n in seq]
    live = []
    steps = 0
    while pending or live:
        while pending and len(live) < slots:
            live.append(blk(*pending.pop(0)))
        for a in list(live):
            try:
                next(a)
            except StopIteration:
                live.remove(a)
        steps += 1
    return steps


def main():
    print('B 1, H 16, causal, 132 SMs; makespan in tile steps')
    for T in (4096, 16384):
        nb = T // RES
        ideal = 16 * sum((T - n * RES) // STR for n in range(nb)) / 132
        nd = makespan(T, 16, 132, 'longest', wait=False)
        hi = makespan(T, 16, 132, 'highest')
        lo = makespan(T, 16, 132, 'longest')
        print('T %5d: ideal %.0f, fused_nd %d, fused (highest first) %d (+%.1f %% on fused_nd), '
              'fused longest first %d' % (T, ideal, nd, hi, 100 * (hi / nd - 1), lo))


if __name__ == '__main__':
    main()
