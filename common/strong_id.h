#pragma once
// Strong id types: a BlockId can't be passed where a RequestId is expected.

#include <compare>
#include <cstdint>
#include <functional>

namespace strata {

template <typename Tag, typename Rep = uint64_t>
class StrongId {
 public:
  using rep_type = Rep;
  constexpr StrongId() = default;
  constexpr explicit StrongId(Rep v) : v_(v) {}
  constexpr Rep value() const { return v_; }
  friend constexpr auto operator<=>(const StrongId&, const StrongId&) = default;

 private:
  Rep v_{};
};

using BlockId = StrongId<struct BlockIdTag, uint32_t>;
using RequestId = StrongId<struct RequestIdTag, uint64_t>;
using SequenceId = StrongId<struct SequenceIdTag, uint64_t>;
using SegmentId = StrongId<struct SegmentIdTag, uint32_t>;

}  // namespace strata

template <typename Tag, typename Rep>
struct std::hash<strata::StrongId<Tag, Rep>> {
  size_t operator()(const strata::StrongId<Tag, Rep>& id) const noexcept {
    return std::hash<Rep>()(id.value());
  }
};
