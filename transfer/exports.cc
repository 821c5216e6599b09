#include "transfer/exports.h"

#include <limits>

#include "transfer/shared_memory.h"

namespace strata::transfer {

Result<uint64_t> ExportTable::ExportSegment(const Segment& seg, std::string name) {
  if (!HostAddressable(seg.kind)) {
    return Status::Unsupported("segment '" + seg.name + "' is " + std::string(SegmentKindName(seg.kind)) +
                               " memory: only host memory can be exported");
  }
  if (name.empty()) return Status::InvalidArgument("an exported segment needs a name");
  std::lock_guard lock(mu_);
  if (by_name_.count(name)) return Status::InvalidArgument("segment name '" + name + "' is already exported");
  Entry e;
  e.handle = next_handle_++;
  e.name = name;
  e.base = seg.base;
  e.length = seg.size;
  e.writable = false;
  if (auto sh = FindShared(e.base, e.length)) {
    e.memfd = sh->fd;
    e.memfd_offset = sh->offset;
  }
  by_name_[name] = e.handle;
  uint64_t h = e.handle;
  entries_.emplace(h, std::move(e));
  return h;
}

Status ExportTable::Unexport(const std::string& name) {
  uint64_t h;
  {
    std::lock_guard lock(mu_);
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return Status::NotFound("no exported segment '" + name + "'");
    h = it->second;
  }
  auto r = Revoke(h);
  return r ? Status::Ok() : r.error();
}

Result<uint64_t> ExportTable::Grant(uint8_t* base, uint64_t length, std::string grantee,
                                    std::chrono::nanoseconds lease) {
  if (grantee.empty()) return Status::InvalidArgument("a grant needs the grantee's instance name");
  if (length == 0 || base == nullptr) return Status::InvalidArgument("a grant needs a non-empty region");
  if (lease.count() <= 0) return Status::InvalidArgument("a grant needs a positive lease");
  std::lock_guard lock(mu_);
  Entry e;
  e.handle = next_handle_++;
  e.name = "grant " + std::to_string(e.handle) + " to " + grantee;
  e.base = base;
  e.length = length;
  e.writable = true;
  e.grantee = std::move(grantee);
  e.expires = Clock::now() + lease;
  if (auto sh = FindShared(base, length)) {
    e.memfd = sh->fd;
    e.memfd_offset = sh->offset;
  }
  uint64_t h = e.handle;
  entries_.emplace(h, std::move(e));
  return h;
}

Result<std::vector<uint64_t>> ExportTable::Revoke(uint64_t handle) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(handle);
  if (it == entries_.end()) return Status::NotFound("no export with handle " + std::to_string(handle));
  Entry& e = it->second;
  e.revoked = true;
  if (e.grantee.empty()) by_name_.erase(e.name);
  std::vector<uint64_t> conns;
  for (const auto& [c, n] : e.active) {
    if (n > 0) conns.push_back(c);
  }
  return conns;
}

bool ExportTable::Quiesced(uint64_t handle) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(handle);
  if (it == entries_.end()) return true;
  const Entry& e = it->second;
  if (!e.revoked) return false;
  for (const auto& [c, n] : e.active) {
    if (n > 0) return false;
  }
  return e.direct.empty();
}

void ExportTable::Forget(uint64_t handle) {
  std::lock_guard lock(mu_);
  entries_.erase(handle);
}

Result<ExportView> ExportTable::View(const Entry& e) const {
  ExportView v;
  v.handle = e.handle;
  v.length = e.length;
  v.writable = e.writable;
  v.base_address = reinterpret_cast<uint64_t>(e.base);
  v.expires_ns = e.expires == Clock::time_point::max()
                     ? 0
                     : std::chrono::duration_cast<std::chrono::nanoseconds>(e.expires.time_since_epoch()).count();
  v.name = e.name;
  v.memfd = e.memfd;
  v.memfd_offset = e.memfd_offset;
  return v;
}

