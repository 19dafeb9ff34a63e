#!/usr/bin/env python3
"""sass_mix.py -- instruction count and an approximate opcode mix per kernel of an sm_90 cubin, for hosts
without cuobjdump/nvdisasm:

    nvcc -std=c++17 -O3 -arch=sm_90a -Iengine -Iengine/include -Iengine/backend -Ikernels -cubin kernels/rng.cu -o /tmp/rng.cubin
    python3 tools/sass_mix.py /tmp/rng.cubin "rng_contig<2, 4"

Each .text.<kernel> section holds 16-byte instructions; the count is its size / 16 (hot path plus cold tails:
a static proxy, not the dynamic count). The names come from the low 9 bits of each instruction's opcode field
as read from public Volta-Hopper encodings (IMAD.WIDE 0x25, LOP3 0x12, DADD 0x29, ...): a best guess, good for
comparing two variants of one kernel, unverified against nvdisasm; unknown codes print in hex."""
import struct, sys, subprocess, collections
NAMES = {0x24:'IMAD',0x25:'IMAD.WIDE',0x27:'IMAD.HI',0x12:'LOP3',0x10:'IADD3',0x19:'SHF',0x2b:'DFMA',0x29:'DADD',0x28:'DMUL',
 0x23:'FFMA',0x21:'FADD',0x20:'FMUL',0x0b:'FSETP',0x08:'FSEL',0x07:'SEL',0x0c:'ISETP',0x02:'MOV',0x16:'PRMT',0x3e:'F2FP',
 0x86:'STG',0x81:'LDG',0x47:'BRA',0x4d:'EXIT',0x19+0x100:'S2R',0x08+0x100:'MUFU',0x06+0x100:'I2F',0x04+0x100:'F2F',0x05+0x100:'F2I',0x10+0x100:'F2F64?',0x11+0x100:'F2I64?',0x12+0x100:'I2F64?',0x2a:'DSETP',0x18:'LEA',0x11:'LEA',0x14:'?',0x1c:'P2R',0x0d:'PLOP3',0x17:'IABSx',0x13:'POPC?',0x6:'?',0x22:'FSWZ?',0x1a:'?'}
def sections(path):
    """(name, bytes) of each .text.<kernel> section of a cubin (ELF64)."""
    d = open(path,'rb').read()
    shoff, = struct.unpack_from('<Q', d, 0x28); shentsize, shnum, shstrndx = struct.unpack_from('<HHH', d, 0x3a)
    sh = [struct.unpack_from('<IIQQQQIIQQ', d, shoff + i*shentsize) for i in range(shnum)]
    strtab = sh[shstrndx]; so = strtab[4]
    def name(off): return d[so+off:d.index(b'\0', so+off)].decode()
    for s in sh:
        n = name(s[0])
        if n.startswith('.text.'): yield n[6:], d[s[4]:s[4]+s[5]]
def demangle(n):
    return subprocess.run(['c++filt', n], capture_output=True, text=True).stdout.strip()
def demangle_many(names):
    """demangle for a list, one c++filt run (a library has hundreds of kernels)"""
    out = subprocess.run(['c++filt'], input='\n'.join(names) + '\n', capture_output=True, text=True).stdout
    return out.split('\n')[:len(names)]
def main():
    filt = sys.argv[2] if len(sys.argv) > 2 else ''
    for n, body in sections(sys.argv[1]):
        dn = demangle(n)
        if filt not in dn: continue
        c = collections.Counter()
        for i in range(0, len(body), 16):
            lo, = struct.unpack_from('<Q', body, i)
            op = lo & 0xfff
            base = op & 0x1ff
            c[NAMES.get(base, hex(base))] += 1
        print(len(body)//16, dn[:110]); print('   ', ' '.join(f'{k}:{v}' for k, v in c.most_common(30)))
if __name__ == '__main__':
    main()
