#!/usr/bin/env python3
"""The same bf16 moe_ffn and chunk_gated_delta_rule_fwd give the same bits in separate processes.
Usage: check_determinism.py <determinism_probe> [runs]. Each run is a fresh process, so a kernel
picked by a timing at first use (or any other run-to-run choice) shows as differing hashes."""
import subprocess
import sys


def main():
    probe, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    outputs = [subprocess.run([probe], check=True, capture_output=True, text=True).stdout for _ in range(runs)]
    lines = outputs[0].splitlines()
    assert len(lines) == 4 and all(len(l.split()) >= 3 for l in lines), outputs[0]
    for i, out in enumerate(outputs[1:], 2):
        if out != outputs[0]:
            print(f"run 1:\n{outputs[0]}run {i}:\n{out}")
            print("determinism: FAILED (outputs differ between processes)")
            return 1
    print(outputs[0], end="")
    print(f"determinism: {runs} processes, identical output bits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
