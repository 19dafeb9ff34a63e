#!/usr/bin/env python3
"""Protocol model of kernels/flash_bwd_fused.cu (EMBER_FLASH_BWD=fused / fused_nd;
docs/flash.md "Step 5"), no GPU needed. Two levels:

1. One block: the producer and the two consumers as coroutines over the ring's
   full/empty mbarriers and named barriers 1/2 (flash_bwd_wg2_protocol.py's
   machinery), with the fused kernel's control flow: per tile turn A(j) (Sᵀ,
   dPᵀ; then this consumer's half of dSᵀ(j) into buffer j % NDS), turn B(j) (dv,
   dk from the own half; dq(j−1) reading both halves of buffer (j−1) % NDS), a
   last turn for dq(last). The dSᵀ buffers are checked with vector clocks (the
   named barriers carry them: a bar.arrive's clock joins its waiter's): every dq
   read must be ordered after both halves' writes of its tile (RAW), and every
   write after the completion (the issuing consumer's wgmma wait) of each read
   of the tile the buffer held before (WAR). Plus: no deadlock, no named barrier
   completed without its waiter, no parity aliasing, no stage read after its
   refill, each consumer issuing dq for every tile once, in order.
2. fused's counters: the blocks of one (batch, kv head), dispatched in blockIdx
   order onto R resident slots (R = 1, 2, 3, 8), each block's consumers adding
   tile by tile (their tiles' order as in the kernel) after waiting for the
   tile's counter to equal the number of key blocks above them that add to it,
   then bumping it. Checks: no deadlock, every (tile, half) gets its adds from
   the key blocks in descending order, all of them.

Broken variants must fail: NDS = 2 (a buffer rewritten while the other
consumer's dq still reads it), dq(j) issued in turn B(j) (the other half of
dSᵀ(j) not yet ordered before it), and key blocks dispatched lowest first (the
counters deadlock at R = 1). Exit status 0 when all holds.
Run: python3 tools/flash_bwd_fused_protocol.py
"""
import os
import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flash_bwd_wg2_protocol import Block, mwait, producer, release, read, run, STR, RES  # noqa: E402


class FBlock(Block):
    def __init__(s, ntile, stages, nds):
        super().__init__(ntile, stages)
        s.clock = [[0, 0], [0, 0]]           # vector clocks of consumers 0 and 1
        s.arr_clock = {1: None, 2: None}     # the arriving consumer's clock, joined into the waiter's
        s.nds = nds
        s.buf = [dict(tile=None, w={}, reads=[]) for _ in range(nds)]


def tick(blk, cw):
    blk.clock[cw][cw] += 1
    return blk.clock[cw][cw]


def join(a, b):
    return [max(x, y) for x, y in zip(a, b)]


def nsync(blk, bid, cw):
    b = blk.nb[bid]
    b[0] += 1; b[1] += 1
    gen = blk.nb_gen[bid]
    tick(blk, cw)
    done(blk, bid)
    while blk.nb_gen[bid] == gen:
        yield
    blk.clock[cw] = join(blk.clock[cw], blk.last_join[bid])


def narrive(blk, bid, cw):
    b = blk.nb[bid]
    b[0] += 1
    tick(blk, cw)
    blk.arr_clock[bid] = list(blk.clock[cw])
    done(blk, bid)
    if False:
        yield


def done(blk, bid):
    b = blk.nb[bid]
    if b[0] == 2:
        if b[1] != 1:
            blk.err.append('named barrier %d completed with %d syncs' % (bid, b[1]))
        if not hasattr(blk, 'last_join'):
            blk.last_join = {}
        blk.last_join[bid] = blk.arr_clock[bid] or [0, 0]
        b[0] = b[1] = 0; blk.nb_gen[bid] += 1


def ds_write(blk, cw, j):
    t = tick(blk, cw)
    bf = blk.buf[j % blk.nds]
    if bf['tile'] != j:   # the first half of tile j to land here: the previous tile's reads must be complete
        for (r, tr, tile) in bf['reads']:
            if blk.clock[cw][r] < tr:
                blk.err.append('c%d writes dS(%d) over dS(%d) before c%d\'s dq read of it completed' % (cw, j, tile, r))
        bf['tile'] = j; bf['w'] = {}; bf['reads'] = []
    else:
        for (r, tr, tile) in bf['reads']:
            if blk.clock[cw][r] < tr:
                blk.err.append('c%d writes dS(%d) before c%d\'s read completed' % (cw, j, r))
    bf['w'][cw] = t


def ds_read_issue(blk, cw, j):
    bf = blk.buf[j % blk.nds]
    if bf['tile'] != j or len(bf['w']) != 2:
        blk.err.append('c%d reads dS(%d): buffer holds %s, halves %s' % (cw, j, bf['tile'], sorted(bf['w'])))
        return
    for w, tw in bf['w'].items():
        if blk.clock[cw][w] < tw:
            blk.err.append('c%d reads dS(%d) unordered after c%d\'s write' % (cw, j, w))


def ds_read_done(blk, cw, j):
    t = tick(blk, cw)
    bf = blk.buf[j % blk.nds]
    if bf['tile'] == j:
        bf['reads'].append((cw, t, j))
    else:
        blk.err.append('c%d\'s dq(%d) completes after its buffer was rewritten' % (cw, j))


