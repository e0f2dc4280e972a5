// ot::Error: every bad argument is reported as one, naming the operator, the argument and the
// expected form, before anything the caller owns is written.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace ot {

class Error : public std::runtime_error {
 public:
  Error(std::string op, std::string arg, std::string expected, std::string got = "");
  const std::string& op() const { return op_; }
  const std::string& arg() const { return arg_; }
  const std::string& expected() const { return expected_; }
  const std::string& got() const { return got_; }  // empty when the check streamed nothing

 private:
  std::string op_, arg_, expected_, got_;
};

namespace detail {
inline void stream_all(std::ostringstream&) {}
template <class T, class... R> void stream_all(std::ostringstream& s, const T& v, const R&... r) {
  s << v;
  stream_all(s, r...);
}
template <class... A> std::string cat(const A&... a) {
  std::ostringstream s;
  stream_all(s, a...);
  return s.str();
}
}  // namespace detail

}  // namespace ot

// OT_CHECK(cond, "op", "arg", "expected form", got...): throws ot::Error when cond is false.
// The trailing arguments are streamed into the "got" part of the message.
#define OT_CHECK(cond, op, arg, expected, ...)                                          \
  do {                                                                                  \
    if (!(cond)) throw ::ot::Error((op), (arg), (expected), ::ot::detail::cat(__VA_ARGS__)); \
  } while (0)
