#!/usr/bin/env python3
"""Protocol model of kernels/flash_bwd_wg2.cu (EMBER_FLASH_BWD=wg2; docs/flash.md
"Step 4b"), no GPU needed: per block, the producer and the two consumers as
coroutines over the ring's full/empty mbarriers (parity waits) and named
barriers 1 and 2 (bar.sync / bar.arrive, 2 x 128 threads), with each consumer's
control flow as the kernel has it (empty turns for tiles it does not see, the
peeled first tile, the pending tile's dv/dk or dq issued one turn later, the last
turn; dk/dv at D 128: two turns a tile). Checks, for every length pair, GQA group
and mask: no deadlock, no named barrier completed without a waiter, no parity
aliasing, no wgmma reading a stage after it was refilled, and each consumer
accumulating exactly the tiles it sees, in tile order (wg's order, so wg's bits).
Then a broken variant (a ring of 2 stages: the pending tile held over an empty
turn) must fail. Exit status 0 when all holds. Run: python3 tools/flash_bwd_wg2_protocol.py
"""
import sys
STR, RES = 64, 128

class Block:
    def __init__(s, ntile, stages):
        s.S = stages
        s.full_c = [0]*stages; s.empty_c = [0]*stages; s.empty_n = [0]*stages
        s.stage = [None]*stages
        s.nb = {1: [0, 0, []], 2: [0, 0, []]}   # arrivals, syncs, waiters
        s.nb_gen = {1: 0, 2: 0}
        s.err = []

def mwait(blk, arr, s, k):
    # wait on phase k of barrier (k-th completion): parity semantics
    while True:
        c = arr[s]
        if c >= k + 2: blk.err.append('parity alias'); return
        if (c & 1) != (k & 1) and c >= k: return  # phase k completed (c == k+1)
        yield

