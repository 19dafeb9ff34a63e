#!/usr/bin/env python3
"""ptx_entry_diff.py BEFORE.ptx AFTER.ptx [--show NAME_PART] -- compare the .entry kernels of two PTX files.

For checking that a source cleanup leaves kernels alone: each kernel's body is normalised (mangled _Z names,
register numbers, branch labels and debug lines removed) and compared with the kernel of the same name in the
other file. Kernels are matched by their demangled name without the parameter list (a removed kernel parameter
changes the mangled name, not the template arguments), so a kernel that lost an argument is reported as
"changed", with a diff (--show NAME_PART). --removed-param N: the changed kernels lost their parameter N
(0-based): BEFORE's parameters past it are renumbered one down for the diff, so a kernel that reads another
parameter than before shows up. Exit status 0 when every kernel of BEFORE is in AFTER and the same, else 1.

  nvcc -std=c++17 -O2 -arch=compute_90a -Iengine/include -Iengine/backend -Ikernels -ptx kernels/scan.cu -o before.ptx
  (edit) ... -o after.ptx
  python3 tools/ptx_entry_diff.py before.ptx after.ptx --show scan_row_apply --removed-param 6

Identical PTX is not identical behaviour when a kernel *argument* carries the change: check the host's values
too (a mask passed as an argument slipped through such a check once).
"""
import difflib
import re
import subprocess
import sys

ENTRY = re.compile(r"^(?:\.(?:visible|weak)\s+)?\.entry\s+([\w$.]+)", re.M)


def entries(text):
    """{mangled name: text from .entry to the closing brace of the body}"""
    out = {}
    starts = [(m.start(), m.group(1)) for m in ENTRY.finditer(text)]
    for i, (pos, name) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
        out[name] = text[pos:end]
    return out


def demangle(names):
    p = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
    return p.stdout.splitlines()


def key(demangled):
    """The demangled name without its outermost parameter list (template arguments stay)."""
    depth = 0
    for i in range(len(demangled) - 1, -1, -1):
        c = demangled[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                return demangled[:i]
    return demangled


def normalise(body, removed=None):
    """Body lines without names, register numbers, labels, comments; with `removed`, parameter indices past
    it one down (BEFORE's numbering made AFTER's)."""
    lines = []
    for line in body.splitlines():
        s = line.strip()
        if not s or s.startswith("//") or s.startswith(".loc") or s.startswith(".file"):
            continue
        s = re.sub(r"_Z\w+?(_param_\d+)", r"_Z\1", s)   # keep the parameter suffix
        s = re.sub(r"_Z\w+", "_Z", s)
        s = re.sub(r"%(r|rd|rs|f|fd|p|h|hh|r[bq])\d+", r"%\1", s)
        s = re.sub(r"\$L__\w+", "$L", s)
        if removed is not None:
            s = re.sub(r"_param_(\d+)", lambda m: "_param_%d" % (int(m.group(1)) - (int(m.group(1)) > removed)), s)
        lines.append(s)
    return lines


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    show = argv[argv.index("--show") + 1] if "--show" in argv else None
    removed = int(argv[argv.index("--removed-param") + 1]) if "--removed-param" in argv else None
    before, after = (entries(open(p).read()) for p in argv[1:3])
    bk = dict(zip(demangle(list(before)), before))
    ak = dict(zip(demangle(list(after)), after))
    bkey = {key(d): m for d, m in bk.items()}
    akey = {key(d): m for d, m in ak.items()}
    if len(bkey) != len(bk) or len(akey) != len(ak):
        print("warning: two kernels share a name without parameters; some are not compared")
    same, changed, gone = 0, [], []
    for k, m in sorted(bkey.items()):
        if k not in akey:
            gone.append(k)
        elif normalise(before[m]) == normalise(after[akey[k]]):
            same += 1
        else:
            changed.append(k)
    new = sorted(set(akey) - set(bkey))
    print(f"{len(before)} kernels before, {len(after)} after: {same} identical, {len(changed)} changed, "
          f"{len(gone)} only before, {len(new)} only after")
    for k in changed:
        a, b = normalise(before[bkey[k]], removed), normalise(after[akey[k]])
        diff = [d for d in difflib.unified_diff(a, b, lineterm="", n=0) if d[:1] in "+-" and d[:3] not in ("+++", "---")]
        print(f"changed: {k}  ({len(diff)} lines differ)")
        if show and show in k:
            for d in diff:
                print("    " + d)
    for k in gone:
        print("only before: " + k)
    for k in new:
        print("only after: " + k)
    return 0 if not changed and not gone else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
