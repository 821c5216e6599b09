#include "kvcache/host_store.h"

#include "kvcache/clock.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "common/logging.h"

#include <xxhash.h>

namespace strata::kvcache {

namespace {

constexpr uint64_t kPageBytes = 4096;

// The three CUDA runtime entry points the host tier needs, resolved at run
// time. cudaError_t is an int enum; 0 is cudaSuccess.
struct CudaHostApi {
  using GetDeviceCountFn = int (*)(int*);
  using HostRegisterFn = int (*)(void*, size_t, unsigned int);
  using HostUnregisterFn = int (*)(void*);
  GetDeviceCountFn get_device_count = nullptr;
  HostRegisterFn host_register = nullptr;
  HostUnregisterFn host_unregister = nullptr;
  int device_count = 0;
  std::string status;  // why there is no device, when device_count == 0
};

CudaHostApi LoadCudaHostApi(const std::string& library) {
  CudaHostApi api;
  std::vector<std::string> names;
  if (!library.empty()) {
    names.push_back(library);
  } else {
    names = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"};
  }
  void* handle = nullptr;
  std::string tried;
  for (const auto& n : names) {
    // Never closed: the runtime stays loaded for the process (unregistering
    // at destruction needs it, and unloading CUDA is not safe anyway).
    handle = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) break;
    tried += (tried.empty() ? "" : ", ") + n;
  }
  if (handle == nullptr) {
    api.status = "no CUDA runtime (dlopen " + tried + " failed)";
    return api;
  }
  api.get_device_count = reinterpret_cast<CudaHostApi::GetDeviceCountFn>(dlsym(handle, "cudaGetDeviceCount"));
  api.host_register = reinterpret_cast<CudaHostApi::HostRegisterFn>(dlsym(handle, "cudaHostRegister"));
  api.host_unregister = reinterpret_cast<CudaHostApi::HostUnregisterFn>(dlsym(handle, "cudaHostUnregister"));
  if (!api.get_device_count || !api.host_register || !api.host_unregister) {
    api.status = "the CUDA runtime lacks cudaGetDeviceCount/cudaHostRegister/cudaHostUnregister";
    return api;
  }
  int count = 0;
  const int err = api.get_device_count(&count);
  if (err != 0 || count <= 0) {
    api.status = "no CUDA device (cudaGetDeviceCount error " + std::to_string(err) + ", " +
                 std::to_string(count) + " devices)";
    return api;
  }
  api.device_count = count;
  return api;
}

// The default library is looked up once per process; an explicit one
// (tests, unusual installs) on each call. Handles are never closed, so the
// function pointers stay valid.
CudaHostApi CudaHost(const std::string& library) {
  if (library.empty()) {
    static const CudaHostApi api = LoadCudaHostApi("");
    return api;
  }
  return LoadCudaHostApi(library);
}

}  // namespace

void HostStore::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

HostStore::~HostStore() {
  if (pinned_ && cuda_unregister_ != nullptr) (void)cuda_unregister_(buffer_.get());
}

void HostStore::MaybePin(const HostStoreOptions& options, uint64_t bytes) {
  if (!options.pin) {
    pin_status_ = "not pinned: turned off (kv.host_pin / --kv-host-pin false)";
    return;
  }
  const CudaHostApi api = CudaHost(options.cudart_library);
  if (api.device_count <= 0) {
    pin_status_ = "not pinned: " + api.status;
    return;
  }
  // cudaHostRegisterPortable (1): pinned for every CUDA context.
  const int err = api.host_register(buffer_.get(), bytes, 1u);
  if (err != 0) {
    pin_status_ = "not pinned: cudaHostRegister of " + std::to_string(bytes) + " bytes failed (error " +
                  std::to_string(err) + ")";
    return;
  }
  pinned_ = true;
  cuda_unregister_ = api.host_unregister;
  pin_status_ = "pinned (cudaHostRegister, " + std::to_string(api.device_count) + " CUDA devices)";
}