def consumer(blk, cw, ntile, log, lag=1):
    S = blk.S
    my, other = 1 + cw, 2 - cw
    turns = 2 * ntile + 1 if ntile > 0 else 0

    def pass_turn(i):
        if cw == 0 or i < turns - 1:
            yield from narrive(blk, other, cw)
    if cw == 1 and turns > 0:
        yield from narrive(blk, 1, cw)
    for j in range(ntile):
        s = j % S
        yield from mwait(blk, blk.full_c, s, j // S)
        yield from nsync(blk, my, cw)                       # turn A(j)
        read(blk, s, j, 'c%d S' % cw)
        yield from pass_turn(2 * j)
        yield                                               # exponentials, dSᵀ
        ds_write(blk, cw, j)
        yield
        yield from nsync(blk, my, cw)                       # turn B(j)
        read(blk, s, j, 'c%d rs' % cw)
        if j - lag >= 0:
            ds_read_issue(blk, cw, j - lag)
        yield from pass_turn(2 * j + 1)
        yield
        release(blk, s, j)                                  # after the wgmma wait
        if j - lag >= 0:
            ds_read_done(blk, cw, j - lag); log.append(j - lag)
    if ntile > 0 and lag == 1:
        yield from nsync(blk, my, cw)                       # the last turn: dq(last)
        ds_read_issue(blk, cw, ntile - 1)
        yield from pass_turn(2 * ntile)
        yield
        ds_read_done(blk, cw, ntile - 1); log.append(ntile - 1)


def block_sim(Tq, Tk, H, Hkv, causal, off, stages, nds, lag=1):
    group = H // Hkv
    fails = []
    for k0 in range(0, Tk, RES):
        qstart = (max(0, k0 - off) // STR) * STR if causal else 0
        nq = max(0, (Tq - qstart + STR - 1) // STR); ntile = group * nq
        blk = FBlock(ntile, stages, nds); logs = [[], []]
        ag = [producer(blk, ntile)] + [consumer(blk, cw, ntile, logs[cw], lag) for cw in range(2)]
        r = run(ag, blk)
        want = list(range(ntile))
        if r or blk.err or logs != [want, want]:
            fails.append((k0, r, blk.err[:3]))
    return fails


def counters_sim(Tq, Tk, group, causal, off, slots, highest_first=True):
    """fused's counters for one (batch, kv head): blocks dispatched in blockIdx order onto `slots` resident slots."""
    nb = (Tk + RES - 1) // RES
    order = [nb - 1 - x for x in range(nb)] if highest_first else list(range(nb))
    tqp = (Tq + STR - 1) // STR * STR
    cnt = {}
    adds = {}

    def nlast(mt):
        return min(nb - 1, (mt * STR + STR - 1 + off) // RES) if causal else nb - 1

    def blk(n):
        k0 = n * RES
        qstart = (max(0, k0 - off) // STR) * STR if causal else 0
        nq = max(0, (Tq - qstart + STR - 1) // STR)
        for jt in range(group * nq):
            hg, mt = jt // nq, qstart // STR + jt % nq
            for half in range(2):   # the two consumers, each its own counter (disjoint columns)
                key = (hg, mt, half)
                while cnt.get(key, 0) != nlast(mt) - n:
                    yield
                adds.setdefault(key, []).append(n)
                cnt[key] = cnt.get(key, 0) + 1
            yield

    pending = list(order); live = []
    steps = 0
    while pending or live:
        while pending and len(live) < slots:
            live.append(blk(pending.pop(0)))
        for a in list(live):
            try:
                next(a)
            except StopIteration:
                live.remove(a)
        steps += 1
        if steps > 200000:
            return 'deadlock'
    for (hg, mt, half), ns in adds.items():
        want = [n for n in range(nb - 1, -1, -1)
                if ((max(0, n * RES - off) // STR) * STR if causal else 0) <= mt * STR]
        if ns != want:
            return 'tile %s got adds from %s, expected %s' % ((hg, mt, half), ns, want)
    expected_tiles = {(hg, mt, half) for hg in range(group) for mt in range(tqp // STR) for half in range(2)
                      if any(((max(0, n * RES - off) // STR) * STR if causal else 0) <= mt * STR for n in range(nb))}
    if set(adds) != expected_tiles:
        return 'tiles with adds %d, expected %d' % (len(adds), len(expected_tiles))
    return None


def main():
    n = bad = 0
    lens = [1, 17, 40, 63, 64, 65, 70, 100, 127, 128, 129, 200, 257, 300, 517, 1000]
    for Tq in lens:
        for Tk in lens:
            for (H, Hkv) in [(1, 1), (2, 1), (3, 1), (8, 1), (6, 2)]:
                for mode in ['none', 'tl', 'br']:
                    causal = mode != 'none'
                    off = Tk - Tq if mode == 'br' else 0
                    for stages in (4, 3):   # D 64, D 128
                        f = block_sim(Tq, Tk, H, Hkv, causal, off, stages, 3)
                        n += 1
                        if f:
                            bad += 1
                            if bad < 6:
                                print('FAIL block', stages, Tq, Tk, H, Hkv, mode, f[0])
                    for slots in (1, 2, 3, 8):
                        r = counters_sim(Tq, Tk, H // Hkv, causal, off, slots)
                        n += 1
                        if r:
                            bad += 1
                            if bad < 6:
                                print('FAIL counters', slots, Tq, Tk, H, Hkv, mode, r)
    print(n, 'configurations,', bad, 'failed')
    two_bufs = bool(block_sim(300, 300, 2, 1, False, 0, 3, 2))
    print('2 dS buffers caught:', two_bufs)
    no_lag = bool(block_sim(300, 300, 2, 1, False, 0, 3, 3, lag=0))
    print('dq(j) in turn B(j) (no lag) caught:', no_lag)
    lowest_first = counters_sim(1000, 1000, 1, True, 0, 1, highest_first=False) == 'deadlock'
    print('lowest key block first caught (deadlock):', lowest_first)
    return 0 if bad == 0 and two_bufs and no_lag and lowest_first else 1


if __name__ == '__main__':
    sys.exit(main())
