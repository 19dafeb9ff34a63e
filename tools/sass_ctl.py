#!/usr/bin/env python3
"""sass_ctl.py -- the instruction mix of a kernel's main loop (docs/flash.md "Step 6"): the innermost loop that
holds wgmmas (HGMMA), i.e. the fused flash backward's per-tile consumer loop, counted by class.

    python3 tools/sass_ctl.py FILE KERNEL_SUBSTRING [...] [--all] [--diff OTHER_FILE] [--list]

FILE: an sm_90 cubin (`nvcc ... -arch=sm_90a -cubin`, read directly: no CUDA binutils needed), or, where
cuobjdump is on the PATH, an object or library (build/CMakeFiles/ember_backend.dir/kernels/flash_bwd_fused.cu.o,
build/libember*.so: `cuobjdump -sass` is run and its text read), or a saved `cuobjdump -sass` text (.sass).
KERNEL_SUBSTRING: matched against the demangled name (several: all must match), e.g.
"flash_bwd_fused_kernel<__nv_bfloat16, 64, 4, false, true, false>" (T, D, STAGES, DET, BULK, S6).

The loop: every backward branch (a BRA whose target is at or before it) spans [target, branch]; the main loop is
the shortest span that holds an HGMMA (the spin loops of mbarrier waits hold none; enclosing spans of the
whole consumer hold the peeled first tile too). Classes (by mnemonic, or in a cubin by the low 9 bits of the
opcode field as tools/sass_mix.py reads them; checked on probe kernels compiled here: HGMMA 0x1f0, R2UR 0x0ca,
WARPGROUP 0x1c5, BRA 0x147 with its offset in bits 16-23 and 32-81):
  hgmma      HGMMA (the wgmmas)
  desc       descriptor work: the uniform datapath's integer ops (U*: the descriptors' 64-bit words are
             uniform registers) and R2UR (a vector register's value moved to one: a descriptor or an address
             computed per thread); an upper bound on descriptor building, which lives here
  int        the vector integer ops (IADD3, VIADD, IMAD, LOP3, SHF, LEA, ISETP, SEL, MOV, PRMT, ...)
  lds/sts    LDS, STS
  sync       BAR, SYNCS (mbarrier), WARPGROUP (fence, commit, wait), WARPSYNC, SHFL
  ffma/fmul  FFMA, FMUL, FADD, FSEL, FSETP, F2FP (the packs)
  mufu       MUFU (ex2)
  branch     BRA, BSSY, BSYNC
  other      the rest (printed with --list)
--all: the whole function too. --diff OTHER: the same kernels of another file, side by side; for the
S6=false kernels of two builds, also whether their code is byte-identical (cubins) or text-identical.
"""
import collections
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_mix import sections, demangle_many  # noqa: E402

CLASSES = ('hgmma', 'desc', 'int', 'lds/sts', 'sync', 'ffma/fmul', 'mufu', 'branch', 'other')

# cubin: low 9 bits of the opcode -> (mnemonic, class)
OPS = {
    0x1f0: ('HGMMA', 'hgmma'), 0x0ca: ('R2UR', 'desc'),
    0x082: ('UMOV', 'desc'), 0x090: ('UIADD3', 'desc'), 0x091: ('ULEA', 'desc'), 0x092: ('ULOP3', 'desc'),
    0x099: ('USHF', 'desc'), 0x0a4: ('UIMAD', 'desc'), 0x0a5: ('UIMAD.WIDE', 'desc'), 0x087: ('USEL', 'desc'),
    0x08c: ('UISETP', 'desc'), 0x096: ('UPRMT', 'desc'), 0x0b9: ('ULDC', 'other'), 0x1c3: ('S2UR', 'other'),
    0x010: ('IADD3', 'int'), 0x036: ('VIADD', 'int'), 0x011: ('LEA', 'int'), 0x012: ('LOP3', 'int'),
    0x019: ('SHF', 'int'), 0x024: ('IMAD', 'int'), 0x025: ('IMAD.WIDE', 'int'), 0x027: ('IMAD.HI', 'int'),
    0x002: ('MOV', 'int'), 0x007: ('SEL', 'int'), 0x00c: ('ISETP', 'int'), 0x016: ('PRMT', 'int'),
    0x01c: ('PLOP3', 'int'), 0x013: ('IABS?', 'int'), 0x02f: ('VIMNMX?', 'int'),
    0x184: ('LDS', 'lds/sts'), 0x188: ('STS', 'lds/sts'),
    0x11d: ('BAR', 'sync'), 0x1a7: ('SYNCS', 'sync'), 0x1c5: ('WARPGROUP', 'sync'), 0x148: ('WARPSYNC', 'sync'),
    0x189: ('SHFL', 'sync'),
    0x023: ('FFMA', 'ffma/fmul'), 0x020: ('FMUL', 'ffma/fmul'), 0x021: ('FADD', 'ffma/fmul'),
    0x008: ('FSEL', 'ffma/fmul'), 0x00b: ('FSETP', 'ffma/fmul'), 0x03e: ('F2FP', 'ffma/fmul'),
    0x108: ('MUFU', 'mufu'),
    0x147: ('BRA', 'branch'), 0x145: ('BSSY', 'branch'), 0x141: ('BSYNC', 'branch'),
    0x186: ('STG', 'other'), 0x181: ('LDG', 'other'), 0x182: ('LDC', 'other'), 0x118: ('NOP', 'other'),
    0x14d: ('EXIT', 'other'), 0x119: ('S2R', 'other'), 0x183: ('LDL', 'other'), 0x187: ('STL', 'other'),
}
NOP = 0x118


