# rope_index_emu.py -- kernels/rope.cu v3's thread -> (x offset, y offset, position offset, pair)
# mapping emulated on the host, checked for every element of several layouts (the model's transposed
# head views, head counts that leave the last group of 4 partly empty, per-batch positions, the pair
# path, two tensors in one launch): each element of x read once, written once at its y offset, with
# its row's position and its pair's frequency. Run: python3 bench/kernels/rope_index_emu.py
# (no GPU; written on the build machine where the kernel could not run). Mirror changes of
# rope_kernel / side_init here.
import itertools, random
HPT, THREADS = 4, 128
def bstrides(pshape, pstride, lead_shape):
    nd = len(lead_shape); ps = [0]*nd
    off = nd - len(pshape)
    for i in range(len(pshape)):
        ps[off+i] = 0 if pshape[i] == 1 else pstride[i]
    return ps
def side_init(xshape, xstride, ystride, pshape, pstride):
    lead = len(xshape)-1
    ps = bstrides(pshape, pstride, xshape[:lead])
    hd = -1
    for k in range(lead):
        if ps[k] == 0 and xshape[k] > 1 and (hd < 0 or xshape[k] >= xshape[hd]): hd = k
    s = dict(shape=[], xs=[], ys=[], ps=[], H=1, xh=0, yh=0)
    rows = 1
    for k in range(lead):
        if k == hd: s['H'], s['xh'], s['yh'] = xshape[k], xstride[k], ystride[k]; continue
        s['shape'].append(xshape[k]); s['xs'].append(xstride[k]); s['ys'].append(ystride[k]); s['ps'].append(ps[k])
        rows *= xshape[k]
    s['G'] = (s['H'] + HPT - 1)//HPT
    s['threads'] = rows * s['G']
    return s
def run(sides, d, V):
    chunks = d // V
    blocks0 = 0; blocks = []
    for s in sides:
        s['threads'] *= chunks
        s['blocks'] = (s['threads'] + THREADS - 1)//THREADS
    total = sum(s['blocks'] for s in sides)
    out = [dict() for _ in sides]
    for b in range(total):
        side = 0 if b < sides[0]['blocks'] else 1
        s = sides[side]
        for t in range(THREADS):
            tid = (b - (sides[0]['blocks'] if side else 0))*THREADS + t
            if tid >= s['threads']: continue
            r = tid // chunks; c = tid - r*chunks
            G = s['G']; orow = r // G; hg = r - orow*G
            xo, yo, po = c*V, c*V, 0
            for k in range(len(s['shape'])-1, -1, -1):
                q, i = divmod(orow, s['shape'][k]); orow = q
                xo += i*s['xs'][k]; yo += i*s['ys'][k]; po += i*s['ps'][k]
            for k in range(HPT):
                h = hg + k*G
                if h >= s['H']: continue
                for e in range(V):
                    xoff = xo + h*s['xh'] + e
                    key = xoff
                    assert key not in out[side], ('twice', key)
                    out[side][key] = (yo + h*s['yh'] + e, po, (c*V + e)//2)
    return out
def check(xshape, xstride, ystride, pshape, pstride, V, n=1):
    d = xshape[-1]
    sides = [side_init(xshape, xstride, ystride, pshape, pstride) for _ in range(n)]
    out = run(sides, d, V)
    lead = xshape[:-1]
    ps = bstrides(pshape, pstride, lead)
    for o in out:
        cnt = 0
        for idx in itertools.product(*[range(s) for s in lead]):
            xb = sum(i*s for i, s in zip(idx, xstride)); yb = sum(i*s for i, s in zip(idx, ystride))
            pb = sum(i*s for i, s in zip(idx, ps))
            for j in range(d):
                got = o.get(xb + j)
                assert got is not None, ('missing', idx, j)
                assert got == (yb + j, pb, j//2), (idx, j, got, (yb+j, pb, j//2))
                cnt += 1
        assert cnt == len(o), (cnt, len(o))
    print('ok', xshape, xstride, pshape, 'V', V, 'n', n)
def contig(shape):
    st = [1]*len(shape)
    for i in range(len(shape)-2, -1, -1): st[i] = st[i+1]*shape[i+1]
    return st
# the model's q: (4,512,12,64) memory seen as (4,12,512,64)
B,T,H,D = 2, 33, 12, 64
m = contig([B,T,H,D]); xs = [m[0], m[2], m[1], 1]
check([B,H,T,D], xs, xs, [T], [1], 8, n=2)
check([B,H,T,D], xs, contig([B,H,T,D]), [T], [1], 4)
for H in (1,3,5,13):
    m = contig([B,T,H,D]); xs = [m[0], m[2], m[1], 1]
    check([B,H,T,D], xs, xs, [T], [1], 8)
check([2,3,17,32], contig([2,3,17,32]), contig([2,3,17,32]), [2,1,17], [17,17,1], 4)
check([1,10], [10,1], [10,1], [1], [1], 2)
check([2,2,5,1024], contig([2,2,5,1024]), contig([2,2,5,1024]), [5], [1], 4)
check([3,64], [1<<20, 1], [64,1], [3], [1], 2)
check([8,25,16,64], contig([8,25,16,64]), contig([8,25,16,64]), [16], [1], 8)
# unaligned narrow: (2,5,3,66) narrowed to 64 cols then transposed -> pair path V=2
m = contig([2,5,3,66]); xs=[m[0], m[2], m[1], 1]
check([2,3,5,64], xs, [960, 64, 192, 1], [5], [1], 2)
