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

Step 5b (docs/flash.md), the bulk dq path (EMBER_FLASH_DQ=bulk, the default),
is modelled too: each consumer stores its dq(j−1) half into its shared buffer
after syncing on named barrier "dq empty" (5 + cw) and arrives on "dq full"
(3 + cw); the producer's warp 1 (the writer, a third agent with its own clock)
syncs on full, issues the bulk reduce, waits for the copy's reads and arrives on
empty (not after the last tile). Checked: the copy of tile jt's half ordered
after that half's store (RAW), every store after the completed read of the tile
the half held before (WAR), each half sent once per tile in order, no named
barrier left with an arrival and no taker at the end; at D 128 the bulk path
keeps two dSᵀ buffers and stores dSᵀ(j) in turn B(j) (the room for the dq
halves), which must hold too. Every block also runs under seeded random
schedules (the vector clocks catch unordered accesses whatever the order; the
random runs vary which completions happen first).

Step 5e, two writers (v['writers'] = 2; EMBER_FLASH_DET_WRITERS=2, fused's
default): writers 0 and 1 (agents 2 and 3, the producer's warps 1 and 3) take
the even and the odd tiles; a consumer stores tile jt after syncing on the empty
barrier of parity (jt − 1) % 2 (writer 1 arrives on parity 1 once at the start
for tile 0), and arrives on full of parity jt % 2 (ids 9 + cw, 11 + cw for
parity 1). The same checks hold, with the half's read recorded with the agent
that did it; the counters' bump of a tile then comes two tiles later (lag 2).

Step 10, store first (EMBER_FLASH_DET_STORE_FIRST=1): dq_accum is not zeroed; the
counters model checks that every (copy, tile, half) with adds is stored exactly
once, by its first adder (the block whose wanted counter value is 0).

Step 10, three writers (v['writers'] = 3; EMBER_FLASH_DET_WRITERS=3): writers 0-2
(agents 2-4, the producer's warps 1-3) take tiles jt % 3; dq full per (consumer,
writer), 9 + cw + 2w, and one dq empty per consumer, 5 + cw, that all three
writers arrive on in tile order (writer 2 once at the start for tile 0). Each
writer bumps its tile's counters as soon as its adds complete (no lag: the
counters' bulk, not lazy, order). Caught: one barrier per (consumer, writer) for
both full and empty (v['merged']: a writer's hand-back and its next full sync
land in one phase).

Broken variants must fail: NDS = 2 with the store in turn A (a buffer rewritten
while the other consumer's dq still reads it), dq(j) issued in turn B(j) (the
other half of dSᵀ(j) not yet ordered before it), key blocks dispatched lowest
first (the counters deadlock at R = 1), the writer handing a half back before
the copy's reads complete, a consumer storing without the empty sync, and an
arrival on empty after the last tile; two writers: a consumer syncing on the
empty barrier of its own tile's parity, writer 1 without its first arrival; three writers: writer 2
without its first arrival, full and empty merged; range-grouped chains (Step 10b): the wanted count not
clipped to the range, the default's copies in the range order, each range lowest first (all deadlock).

Step 10b, range-grouped chains (EMBER_FLASH_DET_GROUPS=G): the counters model runs several (batch, kv head)s on
shared slots in the kernel's range_block order (block_order() of flash_bwd_fused_tail.py), key block n of range g
adding into copy g·chains + n % chains after the blocks of its chain above it in its range; the same checks (no
deadlock, each (copy, tile, half) from exactly its chain's blocks that see it, highest first, stored once by the
first) for G 2-4, chains 1-2.

Step 11, dq first (v['dq_first']; EMBER_FLASH_BWD_DQ_FIRST=1, three writers): turn B's dq(j − 1) is its own commit
group, waited for and handed to the writer (dq empty's sync, the store, dq full) before dv's and dk's group is waited
for and the stage released; the same checks at both shapes, and at D 128's DQ_FIRST=2 shape (a 2-stage ring, three
dSᵀ buffers stored in turn A). Exit status 0 when all holds.
Run: python3 tools/flash_bwd_fused_protocol.py
"""
import os
import random
import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flash_bwd_wg2_protocol import Block, mwait, producer, release, read, run, STR, RES  # noqa: E402
from flash_bwd_fused_tail import block_order, chain_of  # noqa: E402


NAG = 5   # agents with clocks: consumers 0, 1 and the dq writers (2; two writers: 2 and 3; three: 2, 3 and 4)
# turns 1-2; dq full 3-4 / 9-10, dq empty 5-6 / 11-12 (parity 0 / 1); three writers: full and empty 9-14 (9 + cw + 2w)
NBARS = (1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 13, 14)


class FBlock(Block):
    def __init__(s, ntile, stages, nds):
        super().__init__(ntile, stages)
        s.clock = [[0] * NAG for _ in range(NAG)]   # vector clocks of consumers 0, 1 and the writer
        # named barriers: 1, 2 the turns; 3 + cw dq full, 5 + cw dq empty, + 6 for the second writer's parity
        # (one arriving party, one syncing)
        s.nb = {i: [0, 0, []] for i in NBARS}
        s.nb_gen = {i: 0 for i in NBARS}
        s.arr_clock = {i: None for i in NBARS}   # the arriving party's clock, joined into the waiter's
        s.last_join = {}
        s.nds = nds
        s.buf = [dict(tile=None, w={}, reads=[]) for _ in range(nds)]
        s.half = [dict(tile=None, w=None, rd=None) for _ in range(2)]   # bulk: the two dq halves; rd (agent, clock)
        s.sent = [[], []]                                               # bulk: tiles the writer sent, per half


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
    if b[0] - b[1] > 1:
        blk.err.append('named barrier %d: a second arrival before the phase completed' % bid)
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
        blk.last_join[bid] = blk.arr_clock[bid] or [0] * NAG
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


def dq_out(blk, cw, jt, v):
    """bulk: the consumer's dq half of tile jt into its buffer for the writer (red: straight to global)."""
    if not v.get('bulk'):
        return
    nw = v.get('writers', 1)
    pe = (jt if v.get('wrong_parity') else jt - 1) % nw   # the writer of tile jt − 1
    if nw == 3:
        full, empty = 9 + cw + 2 * (jt % nw), (9 + cw + 2 * pe) if v.get('merged') else 5 + cw
    else:
        full, empty = 3 + cw + 6 * (jt % nw), 5 + cw + 6 * pe
    if not v.get('no_empty_sync'):
        yield from nsync(blk, empty, cw)                   # dq empty: the copy has read the last tile
    h = blk.half[cw]
    if h['tile'] is not None and (h['rd'] is None or blk.clock[cw][h['rd'][0]] < h['rd'][1]):
        blk.err.append('c%d stores dq(%d) over dq(%d) before the copy read it' % (cw, jt, h['tile']))
    h['tile'] = jt; h['w'] = tick(blk, cw); h['rd'] = None
    yield from narrive(blk, full, cw)                      # dq full


def writer(blk, ntile, v, w=0):
    """bulk: the producer's warp 1 (w 0), or with two writers warp 1 (w 0, even tiles) and warp 3 (w 1, odd), or
    with three warps 1-3 (w 0-2, tiles jt % 3)."""
    if ntile == 0:
        return
    step = v.get('writers', 1)
    a = 2 + w                                              # the agent
    if step == 3:
        full, empty = 9 + 2 * w, (9 + 2 * w) if v.get('merged') else 5   # + h
    else:
        full, empty = 3 + 6 * w, 5 + 6 * w                 # + h: this writer's parity
    if w == step - 1 and not v.get('no_first_empty'):      # tile 0's store syncs on parity "−1"
        for h in range(2):
            yield from narrive(blk, empty + h, a)
    for jt in range(w, ntile, step):
        for h in range(2):
            yield from nsync(blk, full + h, a)             # dq full
            hb = blk.half[h]
            if hb['tile'] != jt or blk.clock[a][h] < hb['w']:
                blk.err.append('writer %d sends half %d of dq(%d): holds %s, store ordered %s' %
                               (w, h, jt, hb['tile'], blk.clock[a][h] >= (hb['w'] or 0)))
            blk.sent[h].append(jt)
        if v.get('early_empty') and jt + 1 < ntile:        # broken: handed back before the reads complete
            for h in range(2):
                yield from narrive(blk, empty + h, a)
        yield                                              # the copies read shared memory
        t = tick(blk, a)
        for h in range(2):
            blk.half[h]['rd'] = (a, t)                     # wait_group.read 0
        if (jt + 1 < ntile or v.get('last_empty')) and not v.get('early_empty'):
            for h in range(2):
                yield from narrive(blk, empty + h, a)
        yield                                              # fused: wait_group, the counters' bump


def consumer(blk, cw, ntile, log, lag=1, v=None):
    v = v or {}
    ds_in_b = v.get('ds_in_b', False)
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
        if not ds_in_b:
            ds_write(blk, cw, j)
        yield
        yield from nsync(blk, my, cw)                       # turn B(j)
        if ds_in_b:
            ds_write(blk, cw, j)                            # then the consumer's own 128-thread barrier
        read(blk, s, j, 'c%d rs' % cw)
        if j - lag >= 0:
            ds_read_issue(blk, cw, j - lag)
        yield from pass_turn(2 * j + 1)
        yield
        if v.get('dq_first') and j - lag >= 0:             # Step 11: dq's own group waited for, handed off,
            ds_read_done(blk, cw, j - lag); log.append(j - lag)
            yield from dq_out(blk, cw, j - lag, v)
            yield                                           # then dv's and dk's
            release(blk, s, j)
        else:
            release(blk, s, j)                              # after the wgmma wait
            if j - lag >= 0:
                ds_read_done(blk, cw, j - lag); log.append(j - lag)
                yield from dq_out(blk, cw, j - lag, v)
    if ntile > 0 and lag == 1:
        yield from nsync(blk, my, cw)                       # the last turn: dq(last)
        ds_read_issue(blk, cw, ntile - 1)
        yield from pass_turn(2 * ntile)
        yield
        ds_read_done(blk, cw, ntile - 1); log.append(ntile - 1)
        yield from dq_out(blk, cw, ntile - 1, v)


def run_random(agents, blk, rnd):
    """run()'s round robin with a seeded random subset of the agents stepping each round."""
    live = list(agents)
    steps = 0
    while live:
        for a in [a for a in live if rnd.random() < 0.6]:
            try:
                next(a)
            except StopIteration:
                live.remove(a)
        steps += 1
        if steps > 200000:
            return 'deadlock'
    return None


def block_sim(Tq, Tk, H, Hkv, causal, off, stages, nds, lag=1, v=None, seeds=()):
    """v: bulk (the dq halves and the writer), ds_in_b (dSᵀ stored in turn B), and the broken variants.
    One round-robin run per key block, plus one random schedule per seed."""
    v = v or {}
    group = H // Hkv
    fails = []
    for k0 in range(0, Tk, RES):
        qstart = (max(0, k0 - off) // STR) * STR if causal else 0
        nq = max(0, (Tq - qstart + STR - 1) // STR); ntile = group * nq
        for seed in (None,) + tuple(seeds):
            blk = FBlock(ntile, stages, nds); logs = [[], []]
            ag = [producer(blk, ntile)] + [consumer(blk, cw, ntile, logs[cw], lag, v) for cw in range(2)]
            if v.get('bulk'):
                ag += [writer(blk, ntile, v, w) for w in range(v.get('writers', 1))]
            r = run(ag, blk) if seed is None else run_random(ag, blk, random.Random(seed * 7919 + k0))
            want = list(range(ntile))
            if v.get('bulk') and not r and blk.sent != [want, want]:
                blk.err.append('writer sent %s' % blk.sent)
            if not r:
                for bid, b in blk.nb.items():
                    if b[0] or b[1]:
                        blk.err.append('named barrier %d left with %d arrivals, %d syncs' % (bid, b[0], b[1]))
            if r or blk.err or logs != [want, want]:
                fails.append((k0, seed, r, blk.err[:3]))
    return fails


def counters_sim(Tq, Tk, group, causal, off, slots, highest_first=True, bulk=False, chains=1, lazy=False, lag=1,
                 groups=1, nbh=1, brk=None):
    """fused's counters for nbh (batch, kv head)s: blocks dispatched in blockIdx order onto `slots` resident slots.
    red: each half bumped after its adds; bulk: the writer waits for and adds both halves, then bumps both —
    lazy (Step 5d): tile jt's bumps after tile jt + lag's adds are issued (the last lag tiles' at the end; lag 2:
    Step 5e's two writers, each bumping its own previous tile). chains (Step 5d): key block n adds into copy
    n % chains, after the blocks n + chains, n + 2·chains, ... above it, with that copy's counters.
    groups > 1 (Step 10b, range-grouped chains): the blocks in the kernel's range_block order (block_order() of
    flash_bwd_fused_tail.py: range by range across the nbh (batch, kv head)s, each range highest first), key block n
    of range g into copy g·chains + n % chains, its chain ending with the range. brk (must fail): 'unclipped', the
    wanted count not clipped to the range; 'shared', the default's chains (copies n % chains through every range)
    in the range order; 'lowest', each range lowest first."""
    nb = (Tk + RES - 1) // RES
    if groups == 1:
        hl = [nb - 1 - x for x in range(nb)] if highest_first else list(range(nb))
        order = [(y, n) for y in range(nbh) for n in hl]
    else:
        order = block_order(nb, nbh, groups)
        if brk == 'lowest':
            order = [(y, chain_of(n, nb, groups, 1)[1] + chain_of(n, nb, groups, 1)[2] - 1 - n) for y, n in order]
    tqp = (Tq + STR - 1) // STR * STR
    cnt = {}
    adds = {}
    stores = {}

    def nlast(mt):
        return min(nb - 1, (mt * STR + STR - 1 + off) // RES) if causal else nb - 1

    def copy_of(n):   # (copy, the chain's last key block): the kernel's c and rb.hi - 1
        c, lo, hi = chain_of(n, nb, groups, chains)
        if brk == 'shared':
            return n % chains, nb - 1
        return c, (nb if brk == 'unclipped' else hi) - 1

    def sees(n, mt):
        return ((max(0, n * RES - off) // STR) * STR if causal else 0) <= mt * STR

    def blk(y, n):
        k0 = n * RES
        qstart = (max(0, k0 - off) // STR) * STR if causal else 0
        nq = max(0, (Tq - qstart + STR - 1) // STR)
        c, last = copy_of(n)
        prev = []   # lazy: tiles issued, not yet bumped

        def bump(t):
            for half in range(2):
                cnt[(y, c) + t + (half,)] = cnt.get((y, c) + t + (half,), 0) + 1

        for jt in range(group * nq):
            hg, mt = jt // nq, qstart // STR + jt % nq
            want = (min(nlast(mt), last) - n) // chains
            for half in range(2):   # the two consumers, each its own counter (disjoint columns)
                key = (y, c, hg, mt, half)
                while cnt.get(key, 0) != want:
                    yield
                adds.setdefault(key, []).append(n)
                if want == 0:   # EMBER_FLASH_DET_STORE_FIRST: this block stores, not adds
                    stores.setdefault(key, []).append(n)
                if not bulk:
                    cnt[key] = cnt.get(key, 0) + 1
            yield
            if bulk and not lazy:
                bump((hg, mt))
            prev.append((hg, mt))
            if lazy and len(prev) > lag:
                bump(prev.pop(0))   # after this tile's adds are issued: those lag tiles back are performed
        for t in (prev if lazy else []):
            bump(t)

    pending = list(order); live = []
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
        if steps > 200000:
            return 'deadlock'
    # every (copy, tile, half) gets its adds from exactly the key blocks of its chain that see the tile, highest first
    expected = {}
    for y in range(nbh):
        for n in range(nb - 1, -1, -1):
            c = chain_of(n, nb, groups, chains)[0]
            for hg in range(group):
                for mt in range(tqp // STR):
                    if sees(n, mt):
                        for half in range(2):
                            expected.setdefault((y, c, hg, mt, half), []).append(n)
    for key, ns in adds.items():
        if ns != expected.get(key):
            return 'tile %s got adds from %s, expected %s' % (key, ns, expected.get(key))
        # store first (Step 10): dq_accum not zeroed, so each written (copy, tile, half) must be stored exactly once,
        # by its first adder; the convert reads a copy only where the counter (its adders) is nonzero
        if stores.get(key) != ns[:1]:
            return 'tile %s stored by %s, first adder %s' % (key, stores.get(key), ns[:1])
    if set(adds) != set(expected):
        return 'tiles with adds %d, expected %d' % (len(adds), len(expected))
    return None


# the kernel's shapes: (stages, dSᵀ buffers, variant) — red: Step 5's path; bulk: Step 5b's (D 128 with two
# dSᵀ buffers stored in turn B)
SHAPES = [(4, 3, {}), (3, 3, {}), (4, 3, {'bulk': True}), (3, 2, {'bulk': True, 'ds_in_b': True}),
          (4, 3, {'bulk': True, 'writers': 2}), (3, 2, {'bulk': True, 'ds_in_b': True, 'writers': 2}),
          (4, 3, {'bulk': True, 'writers': 3}), (3, 2, {'bulk': True, 'ds_in_b': True, 'writers': 3}),
          (4, 3, {'bulk': True, 'writers': 3, 'dq_first': True}),
          (3, 2, {'bulk': True, 'ds_in_b': True, 'writers': 3, 'dq_first': True}),
          (2, 3, {'bulk': True, 'writers': 3, 'dq_first': True})]   # DQ_FIRST=2 at D 128: 2 stages, 3 buffers


def main():
    n = bad = 0
    lens = [1, 17, 40, 63, 64, 65, 70, 100, 127, 128, 129, 200, 257, 300, 517, 1000]
    for Tq in lens:
        for Tk in lens:
            for (H, Hkv) in [(1, 1), (2, 1), (3, 1), (8, 1), (6, 2)]:
                for mode in ['none', 'tl', 'br']:
                    causal = mode != 'none'
                    off = Tk - Tq if mode == 'br' else 0
                    for stages, nds, v in SHAPES:
                        f = block_sim(Tq, Tk, H, Hkv, causal, off, stages, nds, v=v,
                                      seeds=(Tq + 3 * Tk + H,) if v.get('bulk') else ())
                        n += 1
                        if f:
                            bad += 1
                            if bad < 6:
                                print('FAIL block', stages, nds, v, Tq, Tk, H, Hkv, mode, f[0])
                    for slots in (1, 2, 3, 8):
                        for bulk, chains, lazy, lag in ((False, 1, False, 1), (True, 1, False, 1),
                                                        (False, 2, False, 1), (True, 1, True, 1), (True, 2, True, 1),
                                                        (True, 3, True, 1), (True, 1, True, 2), (True, 2, True, 2),
                                                        (True, 3, True, 2), (True, 2, False, 1),
                                                        (True, 3, False, 1)):
                            r = counters_sim(Tq, Tk, H // Hkv, causal, off, slots, bulk=bulk, chains=chains,
                                             lazy=lazy, lag=lag)
                            n += 1
                            if r:
                                bad += 1
                                if bad < 6:
                                    print('FAIL counters', slots, bulk, chains, lazy, lag, Tq, Tk, H, Hkv, mode, r)
                        # Step 10b: range-grouped chains (three writers: bulk, bumped unlagged), over 1 and 3
                        # (batch, kv head)s sharing the slots
                        for groups in (2, 3, 4):
                            for chains in (1, 2):
                                for nbh in (1, 3):
                                    r = counters_sim(Tq, Tk, H // Hkv, causal, off, slots, bulk=True, chains=chains,
                                                     groups=groups, nbh=nbh)
                                    n += 1
                                    if r:
                                        bad += 1
                                        if bad < 6:
                                            print('FAIL range-grouped counters', slots, groups, chains, nbh, Tq, Tk,
                                                  H, Hkv, mode, r)
    print(n, 'configurations,', bad, 'failed')
    seeds = tuple(range(8))
    caught = {}
    caught['2 dS buffers, stored in turn A'] = bool(block_sim(300, 300, 2, 1, False, 0, 3, 2))
    caught['2 dS buffers, stored in turn A (bulk)'] = bool(block_sim(300, 300, 2, 1, False, 0, 3, 2,
                                                                     v={'bulk': True}, seeds=seeds))
    caught['dq(j) in turn B(j) (no lag)'] = bool(block_sim(300, 300, 2, 1, False, 0, 3, 3, lag=0))
    caught['dq(j) in turn B(j), 2 buffers stored in B'] = bool(block_sim(300, 300, 2, 1, False, 0, 3, 2, lag=0,
                                                                         v={'bulk': True, 'ds_in_b': True}))
    caught['lowest key block first (deadlock)'] = counters_sim(1000, 1000, 1, True, 0, 1,
                                                               highest_first=False) == 'deadlock'
    caught['lowest key block first, bulk (deadlock)'] = counters_sim(1000, 1000, 1, True, 0, 1, highest_first=False,
                                                                     bulk=True) == 'deadlock'
    caught['lowest key block first, 2 lazy chains (deadlock)'] = counters_sim(
        1000, 1000, 1, True, 0, 1, highest_first=False, bulk=True, chains=2, lazy=True) == 'deadlock'
    for brk in ('early_empty', 'no_empty_sync', 'last_empty'):
        caught['bulk writer/consumer: ' + brk] = bool(block_sim(300, 300, 2, 1, False, 0, 3, 2, seeds=seeds,
                                                                v={'bulk': True, 'ds_in_b': True, brk: True}))
    caught['lowest key block first, 2 chains, two writers (deadlock)'] = counters_sim(
        1000, 1000, 1, True, 0, 1, highest_first=False, bulk=True, chains=2, lazy=True, lag=2) == 'deadlock'
    for brk, what in (('unclipped', 'wanted count not clipped to the range'),
                      ('shared', "the default's copies in the range order"), ('lowest', 'each range lowest first')):
        caught['range-grouped chains, %s (deadlock)' % what] = all(
            counters_sim(1000, 1000, 1, True, 0, slots, bulk=True, chains=1, groups=2, nbh=2, brk=brk) == 'deadlock'
            for slots in (1, 2))
    # dq first (Step 11): the same broken hand-offs must still be caught with dq's group waited for first
    for brk in ('early_empty', 'no_empty_sync', 'last_empty', 'no_first_empty'):
        for shape in ((3, 2, {'ds_in_b': True}), (4, 3, {}), (2, 3, {})):
            vv = dict(shape[2], bulk=True, writers=3, dq_first=True); vv[brk] = True
            caught['dq first, three writers (%d stages, %d dS buffers): %s' % (shape[0], shape[1], brk)] = bool(
                block_sim(300, 300, 2, 1, False, 0, shape[0], shape[1], seeds=seeds, v=vv))
    for nw, name in ((2, 'two'), (3, 'three')):
        # three writers share the empty barrier (no parity to get wrong), and must not merge full with it
        for brk in ('early_empty', 'no_empty_sync', 'last_empty', 'no_first_empty') + (
                ('merged',) if nw == 3 else ('wrong_parity',)):
            for shape in ((3, 2, {'ds_in_b': True}), (4, 3, {})):
                vv = dict(shape[2], bulk=True, writers=nw); vv[brk] = True
                caught['%s writers (%d dS buffers): %s' % (name, shape[1], brk)] = bool(
                    block_sim(300, 300, 2, 1, False, 0, shape[0], shape[1], seeds=seeds, v=vv))
    for what, c in caught.items():
        print('caught %s: %s' % (what, c))
    return 0 if bad == 0 and all(caught.values()) else 1


if __name__ == '__main__':
    sys.exit(main())
