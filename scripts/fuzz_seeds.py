#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target (fuzz/<target>.cpp -> fuzz/corpus/<target>/).

The targets read their input as a stream of choices (shapes, dtypes, options, values), so any
bytes are a valid input; the seeds are a few deterministic byte strings of different lengths
(all zeros: the smallest case of every choice; a counting pattern; pseudo-random ones) that
reach the main branches at once. Re-running it rewrites the same files."""
import pathlib
import random

root = pathlib.Path(__file__).resolve().parent.parent
for src in sorted((root / "fuzz").glob("*.cpp")):
    name = src.stem
    out = root / "fuzz" / "corpus" / name
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(name)
    seeds = [bytes(64), bytes(range(256)), bytes([1] * 128)]
    for n in (24, 96, 384, 1024):
        seeds.append(bytes(rng.randrange(256) for _ in range(n)))
    for i, s in enumerate(seeds):
        (out / f"seed{i}").write_bytes(s)
    print(f"{name}: {len(seeds)} seeds")