def producer(blk, tiles):
    for j in range(tiles):
        s = j % blk.S
        if j >= blk.S:
            yield from mwait(blk, blk.empty_c, s, j // blk.S - 1)
        blk.stage[s] = j
        blk.full_c[s] += 1   # copies + lse/Δ land
        yield

def release(blk, s, j):
    if blk.stage[s] != j: blk.err.append('release of stage %d holding %s, expected %d' % (s, blk.stage[s], j))
    blk.empty_n[s] += 1
    if blk.empty_n[s] == 2: blk.empty_n[s] = 0; blk.empty_c[s] += 1

def read(blk, s, j, who):
    if blk.stage[s] != j: blk.err.append('%s reads stage %d holding %s, expected tile %d' % (who, s, blk.stage[s], j))

def nsync(blk, bid, cw):
    b = blk.nb[bid]
    b[0] += 1; b[1] += 1
    gen = blk.nb_gen[bid]
    check_nb(blk, bid)
    while blk.nb_gen[bid] == gen: yield

def narrive(blk, bid, cw):
    b = blk.nb[bid]
    b[0] += 1
    check_nb(blk, bid)
    if False: yield

def check_nb(blk, bid):
    b = blk.nb[bid]
    if b[0] == 2:
        if b[1] != 1: blk.err.append('named barrier %d completed with %d syncs' % (bid, b[1]))
        b[0] = b[1] = 0; blk.nb_gen[bid] += 1

def consumer(blk, cw, ntile, seen, pipe, log, two_turns):
    S = blk.S
    my, other = 1 + cw, 2 - cw
    turns = 0 if ntile == 0 else (2 * ntile if two_turns else ntile + 1)
    def pass_turn(i):
        if cw == 0 or i < turns - 1: yield from narrive(blk, other, cw)
    if cw == 1 and turns > 0: yield from narrive(blk, 1, cw)
    def empty_turn(j):
        s = j % S
        yield from mwait(blk, blk.full_c, s, j // S)
        yield from nsync(blk, my, cw)
        yield from pass_turn(j)
        release(blk, s, j)
    if two_turns:
        for j in range(ntile):
            s = j % S
            yield from mwait(blk, blk.full_c, s, j // S)
            if not seen(j):
                yield from nsync(blk, my, cw); yield from pass_turn(2*j)
                yield from nsync(blk, my, cw); yield from pass_turn(2*j+1)
                release(blk, s, j); continue
            yield from nsync(blk, my, cw); read(blk, s, j, 'c%d S' % cw); yield from pass_turn(2*j)
            yield
            yield from nsync(blk, my, cw); read(blk, s, j, 'c%d rs' % cw); log.append(j); yield from pass_turn(2*j+1)
            yield
            release(blk, s, j)
        return
    j = 0; ps = None; pj = None
    while j < ntile and not seen(j):
        yield from empty_turn(j); j += 1
    if j < ntile:
        s = j % S
        yield from mwait(blk, blk.full_c, s, j // S)
        yield from nsync(blk, my, cw); read(blk, s, j, 'c%d S0' % cw); yield from pass_turn(j)
        yield
        ps, pj = s, j
        j += 1
        while j < ntile:
            if not seen(j):
                yield from empty_turn(j); j += 1; continue
            s = j % S
            yield from mwait(blk, blk.full_c, s, j // S)
            yield from nsync(blk, my, cw)
            read(blk, s, j, 'c%d S' % cw); read(blk, ps, pj, 'c%d rs' % cw); log.append(pj)
            yield from pass_turn(j)
            yield
            release(blk, ps, pj)
            ps, pj = s, j
            j += 1
        yield from nsync(blk, my, cw)
        read(blk, ps, pj, 'c%d rs-last' % cw); log.append(pj)
        yield from pass_turn(ntile)
        yield
        release(blk, ps, pj)
    elif turns > 0:
        yield from nsync(blk, my, cw); yield from pass_turn(ntile)

def run(agents, blk):
    live = list(agents)
    steps = 0
    while live:
        progressed = False
        for a in list(live):
            try:
                next(a); 
            except StopIteration:
                live.remove(a); progressed = True
        steps += 1
        if steps > 100000: return 'deadlock'
    return None

def sim(kind, Tq, Tk, H, Hkv, causal, off, stages, pipe):
    group = H // Hkv
    fails = []
    if kind == 'dkdv':
        for k0 in range(0, Tk, RES):
            qstart = (max(0, k0 - off) // STR) * STR if causal else 0
            nq = max(0, (Tq - qstart + STR - 1) // STR); ntile = group * nq
            blk = Block(ntile, stages); logs = [[], []]
            ag = [producer(blk, ntile)]
            want = [[], []]
            for cw in range(2):
                kw0 = k0 + cw * 64
                seen = (lambda kw0: lambda j: not (causal and kw0 > qstart + (j % nq) * STR + STR - 1 + off))(kw0)
                want[cw] = [j for j in range(ntile) if seen(j)]
                ag.append(consumer(blk, cw, ntile, seen, pipe, logs[cw], not pipe))
            r = run(ag, blk)
            if r or blk.err or logs != want: fails.append((k0, r, blk.err[:3], logs, want))
    else:
        for qblk in range((Tq + RES - 1) // RES):
            q0 = qblk * RES
            kend = min(Tk, q0 + RES + off) if causal else Tk
            ntile = max(0, (kend + STR - 1) // STR)
            blk = Block(ntile, stages); logs = [[], []]
            ag = [producer(blk, ntile)]; want = [[], []]
            for cw in range(2):
                qw0 = q0 + cw * 64
                seen = (lambda qw0: lambda j: not (causal and j * STR > qw0 + 63 + off))(qw0)
                want[cw] = [j for j in range(ntile) if seen(j)]
                ag.append(consumer(blk, cw, ntile, seen, True, logs[cw], False))
            r = run(ag, blk)
            if r or blk.err or logs != want: fails.append((q0, r, blk.err[:3], logs, want))
    return fails


def main():
    n = bad = 0
    lens = [1, 17, 40, 63, 64, 65, 70, 100, 127, 128, 129, 200, 257, 300, 517, 1000]
    for Tq in lens:
        for Tk in lens:
            for (H, Hkv) in [(1, 1), (2, 1), (3, 1), (8, 1), (6, 2)]:
                for mode in ['none', 'tl', 'br']:
                    causal = mode != 'none'
                    off = Tk - Tq if mode == 'br' else 0
                    # the kernels' instances: dk/dv D 64 (4 stages, pipelined), D 128 (3, two turns); dq D 64, 128
                    for kind, stages, pipe in [('dkdv', 4, True), ('dkdv', 3, False), ('dq', 4, True), ('dq', 3, True)]:
                        f = sim(kind, Tq, Tk, H, Hkv, causal, off, stages, pipe)
                        n += 1
                        if f:
                            bad += 1
                            if bad < 6: print('FAIL', kind, stages, pipe, Tq, Tk, H, Hkv, mode, f[0])
    print(n, 'configurations,', bad, 'failed')
    # the model must see these break: a pending tile held over an empty turn with 2 stages, and turns misaligned
    broke_ring = bool(sim('dkdv', 70, 300, 8, 1, True, 0, 2, True))
    print('2-stage ring caught:', broke_ring)
    return 0 if bad == 0 and broke_ring else 1

if __name__ == '__main__':
    sys.exit(main())
