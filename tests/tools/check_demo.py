#!/usr/bin/env python3
"""End-to-end test of `ot demo`: usage: check_demo.py OT_BINARY WORKDIR.

1. The default run with --trace exits 0 (its verification passed) and the trace is Chrome trace
   JSON holding exactly one complete event per operator call the model makes (counts derived here
   from the printed config, independently of the demo's own tables), nested calls inside their parent.
2. Config files with a bad value, a wrong type or an unknown key fail with an error naming the field.
"""
import json
import os
import subprocess
import sys

from checks import check, finish

ot, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)


def run(args):
    return subprocess.run([ot, "demo", *args], capture_output=True, text=True, timeout=900)


# ---- the default run and its trace ------------------------------------------------------------
cfg = json.loads(run(["--print-config"]).stdout)
L = cfg["model"]["layers"]
S = cfg["run"]["decode_steps"]
trace_path = os.path.join(work, "trace.json")
if os.path.exists(trace_path):
    os.remove(trace_path)
r = run(["--trace", trace_path])
print(r.stdout)
print(r.stderr, file=sys.stderr)
check(r.returncode == 0, f"default run exited {r.returncode}")
check("verification passed" in r.stdout, "default run did not report a passed verification")
# Each phase ends with its roofline: prefill against the matrix peak, decode against the read bandwidth.
import re
prefill_roof = re.search(r"roofline: ([0-9.]+) GFLOP counted in [0-9.]+ ms = [0-9.]+ GFLOP/s, ([0-9]+)% of the \w+ matrix peak", r.stdout)
decode_roof = re.search(r"roofline: ([0-9.]+) MB counted per step in [0-9.]+ ms = [0-9.]+ GB/s, ([0-9]+)% of the read bandwidth", r.stdout)
check(prefill_roof is not None and float(prefill_roof.group(1)) > 0, "prefill printed no roofline line with counted GFLOP")
check(S == 0 or (decode_roof is not None and float(decode_roof.group(1)) > 0), "decode printed no roofline line with counted MB")

with open(trace_path) as f:
    trace = json.load(f)  # raises (test fails) when the file is not JSON
events = trace["traceEvents"]
ops = [e for e in events if e.get("cat") == "op"]
for e in events:
    check(e.get("ph") == "X" and e["dur"] >= 0 and isinstance(e["ts"], (int, float)), f"malformed event {e}")

# Calls per step of the model: per block 2 rms_norm, in_proj, the GDN core, gated_rms_norm,
# out_proj, moe_ffn; per step one embedding, gather_rows, final rms_norm, lm_head, argmax.
steps = 1 + S
expected = {
    "embedding": steps,
    "rms_norm": steps * (2 * L + 1),
    "in_proj": steps * L,
    "gated_rms_norm": steps * L,
    "out_proj": steps * L,
    "gather_rows": steps,
    "lm_head": steps,
    "argmax": steps,
}
names = {e["name"] for e in ops}
if "chunk_gated_delta_rule_fwd" in names or "recurrent_gated_delta_rule" in names:
    expected.update({"chunk_gated_delta_rule_fwd": L, "gdn_gates": L, "gdn_cache_store": L, "recurrent_gated_delta_rule": S * L})
if "moe_ffn" in names:
    expected["moe_ffn"] = steps * L

# Top-level calls only: an event inside another one (an operator calling a public operator) is
# that operator's child and is not a call the model made.
ops.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"]))
top, stack = [], []
for e in ops:
    while stack and (stack[-1]["pid"], stack[-1]["tid"]) == (e["pid"], e["tid"]) and stack[-1]["ts"] + stack[-1]["dur"] < e["ts"] + e["dur"] - 1e-3:
        stack.pop()
    if stack and (stack[-1]["pid"], stack[-1]["tid"]) != (e["pid"], e["tid"]):
        stack = []
    if not stack:
        top.append(e)
    stack.append(e)
counts = {}
for e in top:
    counts[e["name"]] = counts.get(e["name"], 0) + 1
for name, n in expected.items():
    check(counts.get(name, 0) == n, f"trace holds {counts.get(name, 0)} top-level '{name}' events, expected {n}")
extra = set(counts) - set(expected)
check(not extra, f"unexpected top-level operator events: {sorted(extra)}")
phases = [e for e in events if e.get("cat") == "phase"]
check(len(phases) == 1 + S, f"expected {1 + S} phase events (prefill + decode steps), got {len(phases)}")
print(f"trace: {len(events)} events, top-level operator calls {counts}")

