#!/usr/bin/env python3
"""Charts for `ot report`: usage report_charts.py REPORT.json OUTDIR.

Draws, with matplotlib, one PNG per rate kind: GFLOP/s (compute-bound cases) and GB/s
(bandwidth-bound cases), the fast path beside the reference path of the same run, with this
machine's peak as a line; and the fraction of peak of every case. Prints "wrote PATH" per chart.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def label(r):
    return f"{r['op']}: {r['name']}"


def rows_axis(ax, names, xlabel):
    """Horizontal bars: one labelled row per case, first case on top, vertical grid lines."""
    ax.set_yticks(list(range(len(names))))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print("wrote", path)


def rate_chart(rows, key, unit, peak, peak_label, path):
    if not rows:
        return
    names = [label(r) for r in rows]
    fast = [r[key] for r in rows]
    # The reference's rate follows from the same work in ref_ms.
    ref = [r[key] * r["ms"] / r["ref_ms"] if r.get("ref_ms", 0) > 0 else 0 for r in rows]
    h = 0.38
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(rows) + 1.6))
    ys = range(len(rows))
    ax.barh([y - h / 2 for y in ys], fast, h, label="ops-transformer", color="#1f77b4")
    ax.barh([y + h / 2 for y in ys], ref, h, label="reference path", color="#bbbbbb")
    if peak > 0:
        ax.axvline(peak, color="#d62728", linestyle="--", label=f"{peak_label} {peak:.0f} {unit}")
    rows_axis(ax, names, unit)
    positive = [v for v in fast + ref + [peak] if v > 0]
    if positive and max(positive) / min(positive) > 50:
        ax.set_xscale("log")
    ax.legend(fontsize=8, loc="lower right")
    save(fig, path)


def peak_chart(rows, path):
    rows = [r for r in rows if r.get("peak_fraction", 0) > 0]
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(9, 0.4 * len(rows) + 1.4))
    ys = range(len(rows))
    colors = ["#2ca02c" if "gbps" in r else "#1f77b4" for r in rows]
    ax.barh(list(ys), [100 * r["peak_fraction"] for r in rows], color=colors)
    ax.axvline(100, color="#d62728", linestyle="--")
    rows_axis(ax, [label(r) for r in rows], "% of machine peak (blue: matrix GFLOP/s, green: memory GB/s)")
    save(fig, path)


def ep_chart(rows, path):
    """Expert parallelism: dispatch + combine time and bytes on the wire beside the baseline."""
    if not rows:
        return
    names = [r["name"].replace("ep-h7168-k8-e64-", "") + f" ({r.get('ranks', '?')} ranks)" for r in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 0.6 * len(rows) + 1.8))
    ys = range(len(rows))
    h = 0.38
    for ax, key, base, unit, scale in ((a1, "ms", "baseline_ms", "ms (slowest rank)", 1), (a2, "bytes_sent", "baseline_bytes_sent", "MB sent (all ranks)", 1e-6)):
        ax.barh([y - h / 2 for y in ys], [r.get(key, 0) * scale for r in rows], h, label="dedup dispatch + combine", color="#1f77b4")
        ax.barh([y + h / 2 for y in ys], [r.get(base, 0) * scale for r in rows], h, label="per-(token, expert) baseline", color="#bbbbbb")
        rows_axis(ax, names, unit)
    a1.legend(fontsize=8, loc="lower right")
    save(fig, path)


def main():
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    out = sys.argv[2]
    ep = [r for r in doc["results"] if r.get("op") == "ep"]
    rows = [r for r in doc["results"] if r.get("op") != "ep"]  # wire GB/s is not a memory-bandwidth rate
    compute = [r for r in rows if "gbps" not in r and r.get("gflops", 0) > 0]
    memory = [r for r in rows if r.get("gbps", 0) > 0]
    rate_chart(compute, "gflops", "GFLOP/s", doc.get("peak_bf16_gflops", 0), "bf16 matrix peak", os.path.join(out, "report_gflops.png"))
    rate_chart(memory, "gbps", "GB/s", doc.get("peak_gbps", 0), "memory bandwidth", os.path.join(out, "report_gbps.png"))
    peak_chart(rows, os.path.join(out, "report_peak.png"))
    ep_chart(ep, os.path.join(out, "report_ep.png"))


if __name__ == "__main__":
    main()