def text_class(mn):
    """A mnemonic's class (cuobjdump text)."""
    base = mn.split('.')[0]
    if base == 'HGMMA':
        return 'hgmma'
    if base == 'R2UR' or (base.startswith('U') and base not in ('ULDC',)):
        return 'desc'
    if base in ('IADD3', 'VIADD', 'IADD', 'LEA', 'LOP3', 'SHF', 'IMAD', 'MOV', 'SEL', 'ISETP', 'PRMT', 'PLOP3',
                'IABS', 'VIMNMX', 'IMNMX', 'LEA.HI', 'IDP', 'FLO', 'POPC', 'BMSK', 'SGXT'):
        return 'int'
    if base in ('LDS', 'STS', 'LDSM', 'STSM'):
        return 'lds/sts'
    if base in ('BAR', 'SYNCS', 'WARPGROUP', 'WARPSYNC', 'SHFL', 'MEMBAR', 'FENCE', 'DEPBAR'):
        return 'sync'
    if base in ('FFMA', 'FMUL', 'FADD', 'FSEL', 'FSETP', 'F2FP', 'FMNMX'):
        return 'ffma/fmul'
    if base == 'MUFU':
        return 'mufu'
    if base in ('BRA', 'BSSY', 'BSYNC'):
        return 'branch'
    return 'other'


def cubin_funcs(path):
    """{demangled name: [(offset, mnemonic, class, branch target or None, raw word)]} from a cubin."""
    out = {}
    secs = list(sections(path))
    for (name, body), dn in zip(secs, demangle_many([n for n, _ in secs])):
        ins = []
        for i in range(0, len(body), 16):
            w = int.from_bytes(body[i:i + 16], 'little')
            mn, cl = OPS.get(w & 0x1ff, ('0x%03x' % (w & 0x1ff), 'other'))
            tgt = None
            if w & 0x1ff == 0x147:
                hi = (w >> 32) & ((1 << 50) - 1)
                if hi >> 49:
                    hi -= 1 << 50
                tgt = i + 16 + (hi * 64 + ((w >> 16) & 0xff)) * 4
            ins.append((i, mn, cl, tgt, w))
        out[dn] = ins
    return out


LINE = re.compile(r'/\*([0-9a-f]{4,})\*/\s+((?:@!?U?P\w+\s+)?)([A-Z][A-Z0-9_.]*)([^;]*);')
TARGET = re.compile(r'(?:`\(\.L_x_(\d+)\)|\b0x([0-9a-f]+)\b)')


def text_funcs(text):
    """The same from `cuobjdump -sass` (or nvdisasm) text; the raw word is the instruction's text."""
    out = {}
    cur, labels, pend = None, {}, []

    def close():
        if cur is not None:
            out[cur[0]] = [(o, mn, cl, labels.get(t[1]) if isinstance(t, tuple) else t, k)
                           for o, mn, cl, t, k in cur[1]]
    for line in text.splitlines():
        m = re.search(r'Function : (\S+)', line)
        if m:
            close()
            cur, labels, pend = (m.group(1), []), {}, []
            continue
        if cur is None:
            continue
        lm = re.match(r'\s*\.L_x_(\d+):', line)
        if lm:
            pend.append(lm.group(1))
            continue
        m = LINE.search(line)
        if not m:
            continue
        off = int(m.group(1), 16)
        for lab in pend:
            labels[lab] = off
        pend = []
        mn, rest = m.group(3), m.group(4)
        tgt = None
        if mn.split('.')[0] == 'BRA':
            t = TARGET.search(rest)
            if t:
                tgt = ('L', t.group(1)) if t.group(1) else int(t.group(2), 16)
        cur[1].append((off, mn, text_class(mn), tgt, m.group(2) + mn + rest))
    close()
    return dict(zip(demangle_many(list(out)), out.values()))


