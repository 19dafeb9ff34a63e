#!/usr/bin/env python3
"""JSON lines from bench_model.lua / pytorch_baseline.py (stdin or files) ->
one Markdown table, a row per run, grouped by model.

  python3 bench/table.py bench/results.jsonl
"""
import fileinput
import json
import sys


def impl_name(r):
    c = r.get("config", {})
    if r.get("tool") == "ember":
        name = "Ember" + (" + graph" if c.get("graph") else "")
        return name + f" ({c.get('attn', '?')})"
    name = "PyTorch " + r.get("variant", "eager")
    extra = f", AdamW {c['optimizer']}" if c.get("optimizer", "fused") != "fused" and c.get("mode") == "train" else ""
    return name + f" ({c.get('attn', '?')}{extra})"


def fmt_row(r):
    c = r.get("config", {})
    cells = [c.get("model", "?"), f"{c.get('mode')} {c.get('precision')}", impl_name(r)]
    if r.get("status") != "ok":
        cells += [r.get("status", "?")] + [""] * 5
    else:
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "n/a"
        mem = f"{r['peak_memory_bytes'] / 2**30:.2f}" if r.get("peak_memory_bytes") else "n/a"
        loss = f"{r['final_loss']:.3f}" if r.get("final_loss") is not None else ""
        cells += [f"{r['mean_ms']:.2f} ± {r['std_ms']:.2f}", f"{r['median_ms']:.2f}",
                  f"{r['tokens_per_s']:,.0f}", mfu, mem, loss]
    return "| " + " | ".join(cells) + " |"


def main():
    rows = [json.loads(line) for line in fileinput.input(sys.argv[1:]) if line.strip()]
    if not rows:
        print("(no results)")
        return 1
    r0 = rows[0]
    c0 = r0.get("config", {})
    print(f"Device: {r0.get('device')}, driver {r0.get('driver')}; commit {r0.get('commit')}; "
          f"{r0.get('date')}; batch {c0.get('batch')}, context {c0.get('context')}, "
          f"warmup {c0.get('warmup')}, {c0.get('steps')} timed steps.\n")
    print("| model | step | implementation | ms/step (mean ± std) | median ms | tokens/s | MFU "
          "| peak GiB | loss |")
    print("|---|---|---|---|---|---|---|---|---|")
    order = {}
    for r in rows:
        order.setdefault(r.get("config", {}).get("model"), []).append(r)
    for model_rows in order.values():
        for r in model_rows:
            print(fmt_row(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
