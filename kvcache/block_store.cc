#include "kvcache/block_store.h"

#include <string>

namespace strata::kvcache {

BlockStore::~BlockStore() {
  if (segments_ == nullptr) return;
  for (SegmentId id : own_segments_) (void)segments_->Unregister(id);
}

Status BlockStore::Attach(SegmentTable* segments) {
  if (segments == nullptr) return Status::InvalidArgument(std::string(name()) + " store: attach to a null segment table");
  if (segments_ != nullptr)
    return Status::InvalidArgument(std::string(name()) + " store: already attached to a segment table");
  segments_ = segments;
  if (Status s = RegisterMemory(); !s.ok()) {
    Detach();
    return s;
  }
  return Status::Ok();
}

void BlockStore::Detach() {
  if (segments_ == nullptr) return;
  UnregisterMemory();
  for (SegmentId id : own_segments_) (void)segments_->Unregister(id);
  own_segments_.clear();
  segments_ = nullptr;
}

void BlockStore::SetChangeListener(ChangeListener listener) {
  change_listener_ = std::move(listener);
  if (!change_listener_) return;
  for (const BlockHash& h : HeldBlocks()) change_listener_(h, true);
}

Result<SegmentId> BlockStore::Own(SegmentKind kind, uint8_t* base, uint64_t size, std::string seg_name) {
  if (segments_ == nullptr) return Status::Internal(std::string(name()) + " store: not attached");
  STRATA_ASSIGN_OR_RETURN(SegmentId id, segments_->Register(kind, base, size, std::move(seg_name)));
  own_segments_.push_back(id);
  return id;
}

Result<std::span<uint8_t>> BlockStore::HostBytes(const Region& r, uint64_t length, bool allow_empty) const {
  if (allow_empty && r.length == 0) return std::span<uint8_t>();
  const std::string who = std::string(name()) + " store: ";
  if (segments_ == nullptr)
    return Status::Internal(who + "not attached to a segment table; regions cannot be resolved");
  if (r.length != length)
    return Status::InvalidArgument(who + "region of " + std::to_string(r.length) + " bytes in segment " +
                                   std::to_string(r.segment.value()) + ", blocks are " + std::to_string(length));
  auto bytes = segments_->Resolve(r);
  if (!bytes) return Status(bytes.error().code(), who + bytes.error().message());
  return *bytes;
}

}  // namespace strata::kvcache
