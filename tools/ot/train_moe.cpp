// `ot train-moe`: trains a small byte-level MoE language model from scratch on a text corpus that a
// Debian package ships (fortunes-min: /usr/share/games/fortunes), with AdamW, printing loss and
// tokens/s. The loss must fall clearly below the corpus's unigram entropy; --ref runs the same
// training through the reference path (OT_FORCE_REF), --check-ref runs both and compares curves.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "command.h"
#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/parallel.h"
#include "train_moe_model.h"

namespace ot::cli {

namespace train_moe_local {

struct TrainOptions {
  int steps = 300, layers = 2, experts = 8, topk = 2, dim = 64, inter = 128, batch = 16, seq = 64, log_every = 25;
  float lr = 3e-3f, aux = 0.01f;
  std::string dtype = "bf16";
  std::vector<std::string> corpus{"/usr/share/games/fortunes/fortunes", "/usr/share/games/fortunes/literature",
                                  "/usr/share/games/fortunes/riddles"};
  uint64_t seed = 1;
  bool ref = false, check_ref = false;
};

std::string read_corpus(const std::vector<std::string>& files) {
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw std::runtime_error("train-moe: cannot read corpus file " + f + " (install fortunes-min: scripts/setup.sh)");
    std::stringstream ss;
    ss << in.rdbuf();
    text += ss.str();
  }
  return text;
}

struct Run {
  std::vector<double> loss_bits;  // per step
  double tokens_per_s = 0, seconds = 0;
};

Run train(const TrainOptions& o, const std::string& text, const std::vector<int32_t>& code, int64_t vocab, const char* label) {
  train::ModelConfig mc;
  mc.vocab = vocab;
  mc.dim = o.dim;
  mc.inter = o.inter;
  mc.experts = o.experts;
  mc.topk = o.topk;
  mc.layers = o.layers;
  mc.dtype = o.dtype == "fp32" ? DType::f32 : DType::bf16;
  mc.aux_coeff = o.aux;
  train::Model m;
  m.init(mc, o.seed);
  std::mt19937_64 rng(o.seed + 7);
  std::uniform_int_distribution<int64_t> pick(0, int64_t(text.size()) - o.seq - 2);
  const bool tty = isatty(fileno(stdout));
  Run r;
  auto t0 = std::chrono::steady_clock::now();
  for (int step = 1; step <= o.steps; ++step) {
    std::vector<int32_t> in(size_t(o.batch * o.seq)), tg(in.size());
    for (int64_t b = 0; b < o.batch; ++b) {
      int64_t p = pick(rng);
      for (int64_t s = 0; s < o.seq; ++s) {
        in[size_t(b * o.seq + s)] = code[uint8_t(text[size_t(p + s)])];
        tg[size_t(b * o.seq + s)] = code[uint8_t(text[size_t(p + s + 1)])];
      }
    }
    auto st = train::train_step(m, in, tg, o.batch, o.seq);
    // Linear warm-up, cosine decay to 10%.
    float warm = std::min(1.f, float(step) / 20.f);
    float lr = o.lr * warm * (0.1f + 0.9f * 0.5f * (1.f + std::cos(3.14159265f * float(step - 1) / float(o.steps))));
    train::adamw(m, lr, step);
    double bits = st.loss / std::log(2.0);
    r.loss_bits.push_back(bits);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double tps = double(step) * double(o.batch * o.seq) / secs;
    if (tty) {
      const int width = 30;
      int fill = int(width * step / o.steps);
      std::printf("\r%s [%s%s] %4d/%d  loss %.3f bits/char  aux %.4f  %8.0f tok/s", label, std::string(size_t(fill), '#').c_str(),
                  std::string(size_t(width - fill), '.').c_str(), step, o.steps, bits, st.aux, tps);
      if (step == o.steps) std::printf("\n");
      std::fflush(stdout);
    } else if (step == 1 || step % o.log_every == 0 || step == o.steps) {
      std::printf("%s step %4d/%d  loss %.4f bits/char  aux %.4f  %8.0f tok/s\n", label, step, o.steps, bits, st.aux, tps);
      std::fflush(stdout);
    }
    r.seconds = secs;
    r.tokens_per_s = tps;
  }
  return r;
}

double mean_tail(const std::vector<double>& v, size_t n) {
  n = std::min(n, v.size());
  double s = 0;
  for (size_t i = v.size() - n; i < v.size(); ++i) s += v[i];
  return n ? s / double(n) : 0;
}

int run_train(const TrainOptions& o) {
  std::string text = read_corpus(o.corpus);
  OT_CHECK(int64_t(text.size()) > o.seq + 2, "train-moe", "corpus", "more text than one sequence", text.size(), " bytes");
  // Byte vocabulary of the corpus and its unigram entropy (the baseline the model must beat).
  std::map<uint8_t, int64_t> freq;
  for (char ch : text) freq[uint8_t(ch)]++;
  std::vector<int32_t> code(256, 0);
  int64_t vocab = 0;
  double H = 0;
  for (auto [ch, n] : freq) {
    code[ch] = int32_t(vocab++);
    double p = double(n) / double(text.size());
    H -= p * std::log2(p);
  }
  std::printf("train-moe: corpus %zu bytes (%zu files), vocab %lld, unigram entropy %.3f bits/char\n", text.size(), o.corpus.size(),
              (long long)vocab, H);
  std::printf("model: %d layers, dim %d, %d experts (top-%d, inter %d), %s MoE, batch %d x %d, %d steps, AdamW lr %g, %d threads\n", o.layers, o.dim,
              o.experts, o.topk, o.inter, o.dtype.c_str(), o.batch, o.seq, o.steps, double(o.lr), num_threads());
  std::fflush(stdout);
  int rc = 0;
  auto summary = [&](const char* label, const Run& r) {
    double final_bits = mean_tail(r.loss_bits, 20);
    std::printf("%s: final loss %.3f bits/char (mean of the last 20 steps) vs unigram entropy %.3f bits/char: %s; %.1f s, %.0f tok/s\n", label,
                final_bits, H, final_bits < H - 0.5 ? "below" : "NOT clearly below", r.seconds, r.tokens_per_s);
    if (!(final_bits < H - 0.5)) rc = 1;
  };
  Run fast, ref;
  if (!o.ref || o.check_ref) {
    fast = train(o, text, code, vocab, "fast");
    summary("fast", fast);
  }
  if (o.ref || o.check_ref) {
    cpu::ScopedForceRef force(true);
    ref = train(o, text, code, vocab, "ref ");
    summary("ref ", ref);
  }
  if (o.check_ref) {
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < fast.loss_bits.size(); ++i) {
      double d = std::fabs(fast.loss_bits[i] - ref.loss_bits[i]) / ref.loss_bits[i];
      if (d > worst) { worst = d; at = i + 1; }
    }
    double tol = o.dtype == "fp32" ? 1e-3 : 3e-2;
    std::printf("check-ref: largest relative loss difference %.2e at step %zu (tolerance %.0e for %s): %s\n", worst, at, tol, o.dtype.c_str(),
                worst <= tol ? "same curve" : "DIFFERENT");
    if (worst > tol) rc = 1;
  }
  return rc;
}

