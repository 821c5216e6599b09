#include "model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "tests/support/test_env.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// A file laid out by hand from the format description: length, header, data.
std::string RawFile(const std::string& header, const std::vector<uint8_t>& data,
                    uint64_t header_len_override = UINT64_MAX) {
  uint64_t n = header_len_override == UINT64_MAX ? header.size() : header_len_override;
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  s += header;
  s.append(reinterpret_cast<const char*>(data.data()), data.size());
  return s;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) { return dir_ + "/" + name; }
  std::string WriteRaw(const std::string& name, const std::string& bytes) {
    std::string p = Path(name);
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  // Opens a hand-made file and expects failure with `code` and `substr`.
  void ExpectOpenError(const std::string& bytes, StatusCode code, const std::string& substr) {
    std::string p = WriteRaw("bad.safetensors", bytes);
    auto f = SafetensorsFile::Open(p);
    ASSERT_FALSE(f.ok()) << "opened: " << substr;
    EXPECT_EQ(f.error().code(), code) << f.error().ToString();
    EXPECT_THAT(f.error().message(), HasSubstr(substr));
    EXPECT_THAT(f.error().message(), HasSubstr(p));  // names the file
  }
  std::string dir_ = testing::MakeTempDir("safetensors_test_");
};

TEST_F(SafetensorsTest, RoundTripTypesShapesAndMetadata) {
  auto a = RandomBytes(3 * 5 * 4, 1);      // F32 [3, 5]
  auto b = RandomBytes(4 * 2, 2);          // F16 [4]
  auto c = RandomBytes(2 * 3 * 4 * 2, 3);  // BF16 [2, 3, 4]
  float scalar = 2.5f;                     // F32 []
  SafetensorsWriter w;
  ASSERT_TRUE(w.Add("a.weight", DType::kF32, {3, 5}, a.data(), a.size()).ok());
  ASSERT_TRUE(w.Add("b", DType::kF16, {4}, b.data(), b.size()).ok());
  ASSERT_TRUE(w.Add("c", DType::kBF16, {2, 3, 4}, c.data(), c.size()).ok());
  ASSERT_TRUE(w.Add("s", DType::kF32, {}, &scalar, sizeof scalar).ok());
  ASSERT_TRUE(w.Add("empty", DType::kF32, {0, 7}, nullptr, 0).ok());
  w.SetMetadata("format", "pt");
  w.SetMetadata("note", "hello");
  EXPECT_EQ(w.data_bytes(), a.size() + b.size() + c.size() + 4);
  ASSERT_TRUE(w.Write(Path("m.safetensors")).ok());

  auto f = SafetensorsFile::Open(Path("m.safetensors"));
  ASSERT_TRUE(f.ok()) << f.error().ToString();
  EXPECT_EQ((*f)->tensors().size(), 5u);
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  EXPECT_EQ((*f)->metadata().at("note"), "hello");

  const Tensor* ta = (*f)->Find("a.weight");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->type, DType::kF32);
  EXPECT_EQ(ta->ne, (std::vector<int64_t>{5, 3}));  // reversed: 3 rows of 5
  EXPECT_EQ(ta->cols(), 5);
  EXPECT_EQ(ta->rows(), 3);
  ASSERT_EQ(ta->nbytes, a.size());
  EXPECT_EQ(std::memcmp(ta->data, a.data(), a.size()), 0);

  const Tensor* tb = (*f)->Find("b");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->type, DType::kF16);
  EXPECT_EQ(tb->ne, (std::vector<int64_t>{4}));
  EXPECT_EQ(std::memcmp(tb->data, b.data(), b.size()), 0);

  const Tensor* tc = (*f)->Find("c");
  ASSERT_NE(tc, nullptr);
  EXPECT_EQ(tc->type, DType::kBF16);
  EXPECT_EQ(tc->ne, (std::vector<int64_t>{4, 3, 2}));
  EXPECT_EQ(std::memcmp(tc->data, c.data(), c.size()), 0);

  const Tensor* ts = (*f)->Find("s");
  ASSERT_NE(ts, nullptr);
  EXPECT_EQ(ts->ne, (std::vector<int64_t>{1}));
  float got;
  std::memcpy(&got, ts->data, 4);
  EXPECT_EQ(got, 2.5f);

  const Tensor* te = (*f)->Find("empty");
  ASSERT_NE(te, nullptr);
  EXPECT_EQ(te->nbytes, 0u);
  EXPECT_EQ(te->ne, (std::vector<int64_t>{7, 0}));

  EXPECT_EQ((*f)->Find("missing"), nullptr);
}

