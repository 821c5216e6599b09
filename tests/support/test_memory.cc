#include "tests/support/test_memory.h"

#include <cstdint>
#include <map>
#include <vector>

namespace strata::testing {

namespace {

// What RegionOf registered, per table: base address -> (end, id).
struct Registered {
  uintptr_t end;
  SegmentId id;
};
std::map<uintptr_t, Registered>& Known(SegmentTable* table) {
  static auto* known = new std::map<SegmentTable*, std::map<uintptr_t, Registered>>();
  return (*known)[table];
}

}  // namespace

SegmentTable& TestSegments() {
  static auto* table = new SegmentTable();
  return *table;
}

Region RegionOf(std::span<const uint8_t> bytes, SegmentTable* table) {
  if (table == nullptr) table = &TestSegments();
  auto* p = const_cast<uint8_t*>(bytes.data());
  const auto b = reinterpret_cast<uintptr_t>(p);
  const uintptr_t e = b + bytes.size();
  auto& known = Known(table);
  // An exact earlier registration of this buffer (or a stale one at the same
  // place and size, which names the same bytes) is reused.
  if (auto it = known.find(b); it != known.end() && it->second.end == e) {
    const auto seg = table->Get(it->second.id);  // (a new table at a dead one's address lacks it)
    if (seg && seg->base == p && seg->size == bytes.size()) return Region{it->second.id, 0, bytes.size()};
  }
  for (auto it = known.begin(); it != known.end();) {
    if (it->first < e && b < it->second.end) {
      // Only if the id still names that range (a new table at a dead one's
      // address may have given the id to other memory).
      const auto seg = table->Get(it->second.id);
      if (seg && reinterpret_cast<uintptr_t>(seg->base) == it->first &&
          reinterpret_cast<uintptr_t>(seg->base) + seg->size == it->second.end)
        (void)table->Unregister(it->second.id);
      it = known.erase(it);
    } else {
      ++it;
    }
  }
  auto id = table->Register(SegmentKind::kHost, p, bytes.size(), "test buffer");
  if (!id.ok()) {  // a store's own memory holds it: name it there
    auto r = table->Locate(p, bytes.size());
    if (!r.ok()) __builtin_trap();
    return *r;
  }
  known[b] = Registered{e, *id};
  return Region{*id, 0, bytes.size()};
}

void AttachToTestSegments(kvcache::BlockStore* store) {
  if (store->Attach(&TestSegments()).ok()) return;
  auto& known = Known(&TestSegments());  // (TestSegments is never destroyed: its ids are its own)
  for (const auto& [base, r] : known) (void)TestSegments().Unregister(r.id);
  known.clear();
  if (!store->Attach(&TestSegments()).ok()) __builtin_trap();
}

Status StoreBlock(kvcache::BlockStore* store, const BlockHash& h, const Sha256Digest& ns,
                  std::span<const uint8_t> bytes) {
  const bool attach = store->segments() == nullptr;
  if (attach) AttachToTestSegments(store);
  Status s = store->SubmitWrite(h, ns, bytes.empty() ? Region{} : RegionOf(bytes, store->segments()), 0);
  std::vector<kvcache::StoreCompletion> done;
  store->Drain(&done);
  if (s.ok()) {
    for (const auto& c : done)
      if (!c.status.ok()) s = c.status;
  }
  if (attach) store->Detach();
  return s;
}

}  // namespace strata::testing