std::optional<uint64_t> ExportTable::HandleOf(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

Result<ExportView> ExportTable::OpenSegment(const std::string& name, const std::string& /*peer*/,
                                            uint64_t direct_conn) {
  std::lock_guard lock(mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    ++refused_;
    return Status::NotFound("no readable segment '" + name + "' (private segments are reached only through grants)");
  }
  Entry& e = entries_.at(it->second);
  if (direct_conn) e.direct.insert(direct_conn);
  return View(e);
}

Result<ExportView> ExportTable::OpenGrant(uint64_t handle, const std::string& peer, uint64_t direct_conn,
                                          Clock::time_point now) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(handle);
  if (it == entries_.end() || it->second.grantee.empty()) {
    ++refused_;
    return Status::NotFound("no grant " + std::to_string(handle));
  }
  Entry& e = it->second;
  if (e.grantee != peer) {
    ++refused_;
    return Status::InvalidArgument("grant " + std::to_string(handle) + " is not for '" + peer + "'");
  }
  if (e.revoked) {
    ++refused_;
    return Status::InvalidArgument("grant " + std::to_string(handle) + " was revoked");
  }
  if (now >= e.expires) {
    ++refused_;
    return Status::DeadlineExceeded("grant " + std::to_string(handle) + ": lease over");
  }
  if (direct_conn) e.direct.insert(direct_conn);
  return View(e);
}

Result<uint8_t*> ExportTable::Begin(uint64_t handle, const std::string& peer, uint64_t offset, uint64_t length,
                                    bool write, uint64_t connection, Clock::time_point now) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(handle);
  auto refuse = [&](Status s) -> Result<uint8_t*> {
    ++refused_;
    return s;
  };
  std::string what = "handle " + std::to_string(handle);
  if (it == entries_.end()) return refuse(Status::InvalidArgument(what + ": not exported"));
  Entry& e = it->second;
  if (!e.grantee.empty() && e.grantee != peer) {
    return refuse(Status::InvalidArgument(what + ": " + e.name + ", not to '" + peer + "'"));
  }
  if (e.revoked) return refuse(Status::InvalidArgument(what + " (" + e.name + ") was revoked"));
  if (now >= e.expires) return refuse(Status::DeadlineExceeded(what + " (" + e.name + "): lease over"));
  if (write && !e.writable) return refuse(Status::InvalidArgument(what + " (" + e.name + ") is read-only"));
  if (length == 0 || offset > e.length || length > e.length - offset) {
    return refuse(Status::OutOfRange(what + " (" + e.name + "): bytes [" + std::to_string(offset) + ", +" +
                                     std::to_string(length) + ") outside its " + std::to_string(e.length)));
  }
  ++e.active[connection];
  return e.base + offset;
}

void ExportTable::End(uint64_t handle, uint64_t connection) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(handle);
  if (it == entries_.end()) return;
  auto a = it->second.active.find(connection);
  if (a == it->second.active.end()) return;
  if (--a->second <= 0) it->second.active.erase(a);
}

std::vector<uint64_t> ExportTable::DirectMappers(uint64_t handle) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(handle);
  if (it == entries_.end()) return {};
  return {it->second.direct.begin(), it->second.direct.end()};
}

void ExportTable::AckRevoke(uint64_t handle, uint64_t conn) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(handle);
  if (it != entries_.end() && it->second.revoked) it->second.direct.erase(conn);
}

void ExportTable::ConnectionGone(uint64_t conn) {
  std::lock_guard lock(mu_);
  for (auto& [h, e] : entries_) e.direct.erase(conn);
}

size_t ExportTable::live_exports() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [h, e] : entries_) n += e.revoked ? 0 : 1;
  return n;
}

uint64_t ExportTable::refused() const {
  std::lock_guard lock(mu_);
  return refused_;
}

}  // namespace strata::transfer
