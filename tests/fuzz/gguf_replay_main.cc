// Runs inputs through LLVMFuzzerTestOneInput without libFuzzer, so the
// committed corpus is replayed by every build (ctest gguf_fuzz_corpus_replay)
// and a crash found by the fuzzer can be debugged with g++ and gdb.
//
//   gguf_fuzz_replay DIR_OR_FILE...     replay every regular file (non-recursive)
//   gguf_fuzz_replay --write-seeds DIR [MODEL.gguf]
//                                       write valid GGUF seed files made by
//                                       GgufWriter (plus one carrying MODEL's
//                                       metadata) for scripts/fuzz-gguf.sh
//
// Exits 1 when an argument names nothing readable or no input was found.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;
using strata::DType;
using strata::GgufValue;
using strata::GgufWriter;
using strata::Status;

bool RunFile(const fs::path& path) {
  auto bytes = strata::ReadFileToString(path.string());
  if (!bytes.ok()) {
    std::fprintf(stderr, "%s\n", bytes.error().ToString().c_str());
    return false;
  }
  // An exact-size heap copy, so AddressSanitizer catches reads past the end.
  std::unique_ptr<uint8_t[]> copy(new uint8_t[bytes->size() + 1]);
  std::memcpy(copy.get(), bytes->data(), bytes->size());
  LLVMFuzzerTestOneInput(copy.get(), bytes->size());
  return true;
}

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 7 + i);
  return v;
}

Status WriteSeeds(const std::string& dir, const char* model) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::vector<float> f32s = {0.5f, -1.0f};
  const std::vector<int32_t> i32s = {1, -2, 3};
  const std::vector<uint8_t> u8s = {0, 255};
  const std::vector<double> f64s = {1e300};
  const std::vector<int64_t> i64s = {-5};

  GgufWriter values;  // one key of every value type, no tensors
  values.SetU8("u8", 1);
  values.SetI8("i8", -1);
  values.SetU16("u16", 2);
  values.SetI16("i16", -2);
  values.SetU32("u32", 3);
  values.SetI32("i32", -3);
  values.SetU64("u64", 4);
  values.SetI64("i64", -4);
  values.SetF32("f32", 0.5f);
  values.SetF64("f64", 0.25);
  values.SetBool("bool", true);
  values.SetString("string", "llama");
  values.SetStringArray("strings", {"a", "bc", ""});
  values.SetF32Array("f32s", f32s);
  values.SetI32Array("i32s", i32s);
  values.SetI64Array("i64s", i64s);
  values.SetValue("u8s", GgufValue::NumericArray<uint8_t>(u8s));
  values.SetValue("f64s", GgufValue::NumericArray<double>(f64s));
  values.SetValue("bools", GgufValue::BoolArray({true, false}));
  values.SetValue("nested", GgufValue::ArrayOfArrays({GgufValue::StringArray({"x"}),
                                                      GgufValue::NumericArray<int32_t>(i32s)}));
  STRATA_RETURN_IF_ERROR(values.Write(dir + "/values.gguf"));

  // One tensor of each supported type.
  GgufWriter tensors;
  tensors.SetString("general.architecture", "llama");
  std::vector<std::vector<uint8_t>> bufs;
  struct T {
    const char* name;
    DType type;
    std::vector<int64_t> ne;
  };
  const T kTensors[] = {{"f32", DType::kF32, {4, 2}},      {"f16", DType::kF16, {3}},
                        {"bf16", DType::kBF16, {2, 1, 2}}, {"q4_0", DType::kQ4_0, {32}},
                        {"q8_0", DType::kQ8_0, {64}},      {"q4_k", DType::kQ4_K, {256}},
                        {"q5_k", DType::kQ5_K, {256}},     {"q6_k", DType::kQ6_K, {256, 1, 1, 1}}};
  for (const T& t : kTensors) {
    int64_t n = 1;
    for (int64_t d : t.ne) n *= d;
    const auto& info = strata::GetDTypeInfo(t.type);
    bufs.push_back(Bytes(static_cast<size_t>(n / info.block_elems * info.block_bytes), 1));
    STRATA_RETURN_IF_ERROR(
        tensors.AddTensor(t.name, t.type, t.ne, bufs.back().data(), bufs.back().size()));
  }
  STRATA_RETURN_IF_ERROR(tensors.Write(dir + "/tensors.gguf"));
  tensors.SetU32("general.alignment", 64);
  STRATA_RETURN_IF_ERROR(tensors.Write(dir + "/tensors_align64.gguf"));

  if (model != nullptr) {  // real metadata (tokenizer arrays) with tiny tensors
    STRATA_ASSIGN_OR_RETURN(auto f, strata::GgufFile::Open(model));
    GgufWriter real;
    for (const auto& kv : f->metadata()) real.SetValue(kv.key, kv.value);
    const auto w = Bytes(64 * 4, 3);
    STRATA_RETURN_IF_ERROR(
        real.AddTensor("token_embd.weight", DType::kF32, {64}, w.data(), w.size()));
    STRATA_RETURN_IF_ERROR(
        real.AddTensor("output_norm.weight", DType::kF32, {64}, w.data(), w.size()));
    STRATA_RETURN_IF_ERROR(real.Write(dir + "/model_metadata.gguf"));
  }
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--write-seeds") == 0) {
    Status st = WriteSeeds(argv[2], argc >= 4 ? argv[3] : nullptr);
    if (!st.ok()) std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return st.ok() ? 0 : 1;
  }
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR_OR_FILE... | --write-seeds DIR [MODEL.gguf]\n", argv[0]);
    return 1;
  }
  size_t inputs = 0;
  for (int i = 1; i < argc; ++i) {
    std::error_code ec;
    std::vector<fs::path> files;
    if (fs::is_directory(argv[i], ec)) {
      for (const auto& e : fs::directory_iterator(argv[i], ec)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(argv[i]);
    }
    for (const auto& p : files) {
      if (!RunFile(p)) return 1;
      ++inputs;
    }
  }
  std::printf("replayed %zu inputs\n", inputs);
  return inputs > 0 ? 0 : 1;
}
