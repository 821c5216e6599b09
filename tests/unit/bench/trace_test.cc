// Mooncake traces: parsing errors name the line, the hash-id → token mapping
// is deterministic, ScaleRequest's arithmetic, and the ideal hit ratio (by
// hand and on the shared trace).

#include "bench/trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "tests/support/test_env.h"

namespace strata::bench {
namespace {

std::string ErrorOf(std::string_view text) {
  auto r = ParseTrace(text, "t.jsonl");
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : r.error().message();
}

TEST(TraceTest, ParsesLinesAndSkipsBlankOnes) {
  auto r = ParseTrace(
      "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 7, \"hash_ids\": [0, 1]}\n"
      "\n"
      "{\"timestamp\": 5, \"input_length\": 12, \"output_length\": 1, \"hash_ids\": [0], \"extra\": true}\r\n"
      "{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 2, \"hash_ids\": [9]}",
      "t.jsonl");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0].timestamp_ms, 0);
  EXPECT_EQ((*r)[0].input_length, 600);
  EXPECT_EQ((*r)[0].output_length, 7);
  EXPECT_EQ((*r)[0].hash_ids, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ((*r)[1].timestamp_ms, 5);
  EXPECT_EQ((*r)[2].hash_ids, (std::vector<int64_t>{9}));
}

TEST(TraceTest, ErrorsNameSourceAndLine) {
  const std::string ok = "{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [1]}\n";
  EXPECT_EQ(ErrorOf(ok + "\n{\"timestamp\": 2,"), "t.jsonl:3: not valid JSON");
  EXPECT_EQ(ErrorOf(ok + "[1, 2]"), "t.jsonl:2: not a JSON object");
  EXPECT_EQ(ErrorOf(ok + "{\"input_length\": 10, \"output_length\": 2, \"hash_ids\": [1]}"),
            "t.jsonl:2: missing field 'timestamp'");
  EXPECT_EQ(ErrorOf(ok + "{\"timestamp\": 2, \"output_length\": 2, \"hash_ids\": [1]}"),
            "t.jsonl:2: missing field 'input_length'");
  EXPECT_EQ(ErrorOf(ok + "{\"timestamp\": 2, \"input_length\": 10, \"output_length\": 2}"),
            "t.jsonl:2: missing field 'hash_ids'");
  EXPECT_EQ(ErrorOf(ok + "{\"timestamp\": 2, \"input_length\": -5, \"output_length\": 2, \"hash_ids\": [1]}"),
            "t.jsonl:2: input_length -5 is not in [1, 2^31)");
  EXPECT_EQ(ErrorOf(ok + "{\"timestamp\": 2, \"input_length\": 5, \"output_length\": 0, \"hash_ids\": [1]}"),
            "t.jsonl:2: output_length 0 is not in [1, 2^31)");
  EXPECT_EQ(ErrorOf(ok + "{\"timestamp\": -1, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}"),
            "t.jsonl:2: negative timestamp -1");
  EXPECT_EQ(ErrorOf(ok + "{\"timestamp\": 2, \"input_length\": 5.5, \"output_length\": 1, \"hash_ids\": [1]}"),
            "t.jsonl:2: field 'input_length' is not an integer");
  EXPECT_EQ(ErrorOf(ok + "{\"timestamp\": 2, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": []}"),
            "t.jsonl:2: field 'hash_ids' is empty");
  EXPECT_EQ(ErrorOf(ok + "{\"timestamp\": 2, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1, -2]}"),
            "t.jsonl:2: hash_ids[1] is negative");
  EXPECT_EQ(ErrorOf(ok + "{\"timestamp\": 2, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [\"a\"]}"),
            "t.jsonl:2: hash_ids[0] is not an integer");
  EXPECT_EQ(ErrorOf(ok + "{\"timestamp\": 2, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": 3}"),
            "t.jsonl:2: field 'hash_ids' is not an array");
  // Equal timestamps are fine; going back in time is not.
  EXPECT_TRUE(ParseTrace(ok + ok, "t.jsonl").ok());
  EXPECT_EQ(ErrorOf(ok + "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}"),
            "t.jsonl:2: timestamp 0 is before the previous request's 1");
}

TEST(TraceTest, LoadTraceNamesMissingFile) {
  auto r = LoadTrace("/nonexistent/strata/trace.jsonl");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("/nonexistent/strata/trace.jsonl"), std::string::npos);
}

