"""`python3 -m ops_transformer.train`: trains the hybrid model (ops_transformer.models.hybrid) on the
fortunes corpus (Debian's fortunes-min, /usr/share/games/fortunes) with AdamW, on the library and on
its plain-torch twin from the same initial weights and batches, and writes a report (report.md,
report.json, loss.png): loss vs step for both, tokens/s for each, bits/char vs the corpus's unigram
entropy. --check-ref trains the twin for every step and reports the largest loss difference (exit 1
past --ref-tol); --generate N samples N bytes from the trained model through the cached decode path
on both implementations and reports decode tokens/s. Deterministic given --seed and --threads."""
import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from .models.hybrid import HybridConfig, HybridLM

CORPUS = ["/usr/share/games/fortunes/fortunes", "/usr/share/games/fortunes/literature",
          "/usr/share/games/fortunes/riddles"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m ops_transformer.train", description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--steps", type=int, default=300, help="training steps of the library model")
    a("--ref-steps", type=int, default=100, help="training steps of the plain-torch twin (0: none)")
    a("--check-ref", action="store_true", help="train the twin for --steps too; fail past --ref-tol")
    a("--ref-tol", type=float, default=0.05, help="largest |loss difference| (nats) --check-ref accepts")
    a("--seed", type=int, default=1)
    a("--threads", type=int, default=2)
    a("--batch", type=int, default=8)
    a("--seq", type=int, default=128)
    a("--lr", type=float, default=3e-3)
    a("--weight-decay", type=float, default=0.01)
    a("--aux", type=float, default=0.01, help="coefficient of the MoE load-balancing loss")
    a("--hidden", type=int, default=128)
    a("--layers", type=int, default=4)
    a("--experts", type=int, default=8)
    a("--top-k", type=int, default=2)
    a("--inter", type=int, default=128, help="expert intermediate size")
    a("--heads", type=int, default=4, help="attention heads (head dim --head-dim)")
    a("--head-dim", type=int, default=32)
    a("--k-heads", type=int, default=2, help="GDN key heads")
    a("--v-heads", type=int, default=4, help="GDN value heads")
    a("--gdn-dim", type=int, default=32, help="GDN key and value head dim")
    a("--corpus", nargs="+", default=CORPUS)
    a("--out", default="hybrid_report", help="report folder")
    a("--generate", type=int, default=0, metavar="N", help="sample N bytes after training (cached decode)")
    a("--prompt", default="The ")
    a("--temperature", type=float, default=0.8)
    return p.parse_args(argv)


def read_corpus(files):
    data = b""
    for f in files:
        try:
            with open(f, "rb") as fh:
                data += fh.read()
        except OSError as e:
            sys.exit(f"train: cannot read corpus file {f} ({e.strerror}; install fortunes-min: scripts/setup.sh)")
    return np.frombuffer(data, dtype=np.uint8)


def unigram_bits(data):
    p = np.bincount(data, minlength=256).astype(np.float64) / len(data)
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


def batches(data, n, batch, seq, seed):
    """n batches [batch, seq + 1] of random windows, the same for every implementation."""
    rng = np.random.RandomState(seed)
    starts = rng.randint(0, len(data) - seq - 1, size=(n, batch))
    idx = starts[..., None] + np.arange(seq + 1)
    return torch.from_numpy(data[idx].astype(np.int64))


class Bar:
    """A one-line progress bar on a terminal, a line every 10% otherwise."""

    def __init__(self, label, total):
        self.label, self.total, self.tty, self.next = label, total, sys.stderr.isatty(), 0

    def update(self, i, loss, tps):
        if self.tty:
            w = 30 * i // self.total
            sys.stderr.write(f"\r{self.label:5s} [{'#' * w}{'.' * (30 - w)}] {i}/{self.total} "
                             f"loss {loss:.3f} {tps:,.0f} tok/s ")
            if i == self.total:
                sys.stderr.write("\n")
        elif i >= self.next or i == self.total:
            print(f"{self.label}: step {i}/{self.total} loss {loss:.3f} ({tps:,.0f} tok/s)", file=sys.stderr)
            self.next = i + max(1, self.total // 10)
        sys.stderr.flush()


def lr_at(step, steps, lr):
    """Linear warm-up over 20 steps, cosine decay to 10%."""
    warm = min(1.0, (step + 1) / 20)
    return lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / max(steps, 1))))


