"""Check an Ember memory pickle the way PyTorch's memory tools read it.

    python3 tests/lua/memory_check.py SNAPSHOT.pickle   -> one JSON line of facts

Asserts what torch/cuda/_memory_viz.py and MemoryViz.js rely on: the keys of
segments, blocks and trace entries; blocks that tile their segment exactly
(annotate_snapshot gives block addresses by adding sizes; segsum asserts the
sum); and a trace that replays backwards from the final state as the segment
view does (an alloc removes a live block, a free brings one back inside a
live segment, segment events add and remove segments). Prints counts that the
specs (tests/lua/memory_spec.lua, tests/gpu/memory_spec.lua) check.
"""
import json
import pickle
import sys

ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "snapshot"}


def main(path):
    with open(path, "rb") as f:
        d = pickle.load(f)
    assert isinstance(d, dict), type(d)
    assert isinstance(d["segments"], list) and isinstance(d["device_traces"], list)
    out = {"actions": {}, "categories": set(), "files": set(), "names": set(), "modules": set(),
           "phases": set(), "segments": len(d["segments"]), "active_bytes": {}, "devices": d["ember"]["devices"],
           "events": 0}
    for seg in d["segments"]:
        for k in ("device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                  "segment_type", "frames", "blocks"):
            assert k in seg, "segment lacks " + k
        addr, active = seg["address"], 0
        for b in seg["blocks"]:
            for k in ("address", "size", "requested_size", "state", "frames"):
                assert k in b, "block lacks " + k
            assert b["address"] == addr, "blocks do not tile the segment"
            assert b["state"] in ("active_allocated", "inactive"), b["state"]
            if b["state"] == "active_allocated":
                assert 0 < b["requested_size"] <= b["size"], b
                active += b["size"]
                out["categories"].add(b.get("category", "unknown"))
            addr += b["size"]
        assert addr - seg["address"] == seg["total_size"], "blocks do not sum to total_size"
        assert active == seg["allocated_size"] == seg["active_size"]
        dev = d["ember"]["devices"][seg["device"]]
        out["active_bytes"][dev] = out["active_bytes"].get(dev, 0) + active

    for dev, trace in enumerate(d["device_traces"]):
        segs = {s["address"]: s["total_size"] for s in d["segments"] if s["device"] == dev}
        blocks = {b["address"]: b["size"] for s in d["segments"] if s["device"] == dev
                  for b in s["blocks"] if b["state"] == "active_allocated"}

        def inside(a):
            return any(sa <= a < sa + sz for sa, sz in segs.items())

        for e in reversed(trace):
            for k in ("action", "addr", "size", "stream", "frames", "time_us"):
                assert k in e, "trace entry lacks " + k
            act, a = e["action"], e["addr"]
            assert act in ACTIONS, act
            out["actions"][act] = out["actions"].get(act, 0) + 1
            out["events"] += 1
            for fr in e["frames"]:
                assert isinstance(fr["filename"], str) and isinstance(fr["line"], int) and isinstance(fr["name"], str)
                out["files"].add(fr["filename"].split("/")[-1] + ":" + str(fr["line"]))
            if e["frames"]:
                out["names"].add(e["frames"][0]["name"])
            if "category" in e:
                out["categories"].add(e["category"])
            if "module" in e:
                out["modules"].add(e["module"])
                out["phases"].add(e["phase"])
            if act == "alloc":
                assert blocks.pop(a, None) is not None, "alloc of a block that is not live after it"
            elif act == "free_completed":
                assert a not in blocks and inside(a), "free of a block outside the live segments"
                blocks[a] = e["size"]
            elif act == "free_requested":
                assert a in blocks
            elif act == "segment_alloc":
                assert segs.pop(a, None) is not None, "segment_alloc of a segment that is not live after it"
            elif act == "segment_free":
                assert a not in segs
                segs[a] = e["size"]
    for k in ("categories", "files", "names", "modules", "phases"):
        out[k] = sorted(out[k])
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