RegisterCommand reg("train-moe", "Train a small byte-level MoE language model (forward + backward of moe_ffn) on a packaged text corpus",
                    [](Options& sub) -> std::function<int()> {
  auto o = std::make_shared<TrainOptions>();
  sub.value("--steps", o->steps, "Optimizer steps").show_default();
  sub.value("--layers", o->layers, "Blocks (token mixing + MoE)").show_default();
  sub.value("--experts", o->experts, "Experts per MoE layer").show_default();
  sub.value("--topk", o->topk, "Experts per token").show_default();
  sub.value("--dim", o->dim, "Model width H").show_default();
  sub.value("--inter", o->inter, "Expert intermediate size I").show_default();
  sub.value("--batch", o->batch, "Sequences per step").show_default();
  sub.value("--seq", o->seq, "Bytes per sequence").show_default();
  sub.value("--lr", o->lr, "Peak learning rate").show_default();
  sub.value("--aux", o->aux, "Aux (load-balancing) loss coefficient").show_default();
  sub.choice("--dtype", o->dtype, {"bf16", "fp32"}, "MoE compute dtype").show_default();
  sub.value("--corpus", o->corpus, "Text files (default: the fortunes-min package's files)");
  sub.value("--seed", o->seed, "Seed of weights and batches").show_default();
  sub.value("--log-every", o->log_every, "Steps between log lines when stdout is not a terminal").show_default();
  sub.flag("--ref", o->ref, "Run through the reference path (OT_FORCE_REF)");
  sub.flag("--check-ref", o->check_ref, "Run fast and reference paths and compare their loss curves");
  return [o] { return run_train(*o); };
});

}  // namespace train_moe_local

}  // namespace ot::cli
