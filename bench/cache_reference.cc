#include "bench/cache_reference.h"

#include <limits>
#include <list>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

namespace strata::bench {

std::vector<std::vector<uint64_t>> ChainUnits(const std::vector<TraceRequest>& trace) {
  std::map<std::pair<uint64_t, int64_t>, uint64_t> children;  // (parent, id) → node; node 0 = empty prefix
  uint64_t next = 1;
  std::vector<std::vector<uint64_t>> out;
  out.reserve(trace.size());
  for (const TraceRequest& r : trace) {
    std::vector<uint64_t> chain;
    chain.reserve(r.hash_ids.size());
    uint64_t node = 0;
    for (int64_t id : r.hash_ids) {
      auto [it, inserted] = children.try_emplace({node, id}, next);
      if (inserted) ++next;
      node = it->second;
      chain.push_back(node);
    }
    out.push_back(std::move(chain));
  }
  return out;
}

namespace {
// Leading units of `chain` for which `cached` is true.
template <typename Pred>
uint64_t Served(const std::vector<uint64_t>& chain, Pred cached) {
  uint64_t n = 0;
  while (n < chain.size() && cached(chain[n])) ++n;
  return n;
}
}  // namespace

ReferenceHits LruReference(const std::vector<std::vector<uint64_t>>& chains, uint64_t capacity) {
  ReferenceHits h;
  std::list<uint64_t> lru;  // front = least recently used
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where;
  for (const auto& chain : chains) {
    h.total_ids += chain.size();
    h.hit_ids += Served(chain, [&](uint64_t u) { return where.count(u) != 0; });
    if (capacity == 0) continue;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {  // tail first: the head ends most recent
      auto w = where.find(*it);
      if (w != where.end()) {
        lru.splice(lru.end(), lru, w->second);
        continue;
      }
      lru.push_back(*it);
      where[*it] = std::prev(lru.end());
      if (lru.size() > capacity) {
        where.erase(lru.front());
        lru.pop_front();
      }
    }
  }
  return h;
}

ReferenceHits BeladyReference(const std::vector<std::vector<uint64_t>>& chains, uint64_t capacity) {
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  // Positions of the flattened access sequence, and each one's next use.
  std::vector<uint64_t> seq;
  for (const auto& c : chains) seq.insert(seq.end(), c.begin(), c.end());
  std::vector<uint64_t> next_use(seq.size(), kNever);
  std::unordered_map<uint64_t, uint64_t> later;
  for (size_t p = seq.size(); p-- > 0;) {
    auto it = later.find(seq[p]);
    if (it != later.end()) next_use[p] = it->second;
    later[seq[p]] = p;
  }
  ReferenceHits h;
  std::unordered_map<uint64_t, uint64_t> cached;  // unit → its next use
  std::set<std::pair<uint64_t, uint64_t>> by_next;  // (next use, unit), farthest last
  uint64_t pos = 0;
  for (const auto& chain : chains) {
    h.total_ids += chain.size();
    h.hit_ids += Served(chain, [&](uint64_t u) { return cached.count(u) != 0; });
    for (uint64_t u : chain) {
      const uint64_t nu = next_use[pos++];
      auto c = cached.find(u);
      if (c != cached.end()) {
        by_next.erase({c->second, u});
        if (nu == kNever) {
          cached.erase(c);  // never used again: free its place
        } else {
          c->second = nu;
          by_next.insert({nu, u});
        }
        continue;
      }
      if (capacity == 0 || nu == kNever) continue;  // bypass
      if (cached.size() >= capacity) {
        auto far = std::prev(by_next.end());
        if (far->first <= nu) continue;  // everything cached is needed sooner: bypass
        cached.erase(far->second);
        by_next.erase(far);
      }
      cached[u] = nu;
      by_next.insert({nu, u});
    }
  }
  return h;
}

}  // namespace strata::bench
