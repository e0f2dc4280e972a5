#!/usr/bin/env python3
"""End-to-end test of `ot demo --ep` under mpirun: usage: check_demo_ep.py MPIRUN OT_BINARY WORKDIR [NP].

A small config (so it runs in seconds, also under ASan) with NP ranks (default 2):
1. exit 0 and a passed verification that includes the expert-parallel MoE layer against one
   process's moe_ffn on every rank's tokens;
2. the --trace file is Chrome trace JSON with one process per rank, each holding its top-level
   moe_ffn_ep calls (one per layer and step) and communication events (dispatch, combine and their
   waits) inside them;
3. a config whose expert count is not a multiple of the rank count fails with an error naming it.
"""
import json
import os
import subprocess
import sys

from checks import check, finish

mpirun, ot, work = sys.argv[1], sys.argv[2], sys.argv[3]
NP = int(sys.argv[4]) if len(sys.argv) > 4 else 2
os.makedirs(work, exist_ok=True)


L, S = 2, 3
config = {
    "model": {"hidden": 128, "layers": L, "vocab": 256,
              "gdn": {"key_heads": 2, "value_heads": 4, "key_head_dim": 32, "value_head_dim": 32},
              "moe": {"experts": 8, "top_k": 3, "intermediate": 64, "shared_intermediate": 64}},
    "run": {"prefill_lengths": [70, 9, 1], "decode_steps": S},
    "verify": {"prefill_lengths": [66, 5], "decode_steps": 1, "layers": 1},
}


def run(cfg, extra):
    path = os.path.join(work, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(NP), ot, "demo", "--ep", "--config", path, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


trace_path = os.path.join(work, "trace_ep.json")
if os.path.exists(trace_path):
    os.remove(trace_path)
r = run(config, ["--trace", trace_path])
print(r.stdout)
print(r.stderr, file=sys.stderr)
check(r.returncode == 0, f"ot demo --ep exited {r.returncode}")
check("verification passed" in r.stdout, "no passed verification")
check("moe_ffn (expert parallel vs 1 process)" in r.stdout, "the expert-parallel layer was not verified")
check(r.stdout.count("== prefill") == 1, "tables printed by more than one rank (or none)")

with open(trace_path) as f:
    trace = json.load(f)  # raises (test fails) when the file is not JSON
events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
pids = sorted({e["pid"] for e in events})
check(pids == list(range(NP)), f"trace processes {pids}, expected one per rank 0..{NP - 1}")
names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("ph") == "M" and e["name"] == "process_name"}
check(names == {f"rank {r}" for r in range(NP)}, f"process names {names}")
steps = 1 + S
for p in range(NP):
    mine = [e for e in events if e["pid"] == p]
    layers = [e for e in mine if e["name"] == "moe_ffn_ep"]
    check(len(layers) == steps * L, f"rank {p}: {len(layers)} moe_ffn_ep events, expected {steps * L}")
    check(not any(e["name"] == "moe_ffn" for e in mine), f"rank {p}: single-process moe_ffn in the timed run")
    comm = [e for e in mine if e.get("cat") == "comm"]
    for want in ("moe_distribute_dispatch", "moe_distribute_dispatch_wait", "moe_distribute_combine", "moe_distribute_combine_wait"):
        n = sum(e["name"] == want for e in comm)
        check(n >= steps * L, f"rank {p}: {n} '{want}' events, expected at least {steps * L}")
    # Every communication event lies inside a moe_ffn_ep call of its rank.
    for c in comm:
        inside = any(l["ts"] - 1e-3 <= c["ts"] and c["ts"] + c["dur"] <= l["ts"] + l["dur"] + 1e-3 for l in layers)
        check(inside, f"rank {p}: {c['name']} at {c['ts']} outside every moe_ffn_ep call")
        if not inside:
            break
print(f"trace: {len(events)} events over {len(pids)} ranks")

# Experts not divisible by the rank count: a clear error naming the field.
bad = json.loads(json.dumps(config))
bad["model"]["moe"]["experts"] = 7 if NP > 1 else 0
if NP > 1:
    r = run(bad, [])
    check(r.returncode != 0, "7 experts over several ranks were accepted")
    check("model.moe.experts" in r.stderr, f"error does not name model.moe.experts: {r.stderr.strip()[-400:]!r}")

finish("all demo --ep checks passed")