def load(path):
    with open(path, 'rb') as f:
        magic = f.read(4)
    if magic == b'\x7fELF' and path.endswith('.cubin'):
        return cubin_funcs(path), 'cubin'
    if path.endswith('.sass') or path.endswith('.txt'):
        return text_funcs(open(path).read()), 'text'
    tool = shutil.which('cuobjdump')
    if tool:
        text = subprocess.run([tool, '-sass', path], capture_output=True, text=True, check=True).stdout
        return text_funcs(text), 'text'
    if magic == b'\x7fELF':
        try:
            return cubin_funcs(path), 'cubin'   # a cubin under another name
        except Exception:
            pass
    sys.exit('sass_ctl: %s is not a cubin and cuobjdump is not on the PATH (build a cubin: see the docstring)' % path)


def main_loop(ins):
    """(start, end) indices of the shortest backward-branch span holding an HGMMA, or None."""
    at = {x[0]: k for k, x in enumerate(ins)}
    best = None
    for k, (off, mn, cl, tgt, _) in enumerate(ins):
        if tgt is None or tgt > off or tgt not in at:
            continue
        a = at[tgt]
        if any(x[2] == 'hgmma' for x in ins[a:k + 1]) and (best is None or k - a < best[1] - best[0]):
            best = (a, k)
    return best


def count(ins):
    c = collections.Counter(x[2] for x in ins if x[1] != 'NOP')
    return c, sum(c.values())


def report(name, ins, show_all, show_list):
    lp = main_loop(ins)
    rows = []
    if lp:
        body = ins[lp[0]:lp[1] + 1]
        rows.append(('loop [%#x, %#x]' % (ins[lp[0]][0], ins[lp[1]][0]),) + count(body) + (body,))
    else:
        rows.append(('loop: none holds an HGMMA', collections.Counter(), 0, []))
    if show_all:
        rows.append(('function',) + count(ins) + (ins,))
    print(name)
    for what, c, n, body in rows:
        print('  %-28s %5d  ' % (what, n) + '  '.join('%s %d' % (k, c[k]) for k in CLASSES))
        if show_list and body:
            oc = collections.Counter(x[1].split('.')[0] for x in body if x[2] == 'other' and x[1] != 'NOP')
            dc = collections.Counter(x[1] for x in body if x[2] in ('desc', 'int'))
            print('    desc+int: ' + ' '.join('%s:%d' % kv for kv in dc.most_common()))
            print('    other: ' + ' '.join('%s:%d' % kv for kv in oc.most_common()))
    return rows[0][2]


def main():
    argv, args, flags, other = sys.argv[1:], [], [], None
    while argv:
        a = argv.pop(0)
        if a == '--diff':
            other = argv.pop(0)
        elif a.startswith('--'):
            flags.append(a)
        else:
            args.append(a)
    if len(args) < 2:
        sys.exit(__doc__)
    funcs, _ = load(args[0])
    subs = args[1:]
    names = sorted(n for n in funcs if all(s in n for s in subs))
    if not names:
        sys.exit('sass_ctl: no kernel of %s matches %s' % (args[0], subs))
    ofuncs = load(other)[0] if other else None
    for n in names:
        report(n, funcs[n], '--all' in flags, '--list' in flags)
        if ofuncs is not None:
            # the same name, or (a build from before a template switch) the name less a last argument "false"
            on = n if n in ofuncs else re.sub(r', false>\(', '>(', n, count=1)
            if on in ofuncs:
                same = [x[4] for x in ofuncs[on]] == [x[4] for x in funcs[n]]
                print('  %s: %s' % (other, 'identical code' if same else 'different code'))
                report('  (%s) %s' % (other, on), ofuncs[on], '--all' in flags, '--list' in flags)
            else:
                print('  %s: no kernel %s' % (other, on))


if __name__ == '__main__':
    main()
