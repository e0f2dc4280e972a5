// `ot report`: runs the benchmark suite's headline cases (each `ot bench <op> --case <case> --json` in
// a child process, so one crashing or missing benchmark does not stop the report), then writes a
// Markdown report with tables and PNG charts (drawn by matplotlib through tools/report_charts.py):
// GFLOP/s or GB/s per operator and shape against this machine's peaks and against the reference path.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_harness.h"
#include "command.h"
#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/parallel.h"
#include "progress.h"

namespace ot::cli {

namespace report_local {

namespace fs = std::filesystem;

// Headline cases (issue names), one benchmark process each. quick: the tiny stand-in `--quick`
// runs instead (nullptr: left out of --quick), so a smoke test exercises every step in seconds.
struct Headline { const char* op; const char* case_name; const char* what; const char* quick; };
const Headline kHeadlines[] = {
    {"gemm", "", "matrix engine: square, expert and decode shapes", "--m 64 --n 256 --k 256"},
    {"moe_ffn", "qwen3-30b-a3b-T512", "fused MoE layer (router, grouped SwiGLU FFN, weighted combine): Qwen3-30B-A3B prefill (T512) and decode (T16), Mixtral prefill", nullptr},
    {"moe_ffn", "qwen3-30b-a3b-T16", "MoE layer decode, Qwen3-30B-A3B shape", nullptr},
    {"moe_ffn", "mixtral-T512", "MoE layer prefill, Mixtral shape", nullptr},
    {"moe_routing", "", "routers, init routing, permute/unpermute, finalize", "--case gating-softmax-t1024-e128-k8"},
    {"moe_ffn_backward", "qwen3-30b-a3b-T512", "backward of the whole MoE layer, Qwen3-30B-A3B shape, prefill T512 (the issue's ratio case; the fp64 reference is skipped at this size)", nullptr},
    {"chunk_gated_delta_rule_fwd", "qwen35-B1-T1024", "Gated DeltaNet chunked prefill at Qwen3.5 shapes: one 1024-token sequence and a varlen batch", nullptr},
    {"chunk_gated_delta_rule_fwd", "qwen35-varlen", "GDN chunked prefill, mixed lengths", nullptr},
    {"recurrent_gated_delta_rule", "qwen35-decode-B1", "Gated DeltaNet decode from a state cache (GB/s of state traffic), batch 1 and 32", "--case qwen35-decode-B1"},
    {"recurrent_gated_delta_rule", "qwen35-decode-B32", "GDN decode, batch 32", nullptr},
    {"chunk_gated_delta_rule_bwd", "qwen35-B1-T1024", "Gated DeltaNet chunked backward, Qwen3.5 shape", nullptr},
};

struct Options {
  std::string out = "docs/report", cases, script;
  int threads = 0, ep_ranks = 4;
  bool no_charts = false, quick = false, no_ep = false;
};

std::string self_exe() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "ot" : p.string();
}

std::string shell_quote(const std::string& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

// Runs a command, returns its exit status and stdout.
int capture(const std::string& cmd, std::string* out) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// The charts script: --charts-script, else next to this source file's tools/ directory, else
// relative to the executable (build/<preset>/ot -> ../../tools).
std::string find_script(const std::string& given) {
  if (!given.empty()) return given;
  std::vector<fs::path> tries = {fs::path(__FILE__).parent_path().parent_path() / "report_charts.py",
                                 fs::path(self_exe()).parent_path().parent_path().parent_path() / "tools" / "report_charts.py",
                                 fs::path("tools") / "report_charts.py"};
  for (const auto& p : tries)
    if (fs::exists(p)) return p.string();
  return "";
}

std::string fmt(double v, int prec = 1) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

bool have_program(const std::string& name) {
  std::string out;
  return capture("command -v " + name + " >/dev/null 2>&1 && echo yes", &out) == 0 && out.find("yes") != std::string::npos;
}

struct Job {
  std::string op, case_name, what, cmd;
};

int run_report(const Options& o) {
  const int threads = o.threads > 0 ? o.threads : num_threads();
  const std::string exe = self_exe();
  const std::string bench = shell_quote(exe) + " bench ";
  const std::string common = " --json --threads " + std::to_string(threads) + (o.quick ? " --repeats 2" : "");
  std::vector<Job> todo;
  if (!o.cases.empty()) {
    std::stringstream ss(o.cases);
    std::string item;
    while (std::getline(ss, item, ',')) {
      auto colon = item.find(':');
      std::string op = item.substr(0, colon), cs = colon == std::string::npos ? "" : item.substr(colon + 1);
      todo.push_back({op, cs, "", bench + op + common + (cs.empty() ? "" : " --case " + shell_quote(cs))});
    }
  } else {
    for (const auto& h : kHeadlines) {
      if (o.quick && !h.quick) continue;
      std::string args = o.quick ? std::string(" ") + h.quick : *h.case_name ? std::string(" --case ") + shell_quote(h.case_name) : "";
      todo.push_back({h.op, o.quick ? "" : h.case_name, h.what, bench + h.op + common + args});
    }
#ifdef OT_HAVE_EP
    // Expert parallelism runs under mpirun: W ranks sharing this machine's cores.
    if (!o.no_ep && have_program("mpirun")) {
      const int W = o.quick ? 2 : o.ep_ranks;
      todo.push_back({"ep", "", "expert-parallel dispatch + combine vs a per-(token, expert) all-to-all baseline (" + std::to_string(W) + " ranks)",
                      "mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(W) + " " + bench + "ep --json --threads " +
                          std::to_string(std::max(1, threads / W)) + (o.quick ? " --case bs32 --repeats 2" : "")});
    }
#endif
  }
  fs::create_directories(o.out);
  nlohmann::json results = nlohmann::json::array();
  std::vector<std::string> missing;
  Progress bar("ot report", int64_t(todo.size()), 0.5);
  for (const Job& job : todo) {
    bar.set_label("ot report: " + job.op + (job.case_name.empty() ? "" : " " + job.case_name));
    std::string out;
    // A benchmark that hangs or crashes costs its own row only.
    int rc = capture("timeout " + std::to_string(o.quick ? 300 : 1200) + " " + job.cmd + " 2>/dev/null", &out);
    int n = 0;
    std::stringstream lines(out);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.empty() || line[0] != '{') continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("name")) continue;
      if (!job.case_name.empty() && j["name"] != job.case_name) continue;  // --case matches substrings
      j["op"] = job.op;
      j["what"] = job.what;
      results.push_back(j);
      ++n;
    }
    if (n == 0) missing.push_back(job.op + (job.case_name.empty() ? "" : " " + job.case_name) + (rc != 0 ? " (exit " + std::to_string(rc) + ")" : ""));
    bar.tick();
  }
  bar.finish();

  const double peak_f = matrix_peak_gflops("bf16", threads), peak_f32 = matrix_peak_gflops("fp32", threads),
               peak_b = memory_peak_gbps(threads);
  nlohmann::json doc = {{"threads", threads},
                        {"isa", cpu::isa_name(cpu::active_isa())},
                        {"peak_bf16_gflops", peak_f},
                        {"peak_fp32_gflops", peak_f32},
                        {"peak_gbps", peak_b},
                        {"results", results}};
  const fs::path json_path = fs::path(o.out) / "report.json";
  std::ofstream(json_path) << doc.dump(2) << "\n";

  // Charts.
  std::vector<std::string> charts;
  std::string chart_note;
  if (!o.no_charts && !results.empty()) {
    std::string script = find_script(o.script);
    if (script.empty()) {
      chart_note = "charts skipped: tools/report_charts.py not found (pass --charts-script)";
    } else {
      std::string out;
      int rc = capture("/usr/bin/python3 " + shell_quote(script) + " " + shell_quote(json_path.string()) + " " + shell_quote(o.out) + " 2>&1", &out);
      std::stringstream ls(out);
      std::string line;
      while (std::getline(ls, line))
        if (line.rfind("wrote ", 0) == 0) charts.push_back(fs::path(line.substr(6)).filename().string());
      if (rc != 0) chart_note = "charts failed: " + out;
    }
  }

  // Markdown.
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::ofstream md(fs::path(o.out) / "report.md");
  md << "# ops-transformer benchmark report\n\n";
  md << "Generated by `ot report` on " << date << ": " << threads << " threads, ISA " << cpu::isa_name(cpu::active_isa())
     << ". Machine peaks (`ot peak`): bf16 matrix " << fmt(peak_f, 0) << " GFLOP/s, fp32 " << fmt(peak_f32, 0) << " GFLOP/s, memory "
     << fmt(peak_b) << " GB/s.\n\n";
  md << "Each row is one case of `ot bench <op> --case <case> --json --threads " << threads
     << "` (medians of interleaved runs); `ref ms` is the reference path timed in the same run, `vs ref` the speed-up over it, "
        "`% of peak` the rate against the peak that bounds the case (matrix GFLOP/s or memory GB/s; `ot peak`'s cached best), "
        "`% of window` a GB/s rate against the read bandwidth measured beside that case (`window_peak_gbps`: `ot peak`'s read test "
        "before, halfway through and after its timed runs, the best of the three; the memory speed of this machine changes over time), "
        "`% of window median` the same rate against the median of every burst of those read tests (`window_median_gbps`: the same "
        "statistic as the case's own median over calls). Raw data: `report.json`."
     << (o.quick ? " **Quick mode** (`--quick`): tiny stand-in cases and 2 repetitions, for checking the tool, not for figures." : "")
     << "\n\n";
  for (const auto& c : charts) md << "![" << c << "](" << c << ")\n\n";
  if (!chart_note.empty()) md << "_" << chart_note << "_\n\n";
  std::string cur_op;
  for (const auto& r : results) {
    std::string op = r.value("op", "");
    if (op == "ep") continue;  // its own table below
    if (op != cur_op) {
      cur_op = op;
      md << "\n## " << op << "\n\n";
      if (!r.value("what", std::string()).empty()) md << r.value("what", std::string()) << ".\n\n";
      md << "| case | shape | dtype | ms | ref ms | rate | % of peak | % of window | % of window median | vs ref | kernel |\n"
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n";
    }
    const bool bw = r.contains("gbps");
    const double rate = bw ? r.value("gbps", 0.0) : r.value("gflops", 0.0);
    md << "| " << r.value("name", "") << " | " << r.value("shape", "") << " | " << r.value("dtype", "") << " | " << fmt(r.value("ms", 0.0), 3)
       << " | " << fmt(r.value("ref_ms", 0.0), 3) << " | " << fmt(rate) << (bw ? " GB/s" : " GFLOP/s") << " | "
       << fmt(100 * r.value("peak_fraction", 0.0)) << "% | "
       << (r.contains("window_peak_fraction") ? fmt(100 * r.value("window_peak_fraction", 0.0)) + "%" : std::string("-")) << " | "
       << (r.contains("window_median_fraction") ? fmt(100 * r.value("window_median_fraction", 0.0)) + "%" : std::string("-")) << " | "
       << fmt(r.value("speedup_vs_ref", 0.0), 2) << "x | " << r.value("kernel", "")
       << " |\n";
  }
  // Expert parallelism: time and bytes against the baseline of the same run (no FLOPs to rate).
  bool ep_header = false;
  for (const auto& r : results) {
    if (r.value("op", "") != "ep") continue;
    if (!ep_header) {
      md << "\n## ep\n\n" << r.value("what", std::string())
         << ": dispatch + combine under mpirun (expert compute excluded), slowest rank. Ranks share this machine's cores, so the "
            "figures include oversubscription.\n\n| case | ranks | ms | baseline ms | % of baseline | bytes sent | baseline bytes | "
            "dedup bound | kernel |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n";
      ep_header = true;
    }
    const double ms = r.value("ms", 0.0), base = r.value("baseline_ms", 0.0);
    md << "| " << r.value("name", "") << " | " << r.value("ranks", 0) << " | " << fmt(ms, 2) << " | " << fmt(base, 2) << " | "
       << (base > 0 ? fmt(100 * ms / base, 0) + "%" : "-") << " | " << fmt(r.value("bytes_sent", 0.0) / 1e6, 2) << " MB | "
       << fmt(r.value("baseline_bytes_sent", 0.0) / 1e6, 2) << " MB | " << fmt(r.value("dedup_bound_bytes", 0.0) / 1e6, 2) << " MB | "
       << r.value("kernel", "") << " |\n";
  }
  if (!missing.empty()) {
    md << "\n## Not measured\n\nThese headline cases gave no result in this build (benchmark not built, or it failed):\n\n";
    for (const auto& m : missing) md << "- `" << m << "`\n";
  }
  md.close();
  std::printf("wrote %s (%zu results, %zu charts%s)\n", (fs::path(o.out) / "report.md").c_str(), results.size(), charts.size(),
              missing.empty() ? "" : (", " + std::to_string(missing.size()) + " headline cases not measured").c_str());
  if (!chart_note.empty()) std::fprintf(stderr, "%s\n", chart_note.c_str());
  return 0;
}

const RegisterCommand reg("report", "Run the headline benchmarks and write a Markdown report with charts (DIR/report.md)", [](cli::Options& sub) -> Run {
  auto o = std::make_shared<Options>();
  sub.value("--out", o->out, "Output directory (report.md, report.json, PNG charts)").show_default();
  sub.value("--cases", o->cases, "Comma-separated op:case list instead of the headline set (op alone: its default cases)");
  sub.value("--threads", o->threads, "Threads (0 = all)");
  sub.flag("--quick", o->quick, "Tiny stand-in cases, 2 repetitions (checks the tool in seconds; not for figures)");
  sub.value("--ep-ranks", o->ep_ranks, "MPI ranks of the expert-parallel benchmark").show_default();
  sub.flag("--no-ep", o->no_ep, "Skip the expert-parallel benchmark (mpirun)");
  sub.flag("--no-charts", o->no_charts, "Skip the PNG charts");
  sub.value("--charts-script", o->script, "Path of report_charts.py");
  return [o] { return run_report(*o); };
});

}  // namespace report_local
}  // namespace ot::cli
