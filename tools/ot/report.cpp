// `ot report`: runs the benchmark suite's headline cases (each `ot bench <op> --case <case> --json` in
// a child process, so one crashing or missing benchmark does not stop the report), then writes a
// Markdown report with tables and PNG charts (drawn by matplotlib through tools/report_charts.py):
// GFLOP/s or GB/s per operator and shape against this machine's peaks and against the reference path.
#include <sys/wait.h>
#include <unistd.h>

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

namespace {

namespace fs = std::filesystem;

// Headline cases (issue names). An empty case runs the benchmark's default set.
struct Headline { const char* op; const char* case_name; const char* what; };
const Headline kHeadlines[] = {
    {"gemm", "", "matrix engine"},
    {"moe_ffn", "qwen3-30b-a3b-T512", "MoE layer prefill, Qwen3-30B-A3B shape"},
    {"moe_ffn", "qwen3-30b-a3b-T16", "MoE layer decode, Qwen3-30B-A3B shape"},
    {"moe_ffn", "mixtral-T512", "MoE layer prefill, Mixtral shape"},
    {"moe_gating_top_k_softmax", "", "router"},
    {"moe_init_routing_v2", "", "routing"},
    {"moe_finalize_routing", "", "finalize"},
    {"gdn_chunk_fwd", "qwen35-B1-T1024", "GDN chunked prefill, Qwen3.5 shape"},
    {"gdn_chunk_fwd", "qwen35-varlen", "GDN chunked prefill, mixed lengths"},
    {"gdn_decode", "qwen35-decode-B1", "GDN decode"},
    {"gdn_decode", "qwen35-decode-B32", "GDN decode, batch 32"},
};

struct Options {
  std::string out = "docs", cases, script;
  int threads = 0;
  bool no_charts = false, quick = false;
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

int run_report(const Options& o) {
  const int threads = o.threads > 0 ? o.threads : num_threads();
  std::vector<std::pair<std::string, std::string>> todo;  // (op, case)
  std::vector<std::string> whats;
  if (!o.cases.empty()) {
    std::stringstream ss(o.cases);
    std::string item;
    while (std::getline(ss, item, ',')) {
      auto colon = item.find(':');
      todo.emplace_back(item.substr(0, colon), colon == std::string::npos ? "" : item.substr(colon + 1));
      whats.push_back("");
    }
  } else {
    for (const auto& h : kHeadlines) {
      todo.emplace_back(h.op, h.case_name);
      whats.push_back(h.what);
    }
  }
  fs::create_directories(o.out);
  const std::string exe = self_exe();
  nlohmann::json results = nlohmann::json::array();
  std::vector<std::string> missing;
  Progress bar("ot report", int64_t(todo.size()), 0.5);
  for (size_t i = 0; i < todo.size(); ++i) {
    const auto& [op, cs] = todo[i];
    bar.set_label("ot report: " + op + (cs.empty() ? "" : " " + cs));
    std::string cmd = shell_quote(exe) + " bench " + op + " --json --threads " + std::to_string(threads);
    if (!cs.empty()) cmd += " --case " + shell_quote(cs);
    if (o.quick) cmd += " --repeats 3";
    std::string out;
    int rc = capture(cmd + " 2>/dev/null", &out);
    int n = 0;
    std::stringstream lines(out);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.empty() || line[0] != '{') continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("name")) continue;
      if (!cs.empty() && j["name"] != cs) continue;  // --case matches substrings
      j["op"] = op;
      j["what"] = whats[i];
      results.push_back(j);
      ++n;
    }
    if (n == 0) missing.push_back(op + (cs.empty() ? "" : " " + cs) + (rc != 0 ? " (exit " + std::to_string(rc) + ")" : ""));
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
  md << "Each row is `ot bench <op> --case <case> --json --threads " << threads
     << "` (medians of interleaved runs); `ref` is the reference path timed in the same run. Raw data: `report.json`.\n\n";
  for (const auto& c : charts) md << "![" << c << "](" << c << ")\n\n";
  if (!chart_note.empty()) md << "_" << chart_note << "_\n\n";
  std::string cur_op;
  for (const auto& r : results) {
    std::string op = r.value("op", "");
    if (op != cur_op) {
      cur_op = op;
      md << "\n## " << op << "\n\n| case | shape | dtype | ms | ref ms | rate | % of peak | vs ref | kernel |\n|---|---|---|---:|---:|---:|---:|---:|---|\n";
    }
    const bool bw = r.contains("gbps");
    const double rate = bw ? r.value("gbps", 0.0) : r.value("gflops", 0.0);
    md << "| " << r.value("name", "") << " | " << r.value("shape", "") << " | " << r.value("dtype", "") << " | " << fmt(r.value("ms", 0.0), 3)
       << " | " << fmt(r.value("ref_ms", 0.0), 3) << " | " << fmt(rate) << (bw ? " GB/s" : " GFLOP/s") << " | "
       << fmt(100 * r.value("peak_fraction", 0.0)) << "% | " << fmt(r.value("speedup_vs_ref", 0.0), 2) << "x | " << r.value("kernel", "")
       << " |\n";
  }
  if (!missing.empty()) {
    md << "\n## Not measured\n\nThese headline cases gave no result in this build (benchmark not registered yet, or it failed):\n\n";
    for (const auto& m : missing) md << "- `" << m << "`\n";
  }
  md << "\nExpert parallelism (`ot bench ep`) needs several ranks and is not run here: "
        "`mpirun --allow-run-as-root --oversubscribe -np 4 build/release/ot bench ep --json`.\n";
  md.close();
  std::printf("wrote %s (%zu results, %zu charts%s)\n", (fs::path(o.out) / "report.md").c_str(), results.size(), charts.size(),
              missing.empty() ? "" : (", " + std::to_string(missing.size()) + " headline cases not measured").c_str());
  if (!chart_note.empty()) std::fprintf(stderr, "%s\n", chart_note.c_str());
  return 0;
}

const RegisterCommand reg("report", [](CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("report", "Run the headline benchmarks and write a Markdown report with charts (DIR/report.md)");
  sub->add_option("--out", o->out, "Output directory (report.md, report.json, PNG charts)")->capture_default_str();
  sub->add_option("--cases", o->cases, "Comma-separated op:case list instead of the headline set (op alone: its default cases)");
  sub->add_option("--threads", o->threads, "Threads (0 = all)");
  sub->add_flag("--quick", o->quick, "Fewer repetitions");
  sub->add_flag("--no-charts", o->no_charts, "Skip the PNG charts");
  sub->add_option("--charts-script", o->script, "Path of report_charts.py");
  sub->callback([o] {
    int rc = run_report(*o);
    if (rc) throw CLI::RuntimeError(rc);
  });
});

}  // namespace
}  // namespace ot::cli
