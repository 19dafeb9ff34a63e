#!/usr/bin/env python3
"""How long `fused`'s fixed dq order makes the fused backward's tail (docs/flash.md "Step 5b", "Step 10b"), no GPU:
the key blocks of H (batch, kv head)s as agents on S resident slots (one block per SM), dispatched in blockIdx
order, each processing its q tiles one per time step; with the counters, a block waits before a tile until
every key block before it in its chain has added to the tile (a bump seen `lag` steps after the adds).
Orders (block_order(), the kernel's mapping of the linear block index, shared with the protocol model):
  fused_nd: longest first, no waits (the reference makespan);
  highest:  `fused`'s default — a head's key blocks highest first, head after head; chains C (copy n % C);
  groups G: "range-grouped chains" (EMBER_FLASH_DET_GROUPS, Step 10b) — key blocks cut into G ranges of
            ceil(nb / G), each range its own C chains (copies g·C + n % C); dispatched range-major across heads
            (every head's lowest range first — the longest blocks — each range highest first), so the tail is
            the last range's blocks, the shortest ones;
  groups G head-major: the same copies, the ranges dispatched head after head (for comparison);
  fused longest first (the counters then convoy: low blocks hold slots while higher ones wait for one).
Unit tiles and free hand-overs: it measures the order's cost, not the kernel's.
Run: python3 tools/flash_bwd_fused_tail.py
"""
RES, STR = 128, 64


def group_size(nb, groups):
    return (nb + groups - 1) // groups


def block_order(nb, Y, groups, range_major=True):
    """The kernel's (blockIdx.y, key block) for linear block indices 0, 1, ... (groups 1: the default's
    nb − 1 − blockIdx.x in blockIdx.y). Range-major: range g of every y, before range g + 1; within a range of a y,
    the highest key block first."""
    gs = group_size(nb, groups)
    out = []
    for L in range(Y * nb):
        if groups == 1 or not range_major:
            y, x = divmod(L, nb)
            g = x // gs if groups > 1 else 0
            lo, hi = g * gs, min(nb, g * gs + gs)
            out.append((y, lo + hi - 1 - x) if groups > 1 else (y, nb - 1 - x))
            continue
        g = L // (Y * gs)
        lo = g * gs
        size = min(nb, lo + gs) - lo
        y, i = divmod(L - Y * lo, size)
        out.append((y, lo + size - 1 - i))
    return out


def chain_of(n, nb, groups, chains):
    """copy index of key block n, and the range [lo, hi) its chain lives in"""
    gs = group_size(nb, groups)
    g = n // gs
    return g * chains + n % chains, g * gs, min(nb, g * gs + gs)


def makespan(T, heads, slots, order, wait=True, causal=True, groups=1, chains=1, lag=0, range_major=True):
    nb = (T + RES - 1) // RES
    cnt = {}
    now = [0]

    def nlast(mt):
        return min(nb - 1, (mt * STR + STR - 1) // RES) if causal else nb - 1

    def blk(hh, n):
        c, lo, hi = chain_of(n, nb, groups, chains)
        qstart = (n * RES // STR) * STR if causal else 0
        for mt in range(qstart // STR, (T + STR - 1) // STR):
            want = (min(nlast(mt), hi - 1) - n) // chains
            while wait and sum(1 for t in cnt.get((hh, c, mt), ()) if t + lag <= now[0]) != want:
                yield
            yield
            cnt.setdefault((hh, c, mt), []).append(now[0])

    if order == 'longest':
        pending = [(hh, n) for hh in range(heads) for n in range(nb)]
    else:
        pending = block_order(nb, heads, groups, range_major)
    live = []
    while pending or live:
        while pending and len(live) < slots:
            live.append(blk(*pending.pop(0)))
        for a in list(live):
            try:
                next(a)
            except StopIteration:
                live.remove(a)
        now[0] += 1
    return now[0]


def main():
    print('B 1, H 16, causal, 132 SMs; makespan in tile steps (bump seen 1 step after the adds: three writers)')
    for T in (4096, 16384):
        nb = T // RES
        ideal = 16 * sum((T - n * RES) // STR for n in range(nb)) / 132
        nd = makespan(T, 16, 132, 'longest', wait=False)
        print('T %5d: ideal %.0f, fused_nd %d' % (T, ideal, nd))
        for groups, chains, rm in ((1, 2, True), (1, 1, True), (2, 2, False), (2, 1, True), (2, 2, True),
                                   (3, 1, True), (4, 1, True), (4, 2, True)):
            f = makespan(T, 16, 132, 'highest', groups=groups, chains=chains, lag=1, range_major=rm)
            print('  groups %d%s, chains %d (%d copies): %d (+%.1f %% on fused_nd)' % (
                groups, '' if rm or groups == 1 else ' head-major', chains, groups * chains, f, 100 * (f / nd - 1)))
        lo = makespan(T, 16, 132, 'longest', chains=2, lag=1)
        print('  fused dispatched longest first, chains 2: %d' % lo)


if __name__ == '__main__':
    main()