def train(model, data, steps, total_steps, args, label):
    """Trains in place on the first `steps` of the run's batches; returns the per-step losses (nats,
    cross-entropy only) and the tokens/s of the steps after the first 3 (warm-up)."""
    opt = model.optimizer(args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    data_b = batches(data, steps, args.batch, args.seq, args.seed + 1)
    losses, bar, tokens = [], Bar(label, steps), args.batch * args.seq
    t_start = None
    for step in range(steps):
        if step == min(3, steps - 1):
            t_start, t_steps = time.perf_counter(), steps - step
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total_steps, args.lr)
        ids = data_b[step]
        logits, aux = model(ids[:, :-1])
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        (ce + args.aux * aux).backward()
        model.clip_grad_norm_(1.0)
        opt.step()
        losses.append(ce.item())
        el = time.perf_counter() - t_start if t_start is not None else 0.0
        done = step + 1 - (steps - t_steps) if t_start is not None else 0
        bar.update(step + 1, losses[-1], tokens * done / el if el > 0 else 0.0)
    seconds = time.perf_counter() - t_start
    return losses, tokens * t_steps / seconds, seconds


@torch.no_grad()
def evaluate(model, data, args, n=8):
    """Mean cross-entropy (bits/char) on n held-out batches (the inference path)."""
    b = batches(data, n, args.batch, args.seq, args.seed + 2)
    tot = 0.0
    for ids in b:
        logits, _ = model(ids[:, :-1])
        tot += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).item()
    return tot / n / math.log(2)


@torch.no_grad()
def generate(model, prompt, n, temperature, seed):
    """Prefill the prompt into a fresh cache, then n single-token decode steps; returns (bytes,
    decode tokens/s)."""
    gen = torch.Generator().manual_seed(seed)
    cache = model.new_cache()
    ids = torch.tensor([list(prompt.encode())], dtype=torch.int64)
    logits, _ = model(ids, cache=cache)
    out = []
    t0 = time.perf_counter()
    for _ in range(n):
        p = torch.softmax(logits[0, -1].float() / max(temperature, 1e-6), -1)
        tok = int(torch.multinomial(p, 1, generator=gen))
        out.append(tok)
        logits, _ = model(torch.tensor([[tok]]), cache=cache)
    return bytes(out), n / (time.perf_counter() - t0)


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(__file__)).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def torch_blas():
    """The BLAS library torch's fp32 matmuls run on in this process (libblas.so.3 as loaded: Debian's
    reference BLAS unless LD_LIBRARY_PATH puts OpenBLAS first; docs/hybrid.md, "BLAS")."""
    torch.ones(8, 8) @ torch.ones(8, 8)
    try:
        with open("/proc/self/maps") as maps:
            libs = sorted({line.split()[-1] for line in maps if "blas" in line.split()[-1].rsplit("/", 1)[-1]})
    except OSError:
        return "unknown"
    return ", ".join(libs) or "none loaded"


