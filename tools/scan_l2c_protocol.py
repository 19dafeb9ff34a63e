#!/usr/bin/env python3
"""Protocol model of scan_l2_coop (kernels/scan_row_l2.cuh, EMBER_SCAN_ROW=l2c), no GPU needed: each block's
program as the kernel has it (pass 1 of segment 0; then per segment s: pass 1 of s + 1 on tiles G - 1 - b,
+ G, ..., add them to s + 1's count, wait for s's count, apply s's tiles b, b + G, ... last first), run under
random schedules. Checks: no deadlock, every tile through pass 1 and apply exactly once, and no tile applied
before every tile of its segment and of the segments before it passed pass 1 (its agg/ctot inputs). Then a
broken variant (one count for the whole row) must fail. Exit status 0 when all holds.
Run: python3 tools/scan_l2c_protocol.py
"""
import random
import sys


def program(b, G, nt, seg, per_segment):
    def pass1(s0):
        s1 = nt if nt - s0 < seg else s0 + seg
        n, t = 0, s0 + (G - 1 - b)
        while t < s1:
            yield ('p1', t)
            n, t = n + 1, t + G
        if n:
            yield ('count', s0 // seg if per_segment else 0, n)
    yield from pass1(0)
    for t0 in range(0, nt, seg):
        t1 = nt if nt - t0 < seg else t0 + seg
        yield from pass1(t1)
        yield ('wait', t0 // seg, t1 - t0) if per_segment else ('wait', 0, t1)
        for i in range(b, t1 - t0, G):
            yield ('apply', t1 - 1 - i, t1)


def run(nt, seg, G, rng, per_segment=True):
    count, p1, applied = {}, set(), set()
    progs = [program(b, G, nt, seg, per_segment) for b in range(G)]
    pending, live = [None] * G, list(range(G))
    while live:
        b = rng.choice(live)
        ev = pending[b]
        if ev is None:
            try:
                ev = next(progs[b])
            except StopIteration:
                live.remove(b)
                continue
        pending[b] = None
        if ev[0] == 'wait' and count.get(ev[1], 0) < ev[2]:
            pending[b] = ev
            if all(pending[x] and count.get(pending[x][1], 0) < pending[x][2] for x in live):
                raise AssertionError('deadlock: every live block waits')
        elif ev[0] == 'p1':
            assert ev[1] not in p1, 'tile %d through pass 1 twice' % ev[1]
            p1.add(ev[1])
        elif ev[0] == 'count':
            count[ev[1]] = count.get(ev[1], 0) + ev[2]
        elif ev[0] == 'apply':
            assert ev[1] not in applied, 'tile %d applied twice' % ev[1]
            missing = [x for x in range(ev[2]) if x not in p1]
            assert not missing, 'tile %d applied before pass 1 of tile %d' % (ev[1], missing[0])
            applied.add(ev[1])
    assert p1 == set(range(nt)) and applied == set(range(nt)), 'tiles missed'


# (tiles, tiles a segment, grid): one tile; a segment larger than the row; grid above and below a segment;
# partial last segments; 2^26 f32's shape scaled down (a sixth of the L2: 512-tile segments, 792 blocks)
CASES = [(1, 64, 1), (2, 64, 2), (65, 64, 65), (509, 192, 509), (509, 64, 100), (1000, 128, 37),
         (300, 64, 300), (700, 640, 660), (2000, 192, 50), (1600, 512, 792)]
rng = random.Random(7)
for nt, seg, G in CASES:
    for _ in range(20):
        run(nt, seg, G, rng)
broken = 0
for _ in range(20):
    try:
        run(509, 64, 100, rng, per_segment=False)
    except AssertionError:
        broken += 1
if broken == 0:
    sys.exit('the broken variant (one count for the row) passed: the model checks nothing')
print('scan_l2c protocol: %d cases x 20 schedules hold; the row-wide count fails %d of 20' % (len(CASES), broken))
