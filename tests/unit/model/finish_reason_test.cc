// model/finish_reason.h: every finish reason has its one wire name (what
// OpenAI clients, gRPC clients and the metrics' label see), distinct, and
// "not finished" has none.

#include "model/finish_reason.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace strata {
namespace {

TEST(FinishReasonTest, EveryReasonHasItsWireName) {
  EXPECT_EQ(FinishReasonName(FinishReason::kStop), "stop");
  EXPECT_EQ(FinishReasonName(FinishReason::kLength), "length");
  EXPECT_EQ(FinishReasonName(FinishReason::kAbort), "abort");
  EXPECT_EQ(FinishReasonName(FinishReason::kError), "error");
  EXPECT_EQ(FinishReasonName(FinishReason::kPaused), "paused");
  EXPECT_EQ(FinishReasonName(FinishReason::kNone), "");
  std::set<std::string> names;
  for (FinishReason r : {FinishReason::kStop, FinishReason::kLength, FinishReason::kAbort, FinishReason::kError,
                         FinishReason::kPaused})
    names.insert(std::string(FinishReasonName(r)));
  EXPECT_EQ(names.size(), 5u);
}

}  // namespace
}  // namespace strata
