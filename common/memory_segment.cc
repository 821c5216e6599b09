#include "common/memory_segment.h"

#include <limits>

namespace strata {

namespace {

std::string Describe(const Segment& s) {
  return "segment " + std::to_string(s.id.value()) + " (" + s.name + ", " + std::string(SegmentKindName(s.kind)) +
         ", " + std::to_string(s.size) + " bytes)";
}

uintptr_t Addr(const uint8_t* p) { return reinterpret_cast<uintptr_t>(p); }

}  // namespace

std::string_view SegmentKindName(SegmentKind k) {
  switch (k) {
    case SegmentKind::kHost:
      return "host";
    case SegmentKind::kPinnedHost:
      return "pinned host";
    case SegmentKind::kDevice:
      return "device";
    case SegmentKind::kFile:
      return "file";
  }
  return "host";
}

Result<SegmentId> SegmentTable::Register(SegmentKind kind, uint8_t* base, uint64_t size, std::string name) {
  if (size == 0) return Status::InvalidArgument("segment '" + name + "': size 0");
  if (base == nullptr && kind != SegmentKind::kFile)
    return Status::InvalidArgument("segment '" + name + "': null base for " + std::string(SegmentKindName(kind)) +
                                   " memory");
  if (base != nullptr && size > std::numeric_limits<uintptr_t>::max() - Addr(base))
    return Status::InvalidArgument("segment '" + name + "': the range overflows the address space");
  std::lock_guard<std::mutex> lock(mu_);
  if (HostAddressable(kind)) {
    for (const auto& [id, s] : segments_) {
      if (!HostAddressable(s.kind)) continue;
      if (Addr(base) < Addr(s.base) + s.size && Addr(s.base) < Addr(base) + size)
        return Status::InvalidArgument("segment '" + name + "' overlaps " + Describe(s));
    }
  }
  Segment s;
  s.id = SegmentId(next_id_++);
  s.kind = kind;
  s.base = base;
  s.size = size;
  s.name = std::move(name);
  const SegmentId id = s.id;
  segments_.emplace(id, std::move(s));
  return id;
}

Status SegmentTable::Unregister(SegmentId id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (segments_.erase(id) == 0) return Status::NotFound("segment " + std::to_string(id.value()) + " is not registered");
  return Status::Ok();
}

std::optional<Segment> SegmentTable::Get(SegmentId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = segments_.find(id);
  if (it == segments_.end()) return std::nullopt;
  return it->second;
}

size_t SegmentTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return segments_.size();
}

Status SegmentTable::CheckLocked(const Region& r) const {
  auto it = segments_.find(r.segment);
  if (it == segments_.end())
    return Status::NotFound("segment " + std::to_string(r.segment.value()) + " is not registered");
  const Segment& s = it->second;
  if (r.length == 0)
    return Status::InvalidArgument("a zero-length region of " + Describe(s) + " at offset " + std::to_string(r.offset));
  if (r.offset > s.size || r.length > s.size - r.offset)
    return Status::InvalidArgument("region [" + std::to_string(r.offset) + ", +" + std::to_string(r.length) +
                                   ") is out of bounds of " + Describe(s));
  return Status::Ok();
}

Status SegmentTable::Check(const Region& r) const {
  std::lock_guard<std::mutex> lock(mu_);
  return CheckLocked(r);
}

Result<std::span<uint8_t>> SegmentTable::Resolve(const Region& r) const {
  std::lock_guard<std::mutex> lock(mu_);
  STRATA_RETURN_IF_ERROR(CheckLocked(r));
  const Segment& s = segments_.at(r.segment);
  if (!HostAddressable(s.kind))
    return Status::InvalidArgument(Describe(s) + " is not host-addressable: its bytes move through its own engine");
  return std::span<uint8_t>(s.base + r.offset, static_cast<size_t>(r.length));
}

Result<Region> SegmentTable::Locate(const uint8_t* p, uint64_t length) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, s] : segments_) {
    if (!HostAddressable(s.kind) || Addr(p) < Addr(s.base)) continue;
    const uint64_t off = Addr(p) - Addr(s.base);
    if (off < s.size && length <= s.size - off) return Region{id, off, length};
  }
  return Status::NotFound("no registered host segment holds " + std::to_string(length) + " bytes at " +
                          std::to_string(Addr(p)));
}

}  // namespace strata