def plot(path, runs, unigram):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, losses in runs.items():
        ax.plot(range(1, len(losses) + 1), np.array(losses) / math.log(2), label=label, lw=1)
    ax.axhline(unigram, color="gray", ls="--", lw=1, label=f"unigram entropy {unigram:.2f}")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (bits/char)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OT_NUM_THREADS", str(args.threads))
    torch.manual_seed(args.seed)
    data = read_corpus(args.corpus)
    split = int(len(data) * 0.95)
    train_data, held_out = data[:split], data[split:]
    unigram = unigram_bits(data)
    cfg = HybridConfig(hidden_size=args.hidden, num_layers=args.layers, num_attention_heads=args.heads,
                       head_dim=args.head_dim, linear_num_key_heads=args.k_heads, linear_num_value_heads=args.v_heads,
                       linear_key_head_dim=args.gdn_dim, linear_value_head_dim=args.gdn_dim, num_experts=args.experts,
                       moe_intermediate_size=args.inter, top_k=args.top_k)
    lib = HybridLM(cfg).init_weights(args.seed)
    ref_steps = args.steps if args.check_ref else min(args.ref_steps, args.steps)
    twin = None
    if ref_steps:
        twin = HybridLM(cfg, impl="torch")
        twin.load_state_dict(lib.state_dict())
    n_params = sum(p.numel() for p in lib.parameters())
    print(f"corpus: {len(data):,} bytes, unigram entropy {unigram:.3f} bits/char; model: {n_params:,} parameters, "
          f"{cfg.num_layers} layers ({sum(cfg.is_attention(i) for i in range(cfg.num_layers))} attention), "
          f"{cfg.num_experts} experts top-{cfg.top_k}; {args.batch}x{args.seq} tokens/step, {args.threads} threads",
          file=sys.stderr)
    rep = {"command": "python3 -m ops_transformer.train " + " ".join(argv if argv is not None else sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": git_commit(), "machine": cpu_name(),
           "threads": args.threads, "torch": torch.__version__, "torch_blas": torch_blas(),
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"), "config": cfg.to_dict(), "parameters": n_params,
           "batch": args.batch, "seq": args.seq, "corpus_bytes": int(len(data)), "unigram_bits_per_char": unigram}
    losses = {}
    losses["library"], tps, sec = train(lib, train_data, args.steps, args.steps, args, "ot")
    rep["library"] = {"steps": args.steps, "tokens_per_s": tps, "seconds": sec,
                      "final_train_bits_per_char": float(np.mean(losses["library"][-20:]) / math.log(2)),
                      "held_out_bits_per_char": evaluate(lib, held_out, args)}
    if twin is not None:
        losses["torch twin"], tps_t, sec_t = train(twin, train_data, ref_steps, args.steps, args, "torch")
        n = len(losses["torch twin"])
        diff = np.abs(np.array(losses["library"][:n]) - np.array(losses["torch twin"]))
        rep["twin"] = {"steps": n, "tokens_per_s": tps_t, "seconds": sec_t,
                       "final_train_bits_per_char": float(np.mean(losses["torch twin"][-20:]) / math.log(2))}
        rep["training_speedup"] = tps / tps_t
        rep["max_loss_diff"] = float(diff.max())
        rep["max_loss_diff_step"] = int(diff.argmax()) + 1
        rep["max_loss_diff_first_100"] = float(diff[:100].max())
    if args.generate:
        text, dps = generate(lib, args.prompt, args.generate, args.temperature, args.seed)
        rep["generate"] = {"prompt": args.prompt, "tokens": args.generate, "text": text.decode("utf-8", "replace"),
                           "library_decode_tokens_per_s": dps}
        if twin is not None:
            twin.load_state_dict(lib.state_dict())  # the trained weights
            text_t, dps_t = generate(twin, args.prompt, args.generate, args.temperature, args.seed)
            rep["generate"].update(twin_decode_tokens_per_s=dps_t, decode_speedup=dps / dps_t,
                                   twin_text_equal=text_t == text)
    rep["losses"] = losses
    os.makedirs(args.out, exist_ok=True)
    plot(os.path.join(args.out, "loss.png"), losses, unigram)
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(rep, f, indent=1)
    md = markdown(rep)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(md)
    print(md)
    if args.check_ref and rep.get("max_loss_diff", 0.0) > args.ref_tol:
        print(f"check-ref FAILED: largest loss difference {rep['max_loss_diff']:.3g} > {args.ref_tol}", file=sys.stderr)
        return 1
    return 0


def markdown(rep):
    L = rep["library"]
    rows = [("command", f"`{rep['command']}`"), ("date, commit, machine",
                                                 f"{rep['date']}, {rep['commit']}, {rep['machine']} ({rep['threads']} threads)"),
            ("torch's BLAS", f"{rep['torch_blas']}; OMP_WAIT_POLICY {rep['omp_wait_policy']}"),
            ("model", f"{rep['parameters']:,} parameters, {rep['config']['num_layers']} layers, "
                      f"{rep['config']['num_experts']} experts top-{rep['config']['top_k']}, "
                      f"{rep['batch']}x{rep['seq']} tokens/step"),
            ("library training", f"{L['tokens_per_s']:,.0f} tokens/s ({L['steps']} steps, {L['seconds']:.1f} s)")]
    if "twin" in rep:
        T = rep["twin"]
        rows += [("torch twin training", f"{T['tokens_per_s']:,.0f} tokens/s ({T['steps']} steps, {T['seconds']:.1f} s)"),
                 ("training speed-up", f"{rep['training_speedup']:.2f}x"),
                 ("largest loss difference", f"{rep['max_loss_diff']:.2e} nats (step {rep['max_loss_diff_step']}); "
                                             f"first 100 steps {rep['max_loss_diff_first_100']:.2e}")]
    rows += [("bits/char", f"train (last 20 steps) {L['final_train_bits_per_char']:.3f}, held-out "
                           f"{L['held_out_bits_per_char']:.3f}; unigram entropy {rep['unigram_bits_per_char']:.3f} "
                           f"({rep['unigram_bits_per_char'] - L['held_out_bits_per_char']:.2f} below)")]
    if "generate" in rep:
        G = rep["generate"]
        d = f"library {G['library_decode_tokens_per_s']:,.0f} tokens/s"
        if "twin_decode_tokens_per_s" in G:
            d += f", torch twin {G['twin_decode_tokens_per_s']:,.0f} ({G['decode_speedup']:.2f}x; same text: {G['twin_text_equal']})"
        rows.append((f"decode ({G['tokens']} tokens, batch 1)", d))
    out = "| | |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
    if "generate" in rep:
        out += "\nSample (prompt " + repr(rep["generate"]["prompt"]) + "):\n\n```\n" + rep["generate"]["prompt"] + \
               rep["generate"]["text"] + "\n```\n"
    return out + "\n![loss vs step](loss.png)\n"


if __name__ == "__main__":
    sys.exit(main())
