#!/usr/bin/env python3
"""flash_sched_model.py -- the block schedule of the wgmma flash kernels at short T (docs/flash.md "Step 9").

    python3 tools/flash_sched_model.py [--sms 132] [--seq 512]

One block per SM (their registers allow no second), dispatched in the grid's linear order (x fastest) to the
first SM that frees; a block costs its tiles times a tile's time plus a fixed fill (barrier init, the first TMA
round trips, the epilogue's stores). Head order is the grid (tiles, heads) the kernels had: each head's blocks,
heaviest first, then the next head's. Heaviest first (EMBER_FLASH_STEP9=1) is the grid (heads, tiles): every
head's heaviest block, then every head's next one. Causal, Tq = Tk = T:

  forward wg3 (D 64): 192-query blocks, 128-key tiles; wg2 (D 128, and D 80/96 on it): 128-query blocks
  dk/dv: 128-key blocks over 64-query tiles (key block n sees T - 128 n queries)
  dq: 128-query blocks over 64-key tiles

The tile time and the fill of each kernel are fitted to the small model's per-call times in the graph-replayed
step (H200, 574c489, /work/prompts/status/gpu_run1.md: fwd wg3 16.4 us, dk/dv 24.3, dq 15.2, delta 3.75) for a
range of tile times: the fill is what makes the head-order makespan equal the measurement. Prints the fitted
makespans under both orders for the small (H 12), xl (H 25) and 2.7B (H 32) models at B 4.
"""
import argparse
import heapq
import math


def makespan(costs, sms):
    """Greedy list schedule: each block in order to the SM that frees first; the time the last one ends."""
    free = [0.0] * sms
    end = 0.0
    for c in costs:
        t = heapq.heappop(free) + c
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def grid(per_head, heads, order):
    """Blocks in dispatch order: per_head lists one head's block costs, heaviest first."""
    if order == "head":
        return [c for _ in range(heads) for c in per_head]
    return [c for c in per_head for _ in range(heads)]


def fwd_tiles(T, bm):
    """Key tiles (128) of each q block of bm rows, heaviest (last) block first."""
    return [math.ceil(min(T, (qb + 1) * bm) / 128) for qb in reversed(range(math.ceil(T / bm)))]


def bwd_tiles(T):
    """64-row tiles of each 128-row block: dk/dv's key block n sees the queries from 128 n on; dq's q block m the
    keys below 128 (m + 1): the same counts, heaviest first."""
    return [math.ceil((T - 128 * n) / 64) for n in range(math.ceil(T / 128))]


def fit_fill(tiles, tile_us, measured, heads, sms):
    """The fill (us, 0.05 steps) that makes the head-order makespan closest to the measurement."""
    best = min((abs(makespan(grid([n * tile_us + 0.05 * i for n in tiles], heads, "head"), sms) - measured), i)
               for i in range(400))
    return 0.05 * best[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--seq", type=int, default=512)
    a = ap.parse_args()
    T, models = a.seq, (("small", 4 * 12), ("xl", 4 * 25), ("2.7B", 4 * 32))
    kernels = (("fwd wg3 (D 64)", fwd_tiles(T, 192), 16.4, (1.6, 2.0, 2.4)),
               ("dk/dv", bwd_tiles(T), 24.3, (1.2, 1.4, 1.6)),
               ("dq", bwd_tiles(T), 15.2, (0.8, 1.0, 1.1)))
    print(f"T {T}, {a.sms} SMs; us per call, head order -> heaviest first (fit: tile time, fill)")
    for name, tiles, measured, tile_range in kernels:
        print(f"{name}: tiles per block {tiles}, measured {measured} us (small, head order)")
        for tu in tile_range:
            f = fit_fill(tiles, tu, measured, 48, a.sms)
            row = []
            for model, heads in models:
                costs = [n * tu + f for n in tiles]
                row.append(f"{model} {makespan(grid(costs, heads, 'head'), a.sms):5.1f} -> "
                           f"{makespan(grid(costs, heads, 'heavy'), a.sms):5.1f}")
            print(f"  tile {tu:.1f}, fill {f:.2f}: " + " | ".join(row))
    # the wg2 forward (128-query blocks; two consumers): the 2.7B model's (D 80 on the D 128 kernel; its rows above
    # are wg3's, which it does not run), and D 64's alternative to wg3 (EMBER_FLASH_FWD=wg2); a tile ~0.7 of wg3's
    # time at D 64 (128 rows of 192, Step 3b), the same fill
    tiles2 = fwd_tiles(T, 128)
    print(f"fwd wg2: tiles per block {tiles2}, a tile 0.7 of wg3's (D 64), wg3's fill")
    for tu in (1.6, 2.0, 2.4):
        f = fit_fill(fwd_tiles(T, 192), tu, 16.4, 48, a.sms)
        costs = [n * 0.7 * tu + f for n in tiles2]
        row = [f"{m} {makespan(grid(costs, h, 'head'), a.sms):5.1f} -> {makespan(grid(costs, h, 'heavy'), a.sms):5.1f}"
               for m, h in models]
        print(f"  wg3 tile {tu:.1f}, fill {f:.2f}: " + " | ".join(row))


if __name__ == "__main__":
    main()