TEST_F(SafetensorsTest, WriterAlignsDataAndLeavesNoTempFile) {
  std::vector<float> v = {1, 2, 3};
  SafetensorsWriter w;
  ASSERT_TRUE(w.Add("x", DType::kF32, {3}, v.data(), 12).ok());
  ASSERT_TRUE(w.Write(Path("x.safetensors")).ok());
  auto m = MappedFile::Open(Path("x.safetensors"));
  ASSERT_TRUE(m.ok());
  uint64_t n = 0;
  std::memcpy(&n, (*m)->data(), 8);  // little-endian host
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ((*m)->size(), 8 + n + 12);
  auto f = SafetensorsFile::Open(Path("x.safetensors"));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*f)->Find("x")->data) % 8, 0u);
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) entries += e.is_regular_file();
  EXPECT_EQ(entries, 1);
}

TEST_F(SafetensorsTest, ReadsHandMadeFileInAnyOrder) {
  // Tensors stored out of name order, with space padding after the JSON.
  std::vector<uint8_t> data(24 + 8);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i);
  std::string header =
      R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]},)"
      R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},"__metadata__":{"k":"v"}}   )";
  auto p = WriteRaw("hand.safetensors", RawFile(header, data));
  auto f = SafetensorsFile::Open(p);
  ASSERT_TRUE(f.ok()) << f.error().ToString();
  const Tensor* w = (*f)->Find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->ne, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(w->data[0], 8);
  EXPECT_EQ(w->nbytes, 24u);
  const Tensor* b = (*f)->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, DType::kBF16);
  EXPECT_EQ(b->data[7], 7);
  EXPECT_EQ((*f)->metadata().at("k"), "v");
  ASSERT_EQ((*f)->tensors().size(), 2u);
  EXPECT_EQ((*f)->tensors()[0].name, "b");  // sorted by name
}

TEST_F(SafetensorsTest, ReleasedMappingKeepsDataValid) {
  std::vector<float> v = {4, 5};
  SafetensorsWriter w;
  ASSERT_TRUE(w.Add("v", DType::kF32, {2}, v.data(), 8).ok());
  ASSERT_TRUE(w.Write(Path("r.safetensors")).ok());
  auto f = SafetensorsFile::Open(Path("r.safetensors"));
  ASSERT_TRUE(f.ok());
  Tensor t = *(*f)->Find("v");
  std::unique_ptr<MappedFile> map = (*f)->ReleaseMapping();
  f = Status::Internal("dropped");  // destroys the SafetensorsFile
  ASSERT_NE(map, nullptr);
  EXPECT_EQ(std::memcmp(t.data, v.data(), 8), 0);
}

