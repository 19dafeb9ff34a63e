"""Sequential model of kernels/compact.cu's thirteenth-session mark (mark_tk_kernel): nz4's byte test, the words a
warp writes for one tile (V elements a 16-byte load, G = 32 / V lanes a word, 8 loads a lane a step, sizeof(U)
steps a tile) and the last block's scan_counts (rounds of 16 x 256 counts, 16 warp scans, 128 warp sums scanned
by warp 0 with the carry), each against a plain reference. Lanes and warps are loops; no GPU.
Run: python3 tools/compact_tk_model.py (a few seconds)."""
import random, itertools

def nz4(x):
    m = ((((x & 0x7f7f7f7f) + 0x7f7f7f7f) & 0xffffffff) | x) & 0x80808080
    return ((m * 0x00204081) & 0xffffffff) >> 28

def tile_words(bits, size):   # bits: 4096 booleans of one tile; size = sizeof(U)
    V, L = 16 // size, 8
    G, STEP = 32 // V, 32 * V * L
    w = [None] * 128
    for s in range(4096 // STEP):
        for j in range(L):
            lane_bits = []
            for lane in range(32):
                e0 = s * STEP + (j * 32 + lane) * V
                lane_bits.append(sum(1 << k for k in range(V) if bits[e0 + k]) << ((lane % G) * V))
            for lane in range(0, 32, G):   # the shuffle-xor OR over each group of G lanes
                word = 0
                for g in range(G): word |= lane_bits[lane + g]
                e0 = s * STEP + (j * 32 + lane) * V
                w[e0 // 32] = word
    return w
T, J, KW = 256, 16, 8
def scan_counts(off, ntiles):
    carry = 0
    r0 = 0
    while r0 < ntiles:
        inc = [[0]*J for _ in range(T)]
        for t in range(T):
            for j in range(J):
                i = r0 + j*T + t
                inc[t][j] = off[i] if i < ntiles else 0
        part = [0]*(J*KW+1)
        excl = [[0]*J for _ in range(T)]
        for w in range(KW):
            for j in range(J):
                run = 0
                for lane in range(32):
                    t = w*32+lane
                    excl[t][j] = run
                    run += inc[t][j]
                part[j*KW+w] = run
        P = J*KW//32
        sums = [sum(part[l*P+k] for k in range(P)) for l in range(32)]
        e = 0
        newpart = part[:]
        for l in range(32):
            ee = e
            for k in range(P):
                newpart[l*P+k] = carry + ee; ee += part[l*P+k]
            e += sums[l]
        newpart[J*KW] = carry + e
        part = newpart
        for t in range(T):
            w = t//32
            for j in range(J):
                i = r0 + j*T + t
                if i < ntiles: off[i] = part[j*KW+w] + excl[t][j]
        carry = part[J*KW]
        r0 += J*T

if __name__ == "__main__":
    vals = [0, 1, 0x80, 0x7f, 0xff, 2, 0x40]
    for bs in itertools.product(vals, repeat=4):
        x = sum(b << (8 * k) for k, b in enumerate(bs))
        assert nz4(x) == sum(1 << k for k in range(4) if bs[k]), hex(x)
    for _ in range(100000):
        x = random.getrandbits(32)
        assert nz4(x) == sum(1 << k for k in range(4) if (x >> (8 * k)) & 0xff)
    for size in (1, 2, 4, 8):
        for p in (0.5, 0.02, 1.0):
            bits = [random.random() < p for _ in range(4096)]
            ref = [sum(1 << b for b in range(32) if bits[32 * i + b]) for i in range(128)]
            assert tile_words(bits, size) == ref, (size, p)
    for nt in [1, 2, 255, 256, 257, 4095, 4096, 4097, 8196, 12345, 16384, 16385]:
        c = [random.randint(0, 4096) for _ in range(nt)]
        o = c[:]
        scan_counts(o, nt)
        assert o == list(itertools.accumulate([0] + c[:-1])), nt
    print("compact_tk_model: nz4, tile words (1, 2, 4, 8-byte elements), scan_counts: ok")