TEST(TraceTest, HashIdTokensAreDeterministicAndInRange) {
  const auto a = HashIdTokens(42, 64, 1000, 3);
  EXPECT_EQ(a, HashIdTokens(42, 64, 1000, 3));
  ASSERT_EQ(a.size(), 64u);
  for (int32_t t : a) {
    EXPECT_GE(t, 3);
    EXPECT_LT(t, 1000);
  }
  // A shorter block of the same id is a prefix of the longer one.
  const auto b = HashIdTokens(42, 10, 1000, 3);
  EXPECT_TRUE(std::equal(b.begin(), b.end(), a.begin()));
  // Different (neighbouring) ids give different blocks.
  std::set<std::vector<int32_t>> distinct;
  for (int64_t id = 0; id < 200; ++id) distinct.insert(HashIdTokens(id, 16, 512, 3));
  EXPECT_EQ(distinct.size(), 200u);
  EXPECT_TRUE(HashIdTokens(1, 0, 100, 3).empty());
  // Uses the whole range, not a corner of it.
  std::set<int32_t> seen;
  for (int32_t t : HashIdTokens(7, 4000, 20, 3)) seen.insert(t);
  EXPECT_EQ(seen.size(), 17u);
}

TEST(TraceTest, ScaleRequestRealLengths) {
  TraceRequest r{0, 1100, 7, {5, 6, 7}};
  const ScaledRequest s = ScaleRequest(r, 0, 32000, 3);
  // 512 + 512 + (1100 - 1024) tokens.
  ASSERT_EQ(s.prompt.size(), 1100u);
  EXPECT_EQ(s.output_length, 7);
  const auto id5 = HashIdTokens(5, 512, 32000, 3);
  const auto id7 = HashIdTokens(7, 76, 32000, 3);
  EXPECT_TRUE(std::equal(id5.begin(), id5.end(), s.prompt.begin()));
  EXPECT_TRUE(std::equal(id7.begin(), id7.end(), s.prompt.begin() + 1024));
  EXPECT_EQ(HashIdTokenCount(r, 0, 0), 512);
  EXPECT_EQ(HashIdTokenCount(r, 2, 0), 76);
  // The last id gets at least one token even when input_length is short.
  TraceRequest tiny{0, 3, 1, {1, 2}};
  EXPECT_EQ(ScaleRequest(tiny, 0, 100, 3).prompt.size(), 513u);
}

TEST(TraceTest, ScaleRequestScaledLengths) {
  TraceRequest r{0, 1100, 700, {5, 6, 7}};
  ScaledRequest s = ScaleRequest(r, 16, 32000, 3);
  ASSERT_EQ(s.prompt.size(), 48u);  // 3 ids x 16
  EXPECT_EQ(s.output_length, 22);   // ceil(700 * 16 / 512) = ceil(21.875)
  const auto id6 = HashIdTokens(6, 16, 32000, 3);
  EXPECT_TRUE(std::equal(id6.begin(), id6.end(), s.prompt.begin() + 16));
  r.output_length = 1;
  EXPECT_EQ(ScaleRequest(r, 16, 32000, 3).output_length, 1);  // rounded up, at least 1
  r.output_length = 64;
  EXPECT_EQ(ScaleRequest(r, 16, 32000, 3).output_length, 2);  // exactly 2
  r.output_length = 65;
  EXPECT_EQ(ScaleRequest(r, 16, 32000, 3).output_length, 3);
  // Equal ids give equal tokens across requests: the prefix sharing survives.
  TraceRequest other{0, 40, 1, {5, 6, 9}};
  const ScaledRequest t = ScaleRequest(other, 16, 32000, 3);
  EXPECT_TRUE(std::equal(t.prompt.begin(), t.prompt.begin() + 32, s.prompt.begin()));
  EXPECT_FALSE(std::equal(t.prompt.begin() + 32, t.prompt.end(), s.prompt.begin() + 32));
}

TEST(TraceTest, IdealHitRatioByHand) {
  std::vector<TraceRequest> t = {
      {0, 1, 1, {1, 2, 3}},     // 0 hits
      {1, 1, 1, {1, 2, 4}},     // 1, 2
      {2, 1, 1, {1, 2, 3, 5}},  // 1, 2, 3
      {3, 1, 1, {2, 3}},        // 2 at position 0 is a new chain: 0 hits
      {4, 1, 1, {1, 9, 3}},     // 1; 9 misses, so 3 after it does too
      {5, 1, 1, {1, 2, 3}},     // whole prompt seen: 3
  };
  const IdealHit h = IdealHitRatio(t);
  EXPECT_EQ(h.total_ids, 18u);
  EXPECT_EQ(h.hit_ids, 9u);
  EXPECT_DOUBLE_EQ(h.ratio(), 0.5);
  EXPECT_EQ(IdealHitIdsPerRequest(t), (std::vector<uint32_t>{0, 2, 3, 0, 1, 3}));
  EXPECT_EQ(IdealHitRatio({}).ratio(), 0.0);
}

TEST(TraceTest, SharedTraceIdealHitRatio) {
  auto t = LoadTrace(testing::SharedDir() + "/traces/synthetic_trace.jsonl");
  ASSERT_TRUE(t.ok()) << t.error().ToString();
  EXPECT_EQ(t->size(), 3993u);
  const IdealHit h = IdealHitRatio(*t);
  EXPECT_EQ(h.hit_ids, 77953u);
  EXPECT_EQ(h.total_ids, 121877u);
  EXPECT_NEAR(h.ratio(), 0.639604, 5e-7);
}

}  // namespace
}  // namespace strata::bench
