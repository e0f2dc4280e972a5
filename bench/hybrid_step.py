#!/usr/bin/python3
"""Milliseconds a training step of the hybrid model (ops_transformer.models.hybrid, default config,
8 x 128 tokens, AdamW, gradient clipping), on the library or as its plain-torch twin; --profile adds
a torch.profiler table of three steps. For comparing builds: run it alternately with LD_LIBRARY_PATH
pointing at each build's libot.

    bench/hybrid_step.py [--impl ot|torch] [--steps N] [--threads T] [--profile]
"""
import argparse
import time

import torch
import torch.nn.functional as F

from ops_transformer.models.hybrid import HybridConfig, HybridLM


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", choices=("ot", "torch"), default="ot")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    cfg = HybridConfig()
    model = HybridLM(cfg, impl=a.impl)
    opt = model.optimizer(1e-3)
    ids = torch.randint(0, cfg.vocab_size, (8, 129))

    def step():
        logits, aux = model(ids[:, :-1])
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        (ce + 0.01 * aux).backward()
        model.clip_grad_norm_(1.0)
        opt.step()

    for _ in range(3):
        step()
    t = time.perf_counter()
    for _ in range(a.steps):
        step()
    dt = (time.perf_counter() - t) / a.steps
    print(f"{a.impl}: {dt * 1e3:.1f} ms a step, {ids[:, :-1].numel() / dt:.0f} tokens/s ({a.steps} steps, {a.threads} threads)")
    if a.profile:
        from torch.profiler import profile
        with profile() as prof:
            for _ in range(3):
                step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


if __name__ == "__main__":
    main()
