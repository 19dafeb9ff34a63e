#!/usr/bin/env python3
"""The kernel's range_block() (kernels/flash_bwd_fused.cu, EMBER_FLASH_DET_GROUPS; docs/flash.md "Step 10b") against
block_order() / chain_of() of tools/flash_bwd_fused_tail.py, which the protocol model replays: the C++ function is cut
out of the kernel's source, compiled for the host with g++ and run over key blocks 1-40, 1-5 (batch, kv head)s and
2-8 ranges; every linear block index must give the model's (batch, kv head), key block, range and range end, and each
order must be a permutation of the blocks. Run: python3 tools/flash_bwd_fused_ranges.py (needs g++; ~2 s)
"""
import os
import subprocess
import sys
import tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flash_bwd_fused_tail import block_order, chain_of  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    src = open(os.path.join(ROOT, 'kernels', 'flash_bwd_fused.cu')).read()
    i = src.index('struct RangeBlock')
    j = src.index('}\n', src.index('range_block(int L')) + 2
    code = ('#include <cstdio>\n#include <algorithm>\nusing std::min;\n#define __host__\n#define __device__\n' +
            src[i:j] + '\nint main() {\n  for (int nbk = 1; nbk <= 40; nbk++)\n    for (int nbh = 1; nbh <= 5; nbh++)\n'
            '      for (int G = 2; G <= 8; G++)\n        for (int L = 0; L < nbk * nbh; L++) {\n'
            '          RangeBlock r = range_block(L, nbk, nbh, G);\n'
            '          printf("%d %d %d %d %d %d %d %d\\n", nbk, nbh, G, L, r.bhk, r.nb, r.g, r.hi);\n        }\n}\n')
    with tempfile.TemporaryDirectory() as d:
        cpp, exe = os.path.join(d, 'rb.cpp'), os.path.join(d, 'rb')
        open(cpp, 'w').write(code)
        subprocess.run(['g++', '-O1', cpp, '-o', exe], check=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    orders, n, bad = {}, 0, 0
    for line in out.splitlines():
        nbk, nbh, G, L, bhk, nb, g, hi = map(int, line.split())
        key = (nbk, nbh, G)
        if key not in orders:
            orders[key] = block_order(nbk, nbh, G)
            assert sorted(orders[key]) == [(y, m) for y in range(nbh) for m in range(nbk)], key
        y, m = orders[key][L]
        rg, _, rhi = chain_of(m, nbk, G, 1)
        n += 1
        if (y, m, rg, rhi) != (bhk, nb, g, hi):
            bad += 1
            if bad < 5:
                print('MISMATCH', key, L, 'kernel', (bhk, nb, g, hi), 'model', (y, m, rg, rhi))
    print('%d block indices, %d mismatches; %d orders, each a permutation' % (n, bad, len(orders)))
    return 0 if bad == 0 and n > 0 else 1


if __name__ == '__main__':
    sys.exit(main())
