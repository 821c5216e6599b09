// FinalEventError (server/frontend.h): how a failed request's final event
// becomes an API error, the same for HTTP and gRPC.

#include <gtest/gtest.h>

#include "server/frontend.h"

namespace strata::server {
namespace {

scheduler::RequestOutput Final(FinishReason reason, Status status) {
  scheduler::RequestOutput o;
  o.finished = true;
  o.finish_reason = reason;
  o.status = std::move(status);
  return o;
}

TEST(FinalEventError, AnSloRefusalIs429SloUnattainable) {
  const ApiError e = FinalEventError(Final(
      FinishReason::kError,
      Status::ResourceExhausted(std::string(scheduler::kSloUnattainable) + ": the best predicted time to first token is 3 s")));
  EXPECT_EQ(e.http_status, 429);
  EXPECT_EQ(e.code, "slo_unattainable");
  EXPECT_EQ(e.type, "rate_limit_error");
  EXPECT_EQ(e.grpc_code(), 8);  // RESOURCE_EXHAUSTED
  EXPECT_NE(e.message.find("3 s"), std::string::npos);
}

TEST(FinalEventError, OtherErrorsAre500AndAbortsAre503) {
  EXPECT_EQ(FinalEventError(Final(FinishReason::kError, Status::ResourceExhausted("out of blocks"))).http_status, 500);
  EXPECT_EQ(FinalEventError(Final(FinishReason::kError, Status::Internal("boom"))).http_status, 500);
  const ApiError a = FinalEventError(Final(FinishReason::kAbort, Status::Cancelled("shutting down")));
  EXPECT_EQ(a.http_status, 503);
  EXPECT_NE(a.message.find("shutting down"), std::string::npos);
}

}  // namespace
}  // namespace strata::server
