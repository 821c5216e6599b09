#include <gtest/gtest.h>

#include <string>

#include "model/generate.h"
#include "model/output_processor.h"

namespace strata {
namespace {

// Feeds `pieces` one by one and returns everything released.
std::string Feed(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) out += m.Push(p);
  return out;
}

TEST(StopMatcherTest, StopStringSplitAcrossPiecesIsNeverReleased) {
  StopMatcher m({"END"});
  std::string out = Feed(m, {"hello E", "N", "D and more"});
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(out, "hello ");
  EXPECT_EQ(m.Push("later"), "");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcherTest, FalseStartIsReleasedOnceItCannotMatch) {
  StopMatcher m({"END"});
  std::string out = Feed(m, {"the E", "ND", "X"});
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(out, "the ");
  StopMatcher n({"END"});
  out = Feed(n, {"the E", "Nx", "!"});
  EXPECT_FALSE(n.stopped());
  out += n.Flush();
  EXPECT_EQ(out, "the ENx!");
}

TEST(StopMatcherTest, EarliestOfSeveralStopsWins) {
  StopMatcher m({"world", "lo w"});
  std::string out = Feed(m, {"hel", "lo world"});
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(out, "hel");
}

TEST(StopMatcherTest, HoldBackNeverSplitsUtf8) {
  // "é" is 2 bytes, "😀" 4: released text is always whole characters.
  StopMatcher m({"xyz"});
  std::string all, input;
  for (const char* piece : {"caf\xC3\xA9", " \xF0\x9F\x98\x80", "!"}) {
    input += piece;
    std::string out = m.Push(piece);
    all += out;
    for (size_t i = 0; i < out.size();) {
      unsigned char c = static_cast<unsigned char>(out[i]);
      size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
      ASSERT_LE(i + len, out.size()) << "split character in '" << out << "'";
      i += len;
    }
  }
  EXPECT_EQ(all + m.Flush(), input);
}

TEST(StopMatcherTest, NoStopsReleasesEverythingAtOnce) {
  StopMatcher m({});
  EXPECT_EQ(m.Push("abc"), "abc");
  EXPECT_EQ(m.Flush(), "");
}

TEST(ResolveMaxTokensTest, ErrorsSayBothNumbers) {
  EXPECT_EQ(*ResolveMaxTokens(10, -1, 512), 502);
  EXPECT_EQ(*ResolveMaxTokens(10, 5, 512), 5);
  auto full = ResolveMaxTokens(512, -1, 512);
  ASSERT_FALSE(full);
  EXPECT_NE(full.error().message().find("512 tokens"), std::string::npos);
  auto over = ResolveMaxTokens(500, 20, 512);
  ASSERT_FALSE(over);
  EXPECT_NE(over.error().message().find("500"), std::string::npos);
  EXPECT_NE(over.error().message().find("20"), std::string::npos);
  EXPECT_FALSE(ResolveMaxTokens(0, 5, 512));
  EXPECT_FALSE(ResolveMaxTokens(5, 0, 512));
}

}  // namespace
}  // namespace strata