TEST_F(SafetensorsTest, MalformedFiles) {
  const std::vector<uint8_t> data24(24, 0);
  const std::string ok_entry = R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})";
  ExpectOpenError("\x05\x00\x00", StatusCode::kCorrupt, "truncated");
  ExpectOpenError(RawFile(ok_entry, data24, 1000), StatusCode::kCorrupt,
                  "past the end of the file");
  ExpectOpenError(RawFile(ok_entry, data24, 1ull << 40), StatusCode::kCorrupt, "absurd");
  ExpectOpenError(RawFile("{\"w\": {\"dtype\": ", data24), StatusCode::kCorrupt, "not valid JSON");
  ExpectOpenError(RawFile("[1, 2]", data24), StatusCode::kCorrupt, "not a JSON object");
  ExpectOpenError(RawFile(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,28]}})", data24),
                  StatusCode::kCorrupt, "run past the end of the data");
  ExpectOpenError(RawFile(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[4,24]}})", data24),
                  StatusCode::kCorrupt, "needs 24");
  ExpectOpenError(RawFile(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[24,0]}})", data24),
                  StatusCode::kCorrupt, "reversed");
  ExpectOpenError(RawFile(R"({"w":{"dtype":"F32","shape":[-2,3],"data_offsets":[0,24]}})", data24),
                  StatusCode::kCorrupt, "negative");
  ExpectOpenError(RawFile(R"({"w":{"dtype":"F32","shape":[2,3]}})", data24), StatusCode::kCorrupt,
                  "data_offsets");
  ExpectOpenError(RawFile(R"({"w":{"shape":[2,3],"data_offsets":[0,24]}})", data24),
                  StatusCode::kCorrupt, "dtype");
  ExpectOpenError(RawFile(R"({"w":[1]})", data24), StatusCode::kCorrupt, "'w'");
  ExpectOpenError(RawFile(R"({"__metadata__":{"k":1}})", data24), StatusCode::kCorrupt, "'k'");
  ExpectOpenError(
      RawFile(R"({"w":{"dtype":"F32","shape":[9223372036854775807,4],"data_offsets":[0,24]}})",
              data24),
      StatusCode::kCorrupt, "too large");
  ExpectOpenError(RawFile(R"({"q":{"dtype":"I8","shape":[24],"data_offsets":[0,24]}})", data24),
                  StatusCode::kUnsupported, "'q' has dtype I8");
  ExpectOpenError(
      RawFile(R"({"q":{"dtype":"F8_E4M3","shape":[24],"data_offsets":[0,24]}})", data24),
      StatusCode::kUnsupported, "F8_E4M3");
  ExpectOpenError(
      RawFile(R"({"w":{"dtype":"F32","shape":[1,1,1,2,3],"data_offsets":[0,24]}})", data24),
      StatusCode::kUnsupported, "dimensions");
}

TEST_F(SafetensorsTest, MissingFileIsIoError) {
  auto f = SafetensorsFile::Open(Path("nope.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code(), StatusCode::kIoError);
  EXPECT_THAT(f.error().message(), HasSubstr("nope.safetensors"));
}

TEST_F(SafetensorsTest, WriterRejectsBadTensors) {
  std::vector<uint8_t> buf(64);
  SafetensorsWriter w;
  ASSERT_TRUE(w.Add("a", DType::kF32, {4}, buf.data(), 16).ok());
  Status dup = w.Add("a", DType::kF32, {4}, buf.data(), 16);
  EXPECT_EQ(dup.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(dup.message(), HasSubstr("'a' added twice"));
  Status size = w.Add("b", DType::kF16, {4}, buf.data(), 16);
  EXPECT_EQ(size.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(size.message(), HasSubstr("needs 8"));
  Status quant = w.Add("c", DType::kQ8_0, {32}, buf.data(), 34);
  EXPECT_EQ(quant.code(), StatusCode::kUnsupported);
  EXPECT_THAT(quant.message(), HasSubstr("q8_0"));
  EXPECT_EQ(w.Add("d", DType::kF32, {-1}, buf.data(), 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.Add("__metadata__", DType::kF32, {4}, buf.data(), 16).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.size(), 1u);  // failed adds left nothing behind
  Status bad_dir = w.Write(Path("no/such/dir/x.safetensors"));
  EXPECT_EQ(bad_dir.code(), StatusCode::kIoError);
}

TEST_F(SafetensorsTest, AddTensorReversesNe) {
  std::vector<uint8_t> buf(2 * 3 * 2);
  Tensor t;
  t.name = "t";
  t.type = DType::kF16;
  t.ne = {3, 2};
  t.data = buf.data();
  t.nbytes = buf.size();
  SafetensorsWriter w;
  ASSERT_TRUE(w.AddTensor(t).ok());
  ASSERT_TRUE(w.AddTensor(t, "renamed").ok());
  ASSERT_TRUE(w.Write(Path("t.safetensors")).ok());
  auto f = SafetensorsFile::Open(Path("t.safetensors"));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->Find("t")->ne, t.ne);
  EXPECT_EQ((*f)->Find("renamed")->ne, t.ne);
  // The header stores row-major [2, 3].
  auto text = ReadFileToString(Path("t.safetensors"));
  ASSERT_TRUE(text.ok());
  EXPECT_THAT(*text, HasSubstr("\"shape\":[2,3]"));
}

}  // namespace
}  // namespace strata
