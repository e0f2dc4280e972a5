"""Failure bookkeeping shared by the end-to-end check scripts of this folder: every failed check is
printed as it happens, and finish() exits non-zero when any failed."""
import sys

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


def finish(passed_msg):
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print(passed_msg)