Result<std::unique_ptr<HostStore>> HostStore::Create(const HostStoreOptions& options) {
  if (options.block_bytes == 0) return Status::InvalidArgument("host store: block_bytes must be > 0");
  const uint64_t slots = options.capacity_bytes / options.block_bytes;
  if (slots > static_cast<uint64_t>(INT32_MAX))
    return Status::InvalidArgument("host store: too many slots (" + std::to_string(slots) + ")");
  auto policy = MakeEvictionPolicy(options.eviction_policy, static_cast<int32_t>(slots));
  if (!policy.ok()) return policy.error().WithContext("host store");
  std::unique_ptr<HostStore> s(new HostStore(options, static_cast<int32_t>(slots), std::move(policy).value()));
  if (!options.metadata_only && slots > 0) {
    const uint64_t bytes = slots * options.block_bytes;
    // Page-aligned (and a whole number of pages) so that registering it
    // with CUDA pins exactly the arena.
    const uint64_t alloc = (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
    s->buffer_.reset(static_cast<uint8_t*>(std::aligned_alloc(kPageBytes, alloc)));
    if (!s->buffer_) return Status::ResourceExhausted("host store: cannot allocate " + std::to_string(bytes) + " bytes");
    s->MaybePin(options, alloc);
    STRATA_LOG_INFO("host KV tier: {} slots of {} bytes, {}", slots, options.block_bytes, s->pin_status_);
  }
  return s;
}

HostStore::HostStore(const HostStoreOptions& options, int32_t slots, std::unique_ptr<EvictionPolicy> policy)
    : block_bytes_(options.block_bytes),
      metadata_only_(options.metadata_only),
      slot_hash_(static_cast<size_t>(slots)),
      slot_ns_(static_cast<size_t>(slots)),
      slot_used_(static_cast<size_t>(slots), false),
      slot_sum_(static_cast<size_t>(slots), 0),
      slot_pins_(static_cast<size_t>(slots), 0),
      slot_dropped_(static_cast<size_t>(slots), false),
      policy_(std::move(policy)) {
  free_slots_.reserve(static_cast<size_t>(slots));
  for (int32_t i = slots - 1; i >= 0; --i) free_slots_.push_back(i);
  index_.reserve(static_cast<size_t>(slots));
}

Status HostStore::RegisterMemory() {
  if (metadata_only_ || !buffer_ || num_slots() == 0) return Status::Ok();
  STRATA_ASSIGN_OR_RETURN(segment_, Own(pinned_ ? SegmentKind::kPinnedHost : SegmentKind::kHost, buffer_.get(),
                                        static_cast<uint64_t>(num_slots()) * block_bytes_, "host tier"));
  return Status::Ok();
}

StoreStats HostStore::stats() const {
  StoreStats s;
  s.capacity_bytes = static_cast<uint64_t>(num_slots()) * block_bytes_;
  s.blocks = index_.size();
  s.used_bytes = s.blocks * block_bytes_;
  s.evictions = evictions_;
  s.eviction_policy = std::string(policy_->name());
  s.policy = policy_->stats();
  return s;
}

bool HostStore::Contains(const BlockHash& h) const { return index_.contains(h); }

size_t HostStore::CountPrefix(std::span<const BlockHash> chain) const {
  size_t n = 0;
  while (n < chain.size() && index_.contains(chain[n])) ++n;
  return n;
}

void HostStore::FreeSlot(int32_t slot, bool evicted) {
  const size_t u = static_cast<size_t>(slot);
  NotifyChanged(slot_hash_[u], false);
  index_.erase(slot_hash_[u]);
  policy_->Erase(slot, evicted);
  if (slot_pins_[u] > 0) {
    slot_dropped_[u] = true;  // a peer may be reading it: freed at the last Unpin
    return;
  }
  slot_used_[u] = false;
  free_slots_.push_back(slot);
}

std::vector<BlockHash> HostStore::HeldBlocks() const {
  std::vector<BlockHash> out;
  out.reserve(index_.size());
  for (const auto& [h, slot] : index_) out.push_back(h);
  return out;
}

std::vector<BlockHash> HostStore::HeldInEvictionOrder() const {
  std::vector<BlockHash> out;
  out.reserve(index_.size());
  for (int32_t slot : policy_->Order()) out.push_back(slot_hash_[static_cast<size_t>(slot)]);
  for (const auto& [h, slot] : index_)
    if (!policy_->evictable(slot)) out.push_back(h);
  return out;
}

std::optional<BlockStore::BlockLocation> HostStore::Locate(const BlockHash& h) const {
  if (metadata_only_ || !IsValid(segment_)) return std::nullopt;
  auto it = index_.find(h);
  if (it == index_.end()) return std::nullopt;
  const size_t u = static_cast<size_t>(it->second);
  return BlockLocation{Region{segment_, u * block_bytes_, block_bytes_}, slot_sum_[u]};
}

void HostStore::KeepFor(const BlockHash& h, int64_t nanos) {
  const int64_t until_nanos = RealClock()->NowNanos() + nanos;
  auto it = index_.find(h);
  if (it != index_.end()) policy_->KeepUntil(it->second, until_nanos);
}

bool HostStore::Pin(const BlockHash& h) {
  auto it = index_.find(h);
  if (it == index_.end()) return false;
  const int32_t slot = it->second;
  auto [p, inserted] = pinned_hashes_.emplace(h, slot);
  if (!inserted && p->second != slot) return false;  // an older copy of h, dropped while pinned, is still read
  const size_t u = static_cast<size_t>(slot);
  if (slot_pins_[u]++ == 0) policy_->SetEvictable(slot, false);
  return true;
}

void HostStore::Unpin(const BlockHash& h) {
  auto it = pinned_hashes_.find(h);
  if (it == pinned_hashes_.end()) return;
  const int32_t slot = it->second;
  const size_t u = static_cast<size_t>(slot);
  if (--slot_pins_[u] > 0) return;
  pinned_hashes_.erase(it);
  if (slot_dropped_[u]) {
    slot_dropped_[u] = false;
    slot_used_[u] = false;
    free_slots_.push_back(slot);
  } else {
    policy_->SetEvictable(slot, true);
  }
}

Status HostStore::ReplaceEvictionPolicy(const PolicyFactory& make) {
  if (!index_.empty() || !pinned_hashes_.empty())
    return Status::Unsupported("host tier: its eviction policy can be replaced only while it is empty");
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<EvictionPolicy> p, make(num_slots(), policy_->name()));
  policy_ = std::move(p);
  return Status::Ok();
}

