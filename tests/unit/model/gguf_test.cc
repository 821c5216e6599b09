#include "model/gguf.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "model/gguf_writer.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string SharedDir() {
  const char* d = std::getenv("STRATA_SHARED_DIR");
  return d != nullptr ? d : "/work/shared";
}

class GgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "gguf_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

Result<std::unique_ptr<GgufFile>> ParseString(const std::string& bytes) {
  return GgufFile::Parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mem");
}

// Expects parsing to fail with `code` and a message containing `substr`.
void ExpectParseError(const std::string& bytes, StatusCode code, const std::string& substr) {
  auto r = ParseString(bytes);
  ASSERT_FALSE(r.ok()) << "parsed, expected error containing '" << substr << "'";
  EXPECT_EQ(r.error().code(), code) << r.error().ToString();
  EXPECT_NE(r.error().message().find(substr), std::string::npos) << r.error().ToString();
  EXPECT_EQ(r.error().message().rfind("mem: ", 0), 0u) << "origin missing: " << r.error().message();
}

// Builds GGUF bytes by hand, so tests can write what GgufWriter refuses to.
class RawGguf {
 public:
  RawGguf& U32(uint32_t v) { return Put(&v, 4); }
  RawGguf& U64(uint64_t v) { return Put(&v, 8); }
  RawGguf& Str(const std::string& s) {
    U64(s.size());
    b_ += s;
    return *this;
  }
  RawGguf& Bytes(const std::string& s) {
    b_ += s;
    return *this;
  }
  RawGguf& Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return Bytes("GGUF").U32(version).U64(n_tensors).U64(n_kv);
  }
  RawGguf& KvU32(const std::string& key, uint32_t v) { return Str(key).U32(4).U32(v); }
  RawGguf& Tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
                  uint64_t offset) {
    Str(name).U32(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) U64(d);
    return U32(type).U64(offset);
  }
  RawGguf& Align(size_t a = 32) {
    b_.resize((b_.size() + a - 1) / a * a, '\0');
    return *this;
  }
  RawGguf& Zeros(size_t n) {
    b_.append(n, '\0');
    return *this;
  }
  const std::string& str() const { return b_; }

 private:
  RawGguf& Put(const void* p, size_t n) {
    b_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string b_;
};

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 31);
  return v;
}

// ------------------------------------------------------------ round trips

