// The run-time side of ot/version.h: what the loaded library was built as.
#include "ot/version.h"

namespace ot {
const char* version() { return OT_VERSION_STRING; }
}  // namespace ot
