#include "ot/error.h"

namespace ot {

static std::string format(const std::string& op, const std::string& arg, const std::string& expected, const std::string& got) {
  std::string m = op + ": argument '" + arg + "': expected " + expected;
  if (!got.empty()) m += ", got " + got;
  return m;
}

Error::Error(std::string op, std::string arg, std::string expected, std::string got)
    : std::runtime_error(format(op, arg, expected, got)), op_(std::move(op)), arg_(std::move(arg)), expected_(std::move(expected)), got_(std::move(got)) {}

}  // namespace ot