Status HostStore::SubmitWrite(const BlockHash& h, const Sha256Digest& ns, const Region& src, uint64_t tag) {
  STRATA_ASSIGN_OR_RETURN(std::span<uint8_t> data, HostBytes(src, block_bytes_, metadata_only_));
  if (auto it = index_.find(h); it != index_.end()) {
    policy_->Access(it->second);
    done_.push_back({tag, Status::Ok()});
    return Status::Ok();
  }
  BlockTraits traits;
  traits.key = BlockHashHasher{}(h);
  if (!policy_->Admit(traits)) {
    done_.push_back({tag, Status::ResourceExhausted("host store: the eviction policy did not admit the block"), true});
    return Status::Ok();
  }
  if (free_slots_.empty()) {
    policy_->SetNow(RealClock()->NowNanos());  // for blocks kept by cache_ttl_seconds
    const int32_t victim = policy_->Victim();
    if (victim < 0) {  // every slot is being read: no room now, nothing failed
      done_.push_back({tag, Status::ResourceExhausted("host store: every slot is busy with reads"), true});
      return Status::Ok();
    }
    if (eviction_listener_) {
      const Region bytes = metadata_only_ ? Region{}
                                          : Region{segment_, static_cast<uint64_t>(victim) * block_bytes_, block_bytes_};
      eviction_listener_(slot_hash_[static_cast<size_t>(victim)], bytes);
    }
    FreeSlot(victim, /*evicted=*/true);
    ++evictions_;
  }
  const int32_t slot = free_slots_.back();
  free_slots_.pop_back();
  const size_t u = static_cast<size_t>(slot);
  if (!metadata_only_) {
    std::memcpy(slot_data(slot), data.data(), block_bytes_);
    slot_sum_[u] = XXH3_64bits(slot_data(slot), block_bytes_);
  }
  slot_hash_[u] = h;
  slot_ns_[u] = ns;
  slot_used_[u] = true;
  policy_->Insert(slot, traits, /*evictable=*/true);
  index_.emplace(h, slot);
  NotifyChanged(h, true);
  done_.push_back({tag, Status::Ok()});
  return Status::Ok();
}

Status HostStore::SubmitRead(const BlockHash& h, const Region& dst_region, uint64_t tag) {
  STRATA_ASSIGN_OR_RETURN(std::span<uint8_t> dst, HostBytes(dst_region, block_bytes_, metadata_only_));
  auto it = index_.find(h);
  if (it == index_.end()) {
    done_.push_back({tag, Status::NotFound("block not in host store")});
    return Status::Ok();
  }
  policy_->Access(it->second);
  if (!metadata_only_) std::memcpy(dst.data(), slot_data(it->second), block_bytes_);
  done_.push_back({tag, Status::Ok()});
  return Status::Ok();
}

size_t HostStore::Poll(std::vector<StoreCompletion>* out) {
  const size_t n = done_.size();
  for (auto& c : done_) out->push_back(std::move(c));
  done_.clear();
  return n;
}

void HostStore::Drain(std::vector<StoreCompletion>* out) { (void)Poll(out); }

Status HostStore::Remove(const BlockHash& h) {
  auto it = index_.find(h);
  if (it == index_.end()) return Status::NotFound("block not in host store");
  FreeSlot(it->second, /*evicted=*/false);
  return Status::Ok();
}

Status HostStore::Flush(const Sha256Digest* ns) {
  for (int32_t i = 0; i < num_slots(); ++i) {
    const size_t u = static_cast<size_t>(i);
    if (slot_used_[u] && !slot_dropped_[u] && (ns == nullptr || slot_ns_[u] == *ns)) FreeSlot(i, /*evicted=*/false);
  }
  return Status::Ok();
}

}  // namespace strata::kvcache