TEST_F(GgufTest, RoundTripsEveryValueType) {
  GgufWriter w;
  w.SetU8("t.u8", 255);
  w.SetI8("t.i8", -128);
  w.SetU16("t.u16", 65535);
  w.SetI16("t.i16", -32768);
  w.SetU32("t.u32", 4000000000u);
  w.SetI32("t.i32", -2000000000);
  w.SetU64("t.u64", std::numeric_limits<uint64_t>::max());
  w.SetI64("t.i64", std::numeric_limits<int64_t>::min());
  w.SetF32("t.f32", 1e-5f);
  w.SetF64("t.f64", -2.5e300);
  w.SetBool("t.bool", true);
  w.SetString("t.string", std::string("héllo\0world", 12));
  w.SetString("t.empty", "");
  w.SetStringArray("t.strings", {"a", "", "<0x0A>", "▁the"});
  const std::vector<float> f32s = {0.5f, -1.0f, 3.25f};
  w.SetF32Array("t.f32s", f32s);
  const std::vector<int32_t> i32s = {-1, 0, 7};
  w.SetI32Array("t.i32s", i32s);
  const std::vector<uint32_t> u32s = {1, 4000000000u};
  w.SetU32Array("t.u32s", u32s);
  const std::vector<int64_t> i64s = {std::numeric_limits<int64_t>::min(), 5};
  w.SetI64Array("t.i64s", i64s);
  const std::vector<uint8_t> u8s = {1, 2, 255};
  w.SetValue("t.u8s", GgufValue::NumericArray<uint8_t>(u8s));
  const std::vector<int16_t> i16s = {-300, 300};
  w.SetValue("t.i16s", GgufValue::NumericArray<int16_t>(i16s));
  const std::vector<double> f64s = {1.0 / 3.0};
  w.SetValue("t.f64s", GgufValue::NumericArray<double>(f64s));
  w.SetValue("t.bools", GgufValue::BoolArray({true, false, true}));
  w.SetStringArray("t.no_strings", {});
  // Nested arrays, with different element types per sub-array, 3 levels deep.
  GgufValue inner = GgufValue::ArrayOfArrays(
      {GgufValue::StringArray({"x"}), GgufValue::NumericArray<float>(f32s)});
  w.SetValue("t.nested", GgufValue::ArrayOfArrays({inner, GgufValue::NumericArray<int32_t>(i32s)}));

  const std::string path = Path("values.gguf");
  ASSERT_TRUE(w.Write(path).ok());
  auto r = GgufFile::Open(path);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  const GgufFile& f = **r;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_TRUE(f.tensors().empty());

  EXPECT_EQ(*f.GetInt("t.u8"), 255);
  EXPECT_EQ(*f.GetInt("t.i8"), -128);
  EXPECT_EQ(*f.GetInt("t.u16"), 65535);
  EXPECT_EQ(*f.GetInt("t.i16"), -32768);
  EXPECT_EQ(*f.GetUint("t.u32"), 4000000000u);
  EXPECT_EQ(*f.GetInt("t.i32"), -2000000000);
  EXPECT_EQ(*f.GetUint("t.u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*f.GetInt("t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*f.GetFloat("t.f32"), static_cast<double>(1e-5f));
  EXPECT_EQ(*f.GetFloat("t.f64"), -2.5e300);
  EXPECT_TRUE(*f.GetBool("t.bool"));
  EXPECT_EQ(*f.GetString("t.string"), std::string("héllo\0world", 12));
  EXPECT_EQ(*f.GetString("t.empty"), "");
  auto strings = f.GetStringArray("t.strings");
  ASSERT_TRUE(strings.ok());
  EXPECT_EQ(**strings, (std::vector<std::string>{"a", "", "<0x0A>", "▁the"}));
  EXPECT_EQ(*f.GetFloatArray("t.f32s"), f32s);
  EXPECT_EQ(*f.GetIntArray("t.i32s"), (std::vector<int64_t>{-1, 0, 7}));
  EXPECT_EQ(*f.GetIntArray("t.u32s"), (std::vector<int64_t>{1, 4000000000}));
  EXPECT_EQ(*f.GetIntArray("t.i64s"), i64s);
  EXPECT_EQ(*f.GetIntArray("t.u8s"), (std::vector<int64_t>{1, 2, 255}));
  EXPECT_EQ(*f.GetIntArray("t.i16s"), (std::vector<int64_t>{-300, 300}));
  EXPECT_EQ(*f.GetFloatArray("t.f64s"), (std::vector<float>{static_cast<float>(1.0 / 3.0)}));
  EXPECT_EQ(f.Find("t.f64s")->FloatAt(0), 1.0 / 3.0);
  EXPECT_EQ((**f.GetStringArray("t.no_strings")).size(), 0u);
  const GgufValue* bools = f.Find("t.bools");
  ASSERT_NE(bools, nullptr);
  EXPECT_EQ(bools->elem_type(), GgufType::kBool);
  EXPECT_EQ(std::vector<uint8_t>(bools->raw().begin(), bools->raw().end()),
            (std::vector<uint8_t>{1, 0, 1}));
  const GgufValue* nested = f.Find("t.nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->arrays().size(), 2u);
  EXPECT_EQ(nested->arrays()[0].arrays()[0].strings(), std::vector<std::string>{"x"});
  EXPECT_EQ(nested->arrays()[0].arrays()[1].FloatAt(2), 3.25);
  EXPECT_EQ(nested->arrays()[1].IntAt(0), -1);

  // Every value survives unchanged, in insertion order.
  std::vector<std::string> keys;
  for (const auto& kv : f.metadata()) keys.push_back(kv.key);
  ASSERT_EQ(keys.size(), 24u);
  EXPECT_EQ(keys.front(), "t.u8");
  EXPECT_EQ(keys[11], "t.string");
  EXPECT_EQ(keys.back(), "t.nested");
  auto bytes = w.WriteToString();
  ASSERT_TRUE(bytes.ok());
  auto file_bytes = ReadFileToString(path);
  ASSERT_TRUE(file_bytes.ok());
  EXPECT_EQ(*bytes, *file_bytes);
  // Re-encoding what was read gives the same file.
  GgufWriter w2;
  for (const auto& kv : f.metadata()) w2.SetValue(kv.key, kv.value);
  EXPECT_EQ(*w2.WriteToString(), *file_bytes);
}

TEST_F(GgufTest, GettersReportTypeAndRangeErrors) {
  GgufWriter w;
  w.SetU32("a.u32", 7);
  w.SetU64("a.big", std::numeric_limits<uint64_t>::max());
  w.SetI32("a.neg", -3);
  w.SetF32("a.f32", 0.25f);
  w.SetString("a.str", "llama");
  w.SetStringArray("a.strs", {"x", "y", "z"});
  const std::vector<uint64_t> u64s = {1, std::numeric_limits<uint64_t>::max()};
  w.SetValue("a.u64s", GgufValue::NumericArray<uint64_t>(u64s));
  auto bytes = w.WriteToString();
  ASSERT_TRUE(bytes.ok());
  auto r = ParseString(*bytes);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  const GgufFile& f = **r;

  EXPECT_TRUE(f.Has("a.u32"));
  EXPECT_FALSE(f.Has("a.missing"));
  EXPECT_EQ(f.Find("a.missing"), nullptr);
  auto missing = f.GetInt("a.missing");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.error().message().find("'a.missing'"), std::string::npos);

  auto s = f.GetString("a.u32");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.error().message(), "mem: key 'a.u32' is u32, expected string");
  EXPECT_EQ(f.GetInt("a.str").error().message(), "mem: key 'a.str' is string, expected an integer");
  EXPECT_EQ(f.GetFloat("a.u32").error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetBool("a.u32").error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetStringArray("a.str").error().message(),
            "mem: key 'a.str' is string, expected array of string");
  EXPECT_EQ(f.GetFloatArray("a.strs").error().message(),
            "mem: key 'a.strs' is array of string, expected array of f32 or f64");
  EXPECT_EQ(f.GetIntArray("a.strs").error().code(), StatusCode::kInvalidArgument);

  EXPECT_EQ(f.GetInt("a.big").error().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(*f.GetUint("a.big"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*f.GetInt("a.neg"), -3);
  auto neg = f.GetUint("a.neg");
  ASSERT_FALSE(neg.ok());
  EXPECT_EQ(neg.error().code(), StatusCode::kOutOfRange);
  EXPECT_NE(neg.error().message().find("'a.neg'"), std::string::npos);
  EXPECT_EQ(*f.GetFloat("a.f32"), 0.25);
  auto big_elem = f.GetIntArray("a.u64s");
  ASSERT_FALSE(big_elem.ok());
  EXPECT_EQ(big_elem.error().code(), StatusCode::kOutOfRange);
  EXPECT_NE(big_elem.error().message().find("element 1"), std::string::npos);
}

TEST_F(GgufTest, ListsKeysWithShortRenderings) {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetU32("llama.block_count", 5);
  w.SetF32("eps", 1e-5f);
  w.SetBool("flag", false);
  w.SetI32("neg", -7);
  w.SetString("long", std::string(100, 'a') + "\n");
  w.SetString("ctrl", "a\"b\x01");
  w.SetStringArray("tokens", std::vector<std::string>(512, "t"));
  auto bytes = w.WriteToString();
  ASSERT_TRUE(bytes.ok());
  auto r = ParseString(*bytes);
  ASSERT_TRUE(r.ok());
  auto keys = (*r)->ListKeys();
  ASSERT_EQ(keys.size(), 8u);
  EXPECT_EQ(keys[0].key, "general.architecture");
  EXPECT_EQ(keys[0].type, "string");
  EXPECT_EQ(keys[0].rendered, "\"llama\"");
  EXPECT_EQ(keys[1].type, "u32");
  EXPECT_EQ(keys[1].rendered, "5");
  EXPECT_EQ(keys[2].rendered, "1e-05");
  EXPECT_EQ(keys[3].rendered, "false");
  EXPECT_EQ(keys[4].rendered, "-7");
  EXPECT_EQ(keys[5].rendered, "\"" + std::string(64, 'a') + "\"...");
  EXPECT_EQ(keys[6].rendered, "\"a\\\"b\\x01\"");
  EXPECT_EQ(keys[7].type, "array[string]");
  EXPECT_EQ(keys[7].rendered, "[string x 512]");
}

TEST_F(GgufTest, RoundTripsTensorsOfSeveralTypesAndShapes) {
  struct Case {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    size_t nbytes;
  };
  const std::vector<Case> cases = {
      {"w.f32", DType::kF32, {4, 3}, 48},
      {"w.f16", DType::kF16, {7}, 14},  // 14 bytes: the next tensor must be re-aligned
      {"w.q8_0", DType::kQ8_0, {64, 2}, 2 * 2 * 34},
      {"w.q4_k", DType::kQ4_K, {256, 3}, 3 * 144},
      {"w.bf16.4d", DType::kBF16, {2, 3, 4, 5}, 2 * 120},
      {"w.q6_k", DType::kQ6_K, {512}, 2 * 210},
  };
  std::vector<std::vector<uint8_t>> data;
  GgufWriter w;
  w.SetString("general.architecture", "test");
  for (size_t i = 0; i < cases.size(); ++i) {
    data.push_back(Pattern(cases[i].nbytes, static_cast<uint8_t>(i)));
    ASSERT_TRUE(
        w.AddTensor(cases[i].name, cases[i].type, cases[i].ne, data[i].data(), data[i].size())
            .ok());
  }
  // Owned and produced tensors stream the same way.
  ASSERT_TRUE(w.AddTensorOwned("w.owned", DType::kF32, {3}, Pattern(12, 9)).ok());
  const std::vector<uint8_t> produced = Pattern(4096, 3);
  ASSERT_TRUE(w.AddTensorProduced("w.produced", DType::kF32, {32, 32},
                                  [&](const GgufWriter::Sink& sink) -> Status {
                                    for (size_t off = 0; off < produced.size(); off += 1000) {
                                      const size_t n =
                                          std::min<size_t>(1000, produced.size() - off);
                                      STRATA_RETURN_IF_ERROR(sink(produced.data() + off, n));
                                    }
                                    return Status::Ok();
                                  })
                  .ok());
  EXPECT_EQ(w.tensor_count(), cases.size() + 2);

  const std::string path = Path("tensors.gguf");
  ASSERT_TRUE(w.Write(path).ok());
  auto r = GgufFile::Open(path);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  const GgufFile& f = **r;
  EXPECT_EQ(f.data_offset() % 32, 0u);
  ASSERT_EQ(f.tensors().size(), cases.size() + 2);
  for (size_t i = 0; i < cases.size(); ++i) {
    const GgufTensor& t = f.tensors()[i];
    SCOPED_TRACE(cases[i].name);
    EXPECT_EQ(t.name, cases[i].name);
    EXPECT_EQ(t.type, cases[i].type);
    EXPECT_EQ(t.ne, cases[i].ne);
    EXPECT_EQ(t.nbytes, cases[i].nbytes);
    EXPECT_EQ(t.offset % 32, 0u);
    EXPECT_EQ(t.data, f.bytes() + f.data_offset() + t.offset);
    EXPECT_EQ(std::memcmp(t.data, data[i].data(), t.nbytes), 0);
    EXPECT_EQ(f.FindTensor(cases[i].name), &t);
    Tensor view = t.ToTensor();
    EXPECT_EQ(view.name, t.name);
    EXPECT_EQ(view.type, t.type);
    EXPECT_EQ(view.ne, t.ne);
    EXPECT_EQ(view.data, t.data);
    EXPECT_EQ(view.nbytes, t.nbytes);
  }
  EXPECT_EQ(f.tensors()[1].offset, 64u);  // f32 {4,3} is 48 bytes, padded to 64
  const GgufTensor* owned = f.FindTensor("w.owned");
  ASSERT_NE(owned, nullptr);
  EXPECT_EQ(std::vector<uint8_t>(owned->data, owned->data + 12), Pattern(12, 9));
  const GgufTensor* prod = f.FindTensor("w.produced");
  ASSERT_NE(prod, nullptr);
  EXPECT_EQ(std::vector<uint8_t>(prod->data, prod->data + prod->nbytes), produced);
  EXPECT_EQ(f.FindTensor("w.absent"), nullptr);
}

TEST_F(GgufTest, HonoursACustomAlignment) {
  GgufWriter w;
  w.SetU32("general.alignment", 64);
  const std::vector<uint8_t> a = Pattern(8, 1), b = Pattern(8, 2);
  ASSERT_TRUE(w.AddTensor("a", DType::kF32, {2}, a.data(), a.size()).ok());
  ASSERT_TRUE(w.AddTensor("b", DType::kF32, {2}, b.data(), b.size()).ok());
  auto bytes = w.WriteToString();
  ASSERT_TRUE(bytes.ok());
  auto r = ParseString(*bytes);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ((*r)->alignment(), 64u);
  EXPECT_EQ((*r)->data_offset() % 64, 0u);
  EXPECT_EQ((*r)->tensors()[1].offset, 64u);
  EXPECT_EQ(std::memcmp((*r)->tensors()[1].data, b.data(), 8), 0);

  w.SetU32("general.alignment", 48);
  EXPECT_EQ(w.WriteToString().error().code(), StatusCode::kInvalidArgument);
}

TEST_F(GgufTest, WriterRejectsBadTensorsAndKeepsKeyPositions) {
  GgufWriter w;
  const std::vector<uint8_t> buf(1024);
  ASSERT_TRUE(w.AddTensor("t", DType::kF32, {4}, buf.data(), 16).ok());
  EXPECT_NE(w.AddTensor("t", DType::kF32, {4}, buf.data(), 16).message().find("duplicate"),
            std::string::npos);
  EXPECT_NE(w.AddTensor("u", DType::kF32, {4}, buf.data(), 12).message().find("need 16"),
            std::string::npos);
  EXPECT_NE(w.AddTensor("u", DType::kQ8_0, {33}, buf.data(), 34).message().find("block size 32"),
            std::string::npos);
  EXPECT_FALSE(w.AddTensor("u", DType::kF32, {1, 1, 1, 1, 1}, buf.data(), 4).ok());
  EXPECT_FALSE(w.AddTensor("u", DType::kF32, {}, buf.data(), 0).ok());
  EXPECT_FALSE(w.AddTensor("u", DType::kF32, {4, 0}, buf.data(), 0).ok());
  EXPECT_FALSE(
      w.AddTensor("u", DType::kF32, {int64_t{1} << 40, int64_t{1} << 40}, buf.data(), 0).ok());
  EXPECT_EQ(w.tensor_count(), 1u);

  w.SetU32("first", 1);
  w.SetU32("second", 2);
  w.SetString("first", "replaced");
  EXPECT_TRUE(w.Has("first"));
  auto r = ParseString(*w.WriteToString());
  ASSERT_TRUE(r.ok());
  ASSERT_EQ((*r)->metadata().size(), 2u);
  EXPECT_EQ((*r)->metadata()[0].key, "first");
  EXPECT_EQ(*(*r)->GetString("first"), "replaced");
}

TEST_F(GgufTest, FailedWriteLeavesNoFile) {
  GgufWriter w;
  ASSERT_TRUE(
      w.AddTensorProduced("short", DType::kF32, {4}, [](const GgufWriter::Sink& sink) -> Status {
         const float x[2] = {1, 2};
         return sink(x, sizeof x);  // 8 of 16 bytes
       }).ok());
  const std::string path = Path("short.gguf");
  Status st = w.Write(path);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("gave 8 of its 16 bytes"), std::string::npos) << st.ToString();
  EXPECT_TRUE(fs::is_empty(dir_)) << "temporary or partial file left behind";

  GgufWriter ok;
  ok.SetU32("x", 1);
  ASSERT_TRUE(ok.Write(path).ok());
  ASSERT_TRUE(ok.Write(path).ok());  // overwrites in place
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
  EXPECT_FALSE(ok.Write(Path("no/such/dir/x.gguf")).ok());
}

TEST_F(GgufTest, OpenReportsMissingFiles) {
  auto r = GgufFile::Open(Path("missing.gguf"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), StatusCode::kIoError);
  EXPECT_NE(r.error().message().find("missing.gguf"), std::string::npos);
  ASSERT_TRUE(WriteFileAtomic(Path("junk.gguf"), "GGUF", 4).ok());
  auto junk = GgufFile::Open(Path("junk.gguf"));
  ASSERT_FALSE(junk.ok());
  EXPECT_EQ(junk.error().message().rfind(Path("junk.gguf") + ": truncated at offset 4", 0), 0u)
      << junk.error().message();
}

// ------------------------------------------------------------ the real model

TEST_F(GgufTest, ReadsStories260K) {
  auto r = GgufFile::Open(SharedDir() + "/models/stories260K.gguf");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  const GgufFile& f = **r;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset(), 14176u);
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetInt("llama.embedding_length"), 64);
  EXPECT_EQ(*f.GetInt("llama.block_count"), 5);
  EXPECT_EQ(*f.GetInt("llama.attention.head_count"), 8);
  EXPECT_EQ(*f.GetInt("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(*f.GetInt("llama.feed_forward_length"), 172);
  EXPECT_EQ(*f.GetInt("llama.context_length"), 512);
  EXPECT_FLOAT_EQ(static_cast<float>(*f.GetFloat("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_EQ(*f.GetString("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(*f.GetUint("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(*f.GetUint("tokenizer.ggml.eos_token_id"), 2u);
  auto tokens = f.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ((*tokens)->size(), 512u);
  EXPECT_EQ((**tokens)[1], "<s>");
  EXPECT_EQ((**tokens)[2], "</s>");
  EXPECT_EQ(f.GetFloatArray("tokenizer.ggml.scores")->size(), 512u);
  EXPECT_EQ(f.GetIntArray("tokenizer.ggml.token_type")->size(), 512u);
  EXPECT_EQ(f.metadata().size(), 19u);

  // The converter's tensor order: embeddings, output, then 9 per layer.
  std::vector<std::string> names = {"token_embd.weight", "output_norm.weight", "output.weight"};
  const char* kLayer[] = {"attn_q",   "attn_k",   "attn_v", "attn_output", "attn_norm",
                          "ffn_gate", "ffn_down", "ffn_up", "ffn_norm"};
  for (int l = 0; l < 5; ++l) {
    for (const char* n : kLayer) names.push_back("blk." + std::to_string(l) + "." + n + ".weight");
  }
  ASSERT_EQ(f.tensors().size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const GgufTensor& t = f.tensors()[i];
    EXPECT_EQ(t.name, names[i]);
    EXPECT_EQ(t.type, DType::kF32) << t.name;
  }
  const GgufTensor* emb = f.FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->ne, (std::vector<int64_t>{64, 512}));
  EXPECT_EQ(emb->nbytes, 64u * 512 * 4);
  EXPECT_EQ(f.FindTensor("blk.0.attn_k.weight")->ne, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(f.FindTensor("blk.4.ffn_down.weight")->ne, (std::vector<int64_t>{172, 64}));
  EXPECT_EQ(f.FindTensor("output_norm.weight")->ne, (std::vector<int64_t>{64}));
  const GgufTensor& last = f.tensors().back();
  EXPECT_EQ(f.data_offset() + last.offset + last.nbytes, f.size());

  // Our writer reproduces llama.cpp's file byte for byte.
  GgufWriter w;
  for (const auto& kv : f.metadata()) w.SetValue(kv.key, kv.value);
  for (const auto& t : f.tensors())
    ASSERT_TRUE(w.AddTensor(t.name, t.type, t.ne, t.data, t.nbytes).ok());
  auto bytes = w.WriteToString();
  ASSERT_TRUE(bytes.ok());
  ASSERT_EQ(bytes->size(), f.size());
  EXPECT_EQ(std::memcmp(bytes->data(), f.bytes(), f.size()), 0);
}

// ------------------------------------------------------------ malformed input

std::string SmallValidFile() {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetU32("llama.block_count", 1);
  w.SetStringArray("tokenizer.ggml.tokens", {"a", "bc"});
  const std::vector<float> scores = {0.5f, 1.5f};
  w.SetF32Array("tokenizer.ggml.scores", scores);
  w.SetValue("nested", GgufValue::ArrayOfArrays({GgufValue::StringArray({"q"})}));
  static const std::vector<uint8_t> a = Pattern(4 * 3, 1), b = Pattern(34, 2);
  (void)w.AddTensor("a", DType::kF32, {3}, a.data(), a.size());
  (void)w.AddTensor("b", DType::kQ8_0, {32}, b.data(), b.size());
  return *w.WriteToString();
}

TEST(GgufMalformedTest, EveryTruncationIsAnError) {
  const std::string full = SmallValidFile();
  auto parsed = ParseString(full);
  ASSERT_TRUE(parsed.ok());
  // Padding after the last tensor's data is optional; everything before it is not.
  const GgufTensor& last = (*parsed)->tensors().back();
  const size_t end = (*parsed)->data_offset() + last.offset + last.nbytes;
  ASSERT_LT(end, full.size());
  for (size_t n = end; n <= full.size(); ++n) {
    EXPECT_TRUE(GgufFile::Parse(reinterpret_cast<const uint8_t*>(full.data()), n, "mem").ok()) << n;
  }
  for (size_t n = 0; n < end; ++n) {
    // A fresh heap copy of exactly n bytes, so ASan sees any read past it.
    std::unique_ptr<uint8_t[]> copy(new uint8_t[n + 1]);
    std::memcpy(copy.get(), full.data(), n);
    auto r = GgufFile::Parse(copy.get(), n, "mem");
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(r.error().code(), StatusCode::kCorrupt) << r.error().ToString();
    const std::string& m = r.error().message();
    EXPECT_TRUE(
        m.find("truncated") != std::string::npos || m.find("past the end") != std::string::npos ||
        m.find("impossible") != std::string::npos || m.find("needs at least") != std::string::npos)
        << n << ": " << m;
  }
}

TEST(GgufMalformedTest, HeaderErrors) {
  ExpectParseError("", StatusCode::kCorrupt, "truncated at offset 0 reading magic");
  ExpectParseError("GGML\3\0\0\0", StatusCode::kCorrupt, "bad magic \"GGML\"");
  ExpectParseError(RawGguf().Header(0, 0, 1).str(), StatusCode::kUnsupported, "version 1");
  ExpectParseError(RawGguf().Header(0, 0, 4).str(), StatusCode::kUnsupported, "version 4");
  ExpectParseError(RawGguf().Header(0, 0, 0x03000000).str(), StatusCode::kUnsupported,
                   "big-endian");
  ExpectParseError(RawGguf().Bytes("GGUF").U32(3).U64(0).str(), StatusCode::kCorrupt,
                   "reading metadata count");
  ExpectParseError(RawGguf().Header(uint64_t{1} << 60, 0).str(), StatusCode::kCorrupt,
                   "tensor count 1152921504606846976 is impossible");
  ExpectParseError(RawGguf().Header(0, uint64_t{1} << 60).str(), StatusCode::kCorrupt,
                   "metadata count 1152921504606846976 is impossible");
  // Version 2 has the same layout and is accepted.
  auto v2 = ParseString(RawGguf().Header(0, 1, 2).KvU32("k", 1).str());
  ASSERT_TRUE(v2.ok()) << v2.error().ToString();
  EXPECT_EQ((*v2)->version(), 2u);
}

TEST(GgufMalformedTest, MetadataErrors) {
  ExpectParseError(RawGguf().Header(0, 1).U64(uint64_t{1} << 62).Bytes("abc").Zeros(16).str(),
                   StatusCode::kCorrupt, "string length 4611686018427387904 at offset 24");
  ExpectParseError(RawGguf().Header(0, 1).Str("k").U32(8).U64(~uint64_t{0}).Zeros(8).str(),
                   StatusCode::kCorrupt, "string length");
  ExpectParseError(RawGguf().Header(0, 2).KvU32("dup", 1).KvU32("dup", 2).str(),
                   StatusCode::kCorrupt, "duplicate key 'dup'");
  ExpectParseError(RawGguf().Header(0, 1).Str("k").U32(13).U64(0).str(), StatusCode::kCorrupt,
                   "key 'k' has unknown value type id 13");
  ExpectParseError(RawGguf().Header(0, 1).Str("arr").U32(9).U32(99).U64(0).str(),
                   StatusCode::kCorrupt, "unknown element type id 99");
  ExpectParseError(
      RawGguf().Header(0, 1).Str("arr").U32(9).U32(4).U64(uint64_t{1} << 61).Zeros(64).str(),
      StatusCode::kCorrupt, "array of 2305843009213693952 u32 elements");
  ExpectParseError(RawGguf().Header(0, 1).Str("arr").U32(9).U32(8).U64(1000).Zeros(64).str(),
                   StatusCode::kCorrupt, "key 'arr': array of 1000 string elements");
  ExpectParseError(RawGguf().Header(0, 1).Str("general.alignment").U32(4).U32(48).str(),
                   StatusCode::kCorrupt, "general.alignment 48 is not a nonzero power of two");
  ExpectParseError(RawGguf().Header(0, 1).Str("general.alignment").U32(4).U32(0).str(),
                   StatusCode::kCorrupt, "general.alignment 0");
  ExpectParseError(RawGguf().Header(0, 1).Str("general.alignment").U32(8).Str("32").str(),
                   StatusCode::kCorrupt,
                   "general.alignment must be an unsigned integer, got string");

  // Arrays nested kMaxArrayDepth deep are fine; one more level is rejected.
  auto nest = [](int depth) {
    RawGguf g;
    g.Header(0, 1).Str("deep").U32(9);
    for (int i = 1; i < depth; ++i) g.U32(9).U64(1);
    g.U32(0).U64(0);
    return g.str();
  };
  EXPECT_TRUE(ParseString(nest(GgufFile::kMaxArrayDepth)).ok());
  ExpectParseError(nest(GgufFile::kMaxArrayDepth + 1), StatusCode::kCorrupt,
                   "key 'deep': arrays nested deeper than 8 levels");
  // Nesting that merely claims a huge count fails on the count, not on memory.
  ExpectParseError(RawGguf().Header(0, 1).Str("n").U32(9).U32(9).U64(~uint64_t{0}).str(),
                   StatusCode::kCorrupt, "array of 18446744073709551615 array elements");
}

// One f32 {8} tensor (32 bytes) named `name` at `offset`, type `type`.
std::string OneTensor(std::vector<uint64_t> ne, uint32_t type, uint64_t offset,
                      size_t data_bytes = 32) {
  return RawGguf()
      .Header(1, 0)
      .Tensor("w", std::move(ne), type, offset)
      .Align()
      .Zeros(data_bytes)
      .str();
}

TEST(GgufMalformedTest, TensorErrors) {
  ASSERT_TRUE(ParseString(OneTensor({8}, 0, 0)).ok());
  ExpectParseError(OneTensor({8}, 0, 32), StatusCode::kCorrupt,
                   "tensor 'w' data (offset 32, 32 bytes, data section at 64) is past the end "
                   "of the file (96 bytes)");
  ExpectParseError(OneTensor({8}, 0, ~uint64_t{0} << 5), StatusCode::kCorrupt, "past the end");
  ExpectParseError(OneTensor({8}, 0, 0, 31), StatusCode::kCorrupt, "past the end");
  ExpectParseError(OneTensor({8}, 0, 4), StatusCode::kCorrupt,
                   "tensor 'w': data offset 4 is not aligned to 32");
  ExpectParseError(OneTensor({8}, 6, 0), StatusCode::kUnsupported,
                   "tensor 'w' has type id 6 (ggml 'q5_0'), which Strata does not support");
  ExpectParseError(OneTensor({8}, 1000, 0), StatusCode::kUnsupported,
                   "type id 1000 (ggml 'unknown')");
  ExpectParseError(OneTensor({}, 0, 0), StatusCode::kCorrupt,
                   "tensor 'w': n_dims 0 is outside 1..4");
  ExpectParseError(OneTensor({1, 1, 1, 1, 8}, 0, 0), StatusCode::kCorrupt, "n_dims 5");
  ExpectParseError(OneTensor({8, 0}, 0, 0), StatusCode::kCorrupt,
                   "tensor 'w': dimension 1 is 0 (must be positive)");
  ExpectParseError(OneTensor({~uint64_t{0}}, 0, 0), StatusCode::kCorrupt, "dimension 0 is -1");
  ExpectParseError(OneTensor({uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0), StatusCode::kCorrupt,
                   "element count overflows int64");
  ExpectParseError(OneTensor({uint64_t{1} << 62}, 0, 0), StatusCode::kCorrupt,
                   "byte size overflows");
  ExpectParseError(OneTensor({33}, 8, 0), StatusCode::kCorrupt,
                   "row length 33 is not a multiple of the q8_0 block size 32");
  ExpectParseError(
      RawGguf().Header(2, 0).Tensor("w", {8}, 0, 0).Tensor("w", {8}, 0, 32).Align().Zeros(64).str(),
      StatusCode::kCorrupt, "duplicate tensor 'w'");
  ExpectParseError(RawGguf().Header(1, 0).U64(1000).Bytes("w").Zeros(40).str(),
                   StatusCode::kCorrupt, "string length 1000 at offset 24 (name of tensor 0)");
  // Alignment from metadata governs both the offsets and the data section.
  const std::string a64 =
      RawGguf().Header(1, 1).Str("general.alignment").U32(4).U32(64).Tensor("w", {8}, 0, 32).str();
  ExpectParseError(a64, StatusCode::kCorrupt, "data offset 32 is not aligned to 64");
}

}  // namespace
}  // namespace strata
