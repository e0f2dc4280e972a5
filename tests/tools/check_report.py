#!/usr/bin/env python3
"""Smoke test of `ot report --quick`: usage: check_report.py OT_BINARY OUTDIR.

Runs the quick report (tiny stand-in cases) and checks that it wrote report.md with a table per
benchmark family that ran, report.json with results and the machine peaks, and PNG charts drawn by
matplotlib (PNG signature, non-trivial size), each linked from the Markdown.
"""
import json
import os
import shutil
import subprocess
import sys

from checks import check, failures, finish

ot, out = sys.argv[1], sys.argv[2]
shutil.rmtree(out, ignore_errors=True)
r = subprocess.run([ot, "report", "--quick", "--out", out], capture_output=True, text=True, timeout=900)
print(r.stdout)
print(r.stderr, file=sys.stderr)


check(r.returncode == 0, f"ot report exited {r.returncode}")
md_path, json_path = os.path.join(out, "report.md"), os.path.join(out, "report.json")
check(os.path.exists(md_path), "no report.md")
check(os.path.exists(json_path), "no report.json")
if not failures:
    md = open(md_path).read()
    doc = json.load(open(json_path))
    ops = {x["op"] for x in doc["results"]}
    check({"gemm", "moe_routing", "recurrent_gated_delta_rule"} <= ops, f"families measured: {sorted(ops)}")
    check(doc["peak_bf16_gflops"] > 0 and doc["peak_gbps"] > 0, "machine peaks missing from report.json")
    for op in ops - {"ep"}:
        check(f"## {op}" in md, f"no table for {op} in report.md")
    if "ep" in ops:
        check("% of baseline" in md, "no expert-parallel table")
    pngs = [f for f in os.listdir(out) if f.endswith(".png")]
    check(len(pngs) >= 2, f"charts written: {pngs}")
    for f in pngs:
        data = open(os.path.join(out, f), "rb").read()
        check(data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000, f"{f} is not a real PNG")
        check(f"]({f})" in md, f"{f} not linked from report.md")
finish("report smoke test passed")
