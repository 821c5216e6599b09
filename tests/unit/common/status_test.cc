#include "common/status.h"

#include <gtest/gtest.h>

#include <memory>

namespace strata {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return Status::InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  STRATA_ASSIGN_OR_RETURN(int h, Half(x));
  STRATA_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(StatusTest, OkAndError) {
  EXPECT_TRUE(Status::Ok().ok());
  Status s = Status::NotFound("tensor 'x'");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NotFound: tensor 'x'");
  EXPECT_EQ(s.WithContext("loading").message(), "loading: tensor 'x'");
}

TEST(StatusTest, ResultPropagates) {
  EXPECT_EQ(*Quarter(8), 2);
  auto r = Quarter(6);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message(), "odd: 3");
}

TEST(StatusTest, ResultMoveOnly) {
  Result<std::unique_ptr<int>> r(std::make_unique<int>(7));
  ASSERT_TRUE(r);
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 7);
}

TEST(StatusTest, ResultFromOkStatusIsInternalError) {
  Result<int> r(Status::Ok());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace strata
