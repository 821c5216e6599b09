#pragma once
// Where tests find shared data; set by ctest (tests/CMakeLists.txt).

#include <string>

namespace strata::testing {

// $STRATA_SHARED_DIR, else the shared/ folder found at configure time.
std::string SharedDir();
// $STRATA_SOURCE_DIR, else the source tree this build was configured from.
std::string SourceDir();
// $STRATA_REFERENCE_DIR, else tests/reference (npm reference packages).
std::string ReferenceDir();
// The real stories260K model in shared/models.
std::string Stories260KPath();
// A fresh empty directory under $TMPDIR, removed at process exit.
std::string MakeTempDir(const std::string& prefix);
// The same on a filesystem that takes O_DIRECT (the disk tier's): the
// first of $TMPDIR, /var/tmp, /tmp and the working directory that does;
// "" when none does.
std::string MakeDirectIoTempDir(const std::string& prefix);

}  // namespace strata::testing
