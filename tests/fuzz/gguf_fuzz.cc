// libFuzzer entry point for the GGUF reader (and, on what it accepts, the
// writer). Properties checked beyond "no crash, no sanitizer report":
//  - every accessor on every key and tensor runs without error paths crashing;
//  - accepted tensors lie inside the input, aligned, and are found by name;
//  - writing an accepted file back with GgufWriter and parsing the result
//    gives the same metadata and tensors (the reader and writer agree).
// A violated property calls __builtin_trap() so the fuzzer records a crash.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "model/gguf.h"
#include "model/gguf_writer.h"

namespace {

using strata::GgufFile;
using strata::GgufTensor;
using strata::GgufValue;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// Keeps the optimizer from dropping reads.
volatile size_t g_sink = 0;
template <typename R>
void Touch(const R& r) {
  g_sink = g_sink + (r.ok() ? 1 : r.error().message().size());
}

void TouchValue(const GgufValue& v) {
  g_sink = g_sink + v.Render().size();
  g_sink = g_sink + v.AsInt().has_value() + v.AsUint().has_value() + v.AsFloat().has_value() +
           v.AsBool().has_value() + (v.AsString() != nullptr);
  if (!v.is_array()) return;
  Check(v.raw().size() == v.size() * strata::GgufFixedSize(v.elem_type()));
  if (v.size() > 0) {
    g_sink = g_sink + v.IntAt(0).has_value() + v.FloatAt(v.size() - 1).has_value();
  }
  Check(!v.IntAt(v.size()).has_value());
  for (const auto& a : v.arrays()) TouchValue(a);
}

void CheckSame(const GgufFile& a, const GgufFile& b) {
  Check(a.metadata().size() == b.metadata().size());
  for (size_t i = 0; i < a.metadata().size(); ++i) {
    Check(a.metadata()[i].key == b.metadata()[i].key);
    Check(a.metadata()[i].value == b.metadata()[i].value);
  }
  Check(a.alignment() == b.alignment());
  Check(a.tensors().size() == b.tensors().size());
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    const GgufTensor& x = a.tensors()[i];
    const GgufTensor& y = b.tensors()[i];
    Check(x.name == y.name && x.type == y.type && x.ne == y.ne && x.nbytes == y.nbytes);
    Check(std::memcmp(x.data, y.data, x.nbytes) == 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = GgufFile::Parse(data, size, "fuzz");
  if (!parsed.ok()) {
    Check(!parsed.error().message().empty());
    return 0;
  }
  const GgufFile& f = **parsed;
  Check(f.version() == 2 || f.version() == 3);
  Check(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0);
  Check(f.data_offset() % f.alignment() == 0);

  for (const auto& kv : f.metadata()) {
    Check(f.Find(kv.key) == &kv.value);
    Touch(f.GetString(kv.key));
    Touch(f.GetInt(kv.key));
    Touch(f.GetUint(kv.key));
    Touch(f.GetFloat(kv.key));
    Touch(f.GetBool(kv.key));
    Touch(f.GetStringArray(kv.key));
    Touch(f.GetFloatArray(kv.key));
    Touch(f.GetIntArray(kv.key));
    TouchValue(kv.value);
  }
  Check(f.ListKeys().size() == f.metadata().size());
  Touch(f.GetInt("no.such.key"));

  for (const GgufTensor& t : f.tensors()) {
    Check(f.FindTensor(t.name) == &t);
    Check(t.offset % f.alignment() == 0);
    Check(t.nbytes > 0 && t.data >= data && t.data + t.nbytes <= data + size);
    const strata::Tensor view = t.ToTensor();
    Check(view.nbytes == t.nbytes && view.data == t.data);
    Check(strata::RowBytes(t.type, view.cols()) * static_cast<size_t>(view.rows()) == t.nbytes);
    g_sink = g_sink + t.data[0] + t.data[t.nbytes - 1];
  }

  // Round trip through the writer. Skipped for huge alignments, whose padding
  // would cost far more memory than the input.
  if (f.alignment() > 4096) return 0;
  strata::GgufWriter w;
  for (const auto& kv : f.metadata()) w.SetValue(kv.key, kv.value);
  for (const GgufTensor& t : f.tensors()) {
    Check(w.AddTensor(t.name, t.type, t.ne, t.data, t.nbytes).ok());
  }
  auto bytes = w.WriteToString();
  Check(bytes.ok());
  auto again = GgufFile::Parse(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size(),
                               "fuzz-rewritten");
  Check(again.ok());
  CheckSame(f, **again);
  return 0;
}
