#!/usr/bin/env python3
"""Pipeline model of fused's dq writer(s) against the consumers (docs/flash.md "Step 5e"), no GPU needed.

One block in steady state, µs: consumer 0 finishes a tile's dq every C and stores it once the previous tile's
halves were handed back (dq empty); consumer 1 stores o later. A writer, per tile: full sync on half 0, the
counter check (Step 5d: the wanted value computed after the sync, `want`; it must also wait for the counter
read issued a tile earlier), a proxy fence and the reduce, full sync on half 1, reduce, wait_group.read, dq empty;
then off the consumers' path only if it has the time: the lazy bump (fence + release membar m) and the next own
tile's counter read (latency L). One writer (EMBER_FLASH_DET_WRITERS=1) takes every tile; two take every other.
stale: the two-writer path's second look (the first read came back stale, every tile: the worst case).

Calibrated on Step 5d's trace (d64 T16384: 2.21 µs a tile, fused_nd ~1.70): m + L ≈ 1.5–1.6 µs. Prints the tile
step for one and two writers over a grid of m and L.

Step 10 (--three): three writers (EMBER_FLASH_DET_WRITERS=3), each taking every third tile and bumping its own tile
as soon as its adds complete (a after the hand-back; no lag), then reading its next tile's counters; against two
writers with the consumers at the STEP6 loop's pace (C 1.62: fused_nd 3.366 ms at d64 T16384). The measured
two-writer fused (3.848 ms, ×1.084 of fused_nd in fused's block order, 3.55) sits where the two-writer loop
with a stale first read is the limit.
Run: python3 tools/flash_bwd_fused_writers.py [--three]
"""


def sim(two, C=1.7, o=0.5, st=0.05, f=0.05, r=0.03, wr=0.3, m=0.4, L=0.7, want=0.1, n=200, stale=False, three=False,
        a=0.5):
    step = 3 if three else 2 if two else 1
    two = two or three
    E = {-1: 0.0}             # dq empty of tile jt (both halves handed back)
    free = [0.0] * 3           # writer w back at its full sync at
    seen_at = [0.0] * 3        # writer w's counter value arrives at
    c0 = {}
    nat0 = 0.0
    for jt in range(n):
        w = jt % step
        nat0 = max(nat0 + C, E[jt - 1] + st) if jt else C   # consumer 0's store of tile jt
        c0[jt] = nat0
        c1 = max(nat0 + o, E[jt - 1] + st)                  # consumer 1's
        t = max(free[w], nat0)                              # full 0
        t = max(t, seen_at[w]) + (0 if two else want)       # the check (two: the wanted value precomputed)
        t += f + r
        t = max(t, c1) + r + wr                             # full 1, reduce, wait_group.read
        E[jt] = t
        t += f + m + (a if three else 0)                    # the lazy bump (three: its own adds waited out)
        seen_at[w] = t + L + (L if (two and stale) else 0)
        if two and stale:
            t += L                                          # the second look waits for the first read
        free[w] = t
    steps = [c0[j + 1] - c0[j] for j in range(n // 2, n - 1)]
    return sum(steps) / len(steps)


def main_three():
    Ls = (0.5, 0.9, 1.3)
    print('tile step, µs (consumers alone: 1.62, the STEP6 loop); rows wait_group.read wr, membar m; columns read '
          'latency L', Ls, '; two writers (stale first read every tile) against three')
    for wr in (0.3, 0.6, 0.9):
        for m in (0.4, 0.8):
            print('wr %.1f m %.1f  two %s   three %s   three, stale %s' % (
                wr, m, ' '.join('%.2f' % sim(True, C=1.62, wr=wr, m=m, L=L, stale=True) for L in Ls),
                ' '.join('%.2f' % sim(False, C=1.62, wr=wr, m=m, L=L, three=True) for L in Ls),
                ' '.join('%.2f' % sim(False, C=1.62, wr=wr, m=m, L=L, three=True, stale=True) for L in Ls)))
    return 0


def main():
    import sys
    if '--three' in sys.argv:
        return main_three()
    Ls = (0.5, 0.7, 0.9, 1.1)
    print('tile step, µs (consumers alone: 1.70); rows membar m, columns read latency L', Ls)
    for m in (0.2, 0.4, 0.6, 0.8):
        print('m %.1f  one writer %s   two %s   two, stale every tile %s' % (
            m, ' '.join('%.2f' % sim(False, m=m, L=L) for L in Ls), ' '.join('%.2f' % sim(True, m=m, L=L) for L in Ls),
            ' '.join('%.2f' % sim(True, m=m, L=L, stale=True) for L in Ls)))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
