// `ot`: the command-line tool (demo, bench, peak, ...). Commands register themselves (command.h).
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "command.h"
#include "ot/error.h"
#include "ot/version.h"

int main(int argc, char** argv) {
  CLI::App app{"ot: ops-transformer command-line tool (MoE and Gated DeltaNet operators)"};
  // The loaded library's version (ot::version()), which is the one this tool was built with.
  app.set_version_flag("--version", std::string("ot (ops-transformer) ") + ot::version());
  app.require_subcommand(1);
  int exit_code = 0;
  ot::cli::build_app(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ot::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return exit_code;
}
