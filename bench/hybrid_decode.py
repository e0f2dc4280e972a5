#!/usr/bin/python3
"""Milliseconds a token of the hybrid model's cached decode (ops_transformer.models.hybrid, default
config, batch 1: a 64-token prompt prefilled into a fresh cache, then 100 single-token steps, timed),
on the library or its plain-torch twin; medians over --reps. --ab-linear alternates, in this one
process, the library's Linear on its packed weight with torch's F.linear for the decode rows.

    bench/hybrid_decode.py [--impl ot|torch] [--reps N] [--threads T] [--ab-linear]
"""
import argparse
import time

import torch

from ops_transformer.models.hybrid import HybridConfig, HybridLM


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", choices=("ot", "torch"), default="ot")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ab-linear", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    model = HybridLM(HybridConfig(), impl=a.impl).eval()
    variants = {"": None}
    if a.ab_linear:
        import ops_transformer.layers as layers
        packed = layers._LINEAR_PACKED
        variants = {"F.linear": lambda: setattr(layers, "_LINEAR_PACKED", None),
                    "packed Linear": lambda: setattr(layers, "_LINEAR_PACKED", packed)}
    times = {k: [] for k in variants}
    tok = torch.tensor([[1]])
    with torch.no_grad():
        for r in range(a.reps):
            names = list(variants) if r % 2 == 0 else list(reversed(variants))  # ABBA: drift cancels
            for name in names:
                if variants[name]:
                    variants[name]()
                cache = model.new_cache()
                model(torch.randint(0, 256, (1, 64)), cache=cache)
                for _ in range(10):
                    model(tok, cache=cache)
                t0 = time.perf_counter()
                for _ in range(100):
                    model(tok, cache=cache)
                times[name].append((time.perf_counter() - t0) * 10)
    for name, t in times.items():
        t.sort()
        print(f"{a.impl} {name + ': ' if name else ''}{t[len(t) // 2]:.3f} ms a token (median of {len(t)}; "
              f"quartiles {t[len(t) // 4]:.3f}-{t[3 * len(t) // 4]:.3f}), {1000 / t[len(t) // 2]:.0f} tokens/s")


if __name__ == "__main__":
    main()
