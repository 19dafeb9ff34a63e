#!/usr/bin/env python3
"""flash_bwd_fused_pingpong.py -- the fused backward's two consumers on one tensor pipe (docs/flash.md "Step 11").

Per tile j the turns run X.A, Y.A, X.B, Y.B (named barriers 1/2: a turn starts once the previous one was passed,
i.e. its wgmmas issued). Turn A issues Sᵀ and dPᵀ (tS each); turn B issues dv, dk, dq(j − 1) (tB in all, tdq of it
dq's). The tensor pipe runs the warpgroups' wgmmas in issue order. A consumer issues turn B once its softmax is done:
the exponentials take sig1 clocks from its Sᵀ's completion, then, once dPᵀ is complete too, dSᵀ, the packing, the
dSᵀ store and fence sig2; it is ready for the next turn A beta + eps clocks after its turn B's wgmmas complete
(beta: dq's hand-off to the writer; eps: the stage release, the loop, the next full wait). EMBER_FLASH_BWD_DQ_FIRST=1
waits only for dq's group before the hand-off: ready at max(dq done + beta, B done) + eps; 2 also takes dSᵀ's fence
(delta clocks) off sig2.

The softmax time is unknown (no GPU here): it is fitted so that the default lands on the measured tile (H200, B 1
H 16 causal bf16 T 16384: 1.76 µs at d64, 2.63 at d128, ~1.9 GHz), for tensor times at 1-2x the peak rate (4,096
FLOP a clock an SM; the wgmmas with N 64 read shared memory at its 128 B a clock). Then the same model with
DQ_FIRST 1 (beta off the path when it fits under dv's and dk's wgmmas) and with 2 (the dSᵀ fence, and at D 128
the consumer's barrier, delta clocks, off the softmax's path; D 128's 2-stage ring assumed not to starve). Prints clocks a tile and the change.
Run: python3 tools/flash_bwd_fused_pingpong.py
"""


def tile_clocks(tS, tB, tdq, sig1, sig2, beta, eps, dq_first, n=200):
    tq = 0.0                      # when the tensor pipe is free
    turn = 0.0                    # when the previous turn was passed
    ready = [0.0, 0.0]
    s_done, dp_done = [0.0, 0.0], [0.0, 0.0]
    starts = []
    for _ in range(n):
        for c in (0, 1):          # turn A
            t = max(turn, ready[c])
            s_done[c] = max(tq, t) + tS
            dp_done[c] = tq = s_done[c] + tS
            turn = t
        for c in (0, 1):          # turn B
            t = max(turn, max(s_done[c] + sig1, dp_done[c]) + sig2)
            t0 = max(tq, t)
            tq = t0 + tB
            ready[c] = (max(t0 + tdq + beta, tq) if dq_first else tq + beta) + eps
            turn = t
        starts.append(turn)
    return (starts[-1] - starts[n // 2]) / (n - 1 - n // 2)


def fit_sigma(target, tS, tB, tdq, beta, eps, split):
    lo, hi = 0.0, 20000.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if tile_clocks(tS, tB, tdq, mid * split, mid * (1 - split), beta, eps, False) < target:
            lo = mid
        else:
            hi = mid
    return lo


def main():
    eps = 50
    print('D  tensor x  sigma   default  DQ_FIRST=1   DQ_FIRST=2 (delta low / high)')
    # delta: the dSᵀ fence's wait (d64; 16 st.shared a thread, 64 wavefronts a consumer) and at d128 the consumer's
    # 128-thread barrier beside it
    for D, target, beta, deltas in ((64, 3300, 150, (50, 150)), (128, 4900, 200, (70, 200))):
        tS, tB, tdq = 64 * 64 * D * 2 / 4096, 3 * 64 * 64 * D * 2 / 4096, 64 * 64 * D * 2 / 4096
        for f in (1.0, 1.5, 2.0):
            sig = fit_sigma(target, tS * f, tB * f, tdq * f, beta, eps, 0.6)
            if sig == 0:
                continue
            args = (tS * f, tB * f, tdq * f)
            base = tile_clocks(*args, sig * 0.6, sig * 0.4, beta, eps, False)
            one = tile_clocks(*args, sig * 0.6, sig * 0.4, beta, eps, True)
            two = ['%+.1f %%' % (100 * (tile_clocks(*args, sig * 0.6, sig * 0.4 - d, beta, eps, True) / base - 1))
                   for d in deltas]
            print('%-3d %-8.1f %-7.0f %-8.0f %-12s %s' % (D, f, sig, base, '%+.1f %%' % (100 * (one / base - 1)),
                                                          ' / '.join(two)))


if __name__ == '__main__':
    main()
