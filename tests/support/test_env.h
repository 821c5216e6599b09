#pragma once
// Where tests find shared data; set by ctest (tests/CMakeLists.txt).

#include <string>

namespace strata::testing {

// $STRATA_SHARED_DIR, or ../shared next to the source tree.
std::string SharedDir();
// The real stories260K model in shared/models.
std::string Stories260KPath();
// A fresh empty directory under $TMPDIR, removed at process exit.
std::string MakeTempDir(const std::string& prefix);

}  // namespace strata::testing