# ---- --compare-isolated: a pipeline vs isolated row per top-level operator of each phase --------
r = run(["--compare-isolated", "--no-verify", "--decode-steps", "2"])
check(r.returncode == 0, f"--compare-isolated exited {r.returncode}: {r.stderr.strip()!r}")
for phase in ("prefill", "decode"):
    check(f"{phase} operators in the pipeline vs in isolation" in r.stdout, f"--compare-isolated printed no {phase} comparison")
rows = re.findall(r"^(\w+)\s+\d+\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)", r.stdout, re.M)
for op in ("in_proj", "out_proj", "rms_norm", "lm_head") + (("moe_ffn",) if "moe_ffn" in names else ()):
    got = [row for row in rows if row[0] == op]
    check(len(got) == 2 and all(float(g[2]) > 0 for g in got), f"--compare-isolated: {op} has no prefill and decode row with an isolated time")

# ---- quantised experts: each format's moe_ffn verified against its dequantise-then-multiply reference
small = os.path.join(work, "small.json")  # one block, short prompts: the formats, not the speed
with open(small, "w") as f:
    json.dump({"model": {"layers": 1}, "run": {"prefill_lengths": [33, 5, 1], "decode_steps": 2}, "verify": {"prefill_lengths": [9, 1]}}, f)
for w in ("int8", "int4-g32"):
    r = run(["--config", small, "--weights", w])
    check(r.returncode == 0, f"--weights {w} exited {r.returncode}: {r.stderr.strip()!r}")
    check(f"experts {w}" in r.stdout, f"--weights {w}: the header does not name the expert format")
    bits = w[3]  # int8 -> w8, int4-* -> w4: the kernel names of the quantised GEMM
    check(re.search(rf"^moe_ffn .*_w{bits}\b", r.stdout, re.M) is not None, f"--weights {w}: moe_ffn does not report a w{bits} kernel")
    check(re.search(r"^moe_ffn\s+\d+\s+\S+\s+\S+\s+ok", r.stdout, re.M) is not None, f"--weights {w}: no verified moe_ffn row")
# the shared expert quantised with the routed ones (model.moe.quantise_shared_expert)
small_shared = os.path.join(work, "small_shared.json")
with open(small_shared, "w") as f:
    json.dump({"model": {"layers": 1, "moe": {"quantise_shared_expert": True}}, "run": {"prefill_lengths": [33, 5, 1], "decode_steps": 2},
               "verify": {"prefill_lengths": [9, 1]}}, f)
r = run(["--config", small_shared, "--weights", "w8a8"])
check(r.returncode == 0 and re.search(r"^moe_ffn\s+\d+\s+\S+\s+\S+\s+ok", r.stdout, re.M) is not None,
      f"quantise_shared_expert with w8a8: no verified moe_ffn row ({r.returncode}: {r.stderr.strip()!r})")
with open(small_shared, "w") as f:
    json.dump({"model": {"layers": 1, "moe": {"quantise_shared_expert": True, "shared_intermediate": 96}}}, f)
r = run(["--config", small_shared, "--weights", "int4-g64"])  # 96 is no multiple of 64
check(r.returncode != 0 and "model.moe.quantise_shared_expert" in r.stderr, f"a group not dividing the shared I was accepted: {r.stderr.strip()!r}")
r = run(["--weights", "int4-g48"])
check(r.returncode != 0 and "model.moe.expert_weights" in r.stderr, f"--weights int4-g48 was accepted: {r.stderr.strip()!r}")

# ---- bad configs -------------------------------------------------------------------------------
bad = [
    ({"model": {"gdn": {"value_heads": 6}}}, "model.gdn.value_heads"),  # not a multiple of key_heads (4)
    ({"model": {"moe": {"top_k": 0}}}, "model.moe.top_k"),
    ({"run": {"decode_steps": "many"}}, "run.decode_steps"),
    ({"run": {"prefill_lengths": [5, 0]}}, "run.prefill_lengths[1]"),
    ({"model": {"hiden": 1024}}, "model.hiden"),
    ({"model": {"dtype": "int8"}}, "model.dtype"),
]
for i, (doc, field) in enumerate(bad):
    path = os.path.join(work, f"bad{i}.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    r = run(["--config", path])
    check(r.returncode != 0, f"config {doc} was accepted")
    check(field in r.stderr and "error" in r.stderr, f"config {doc}: error does not name '{field}': {r.stderr.strip()!r}")

finish("all demo checks passed")
