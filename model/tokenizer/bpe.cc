#include "model/tokenizer/bpe.h"

#include <queue>

namespace strata::tokenizer_internal {

Result<std::unique_ptr<BpeModel>> BpeModel::Create(const std::vector<std::string>& merges,
                                                   const Vocab& vocab) {
  auto model = std::unique_ptr<BpeModel>(new BpeModel());
  model->rules_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    const size_t space = m.find(' ');
    auto bad = [&](const std::string& why) {
      return Status::InvalidArgument("merge " + std::to_string(i) + " '" + m + "': " + why);
    };
    if (space == std::string::npos || space == 0 || space + 1 >= m.size()) {
      return bad("not of the form 'a b'");
    }
    const std::string_view left(m.data(), space);
    const std::string_view right(m.data() + space + 1, m.size() - space - 1);
    const int32_t a = vocab.Find(left);
    const int32_t b = vocab.Find(right);
    if (a < 0) return bad("'" + std::string(left) + "' is not in the vocabulary");
    if (b < 0) return bad("'" + std::string(right) + "' is not in the vocabulary");
    std::string joined;
    joined.reserve(left.size() + right.size());
    joined.append(left).append(right);
    const int32_t ab = vocab.Find(joined);
    if (ab < 0) return bad("the merged piece '" + joined + "' is not in the vocabulary");
    // A repeated rule keeps its first (highest-priority) rank.
    model->rules_.try_emplace(Key(a, b), Rule{static_cast<int32_t>(i), ab});
  }
  return model;
}

void BpeModel::Merge(std::vector<Symbol>* symbols) const {
  const int n = static_cast<int>(symbols->size());
  if (n < 2) return;
  struct Node {
    int prev, next;
    bool alive;
  };
  std::vector<Node> nodes(n);
  for (int i = 0; i < n; ++i) nodes[i] = {i - 1, i + 1 < n ? i + 1 : -1, true};
  struct Candidate {
    int32_t rank;
    int left;
    int32_t left_id, right_id, merged;
    // Lowest rank first, then leftmost.
    bool operator<(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate> queue;
  auto& syms = *symbols;
  auto try_add = [&](int l) {
    const int r = nodes[l].next;
    if (r < 0 || syms[l].id < 0 || syms[r].id < 0) return;
    const auto it = rules_.find(Key(syms[l].id, syms[r].id));
    if (it == rules_.end()) return;
    queue.push({it->second.rank, l, syms[l].id, syms[r].id, it->second.merged});
  };
  for (int i = 0; i + 1 < n; ++i) try_add(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Node& left = nodes[c.left];
    // Stale entries: a side has merged since (ids changed) or died.
    if (!left.alive || left.next < 0 || syms[c.left].id != c.left_id) continue;
    const int r = left.next;
    if (syms[r].id != c.right_id) continue;
    syms[c.left].id = c.merged;
    syms[c.left].end = syms[r].end;
    nodes[r].alive = false;
    left.next = nodes[r].next;
    if (left.next >= 0) nodes[left.next].prev = c.left;
    if (left.prev >= 0) try_add(left.prev);
    try_add(c.left);
  }
  size_t w = 0;
  for (int i = 0; i < n; ++i) {
    if (nodes[i].alive) syms[w++] = syms[i];
  }
  syms.resize(w);
}

}  // namespace strata::tokenizer_internal
