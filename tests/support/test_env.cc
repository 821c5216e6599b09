#include "tests/support/test_env.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

namespace strata::testing {

std::string SharedDir() {
  if (const char* e = std::getenv("STRATA_SHARED_DIR"); e != nullptr && *e != '\0') return e;
  return STRATA_DEFAULT_SHARED_DIR;
}

std::string SourceDir() {
  if (const char* e = std::getenv("STRATA_SOURCE_DIR"); e != nullptr && *e != '\0') return e;
  return STRATA_DEFAULT_SOURCE_DIR;
}

std::string ReferenceDir() {
  if (const char* e = std::getenv("STRATA_REFERENCE_DIR"); e != nullptr && *e != '\0') return e;
  return STRATA_DEFAULT_REFERENCE_DIR;
}

std::string Stories260KPath() { return SharedDir() + "/models/stories260K.gguf"; }

namespace {
std::mutex g_mu;
std::vector<std::string>* g_dirs = nullptr;
void RemoveDirs() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_dirs == nullptr) return;
  for (const auto& d : *g_dirs) {
    std::error_code ec;
    std::filesystem::remove_all(d, ec);
  }
}
}  // namespace

std::string MakeTempDir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/" + prefix + "XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) std::abort();
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_dirs == nullptr) {
    g_dirs = new std::vector<std::string>();
    std::atexit(RemoveDirs);
  }
  g_dirs->push_back(buf.data());
  return buf.data();
}

std::string MakeDirectIoTempDir(const std::string& prefix) {
  std::vector<std::string> bases;
  if (const char* tmp = std::getenv("TMPDIR"); tmp != nullptr && *tmp) bases.emplace_back(tmp);
  for (const char* b : {"/var/tmp", "/tmp", "."}) bases.emplace_back(b);
  for (const std::string& base : bases) {
    std::vector<char> buf;
    for (char c : base + "/" + prefix + "XXXXXX") buf.push_back(c);
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) continue;
    const std::string dir = buf.data();
    const std::string probe = dir + "/probe";
    const int fd = open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0644);
    if (fd < 0) {
      rmdir(dir.c_str());
      continue;
    }
    close(fd);
    unlink(probe.c_str());
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_dirs == nullptr) {
      g_dirs = new std::vector<std::string>();
      std::atexit(RemoveDirs);
    }
    g_dirs->push_back(dir);
    return dir;
  }
  return "";
}

}  // namespace strata::testing
