#include "model/tokenizer/spm.h"

#include <queue>

#include "model/tokenizer/unicode.h"

namespace strata::tokenizer_internal {

void SpmModel::Encode(std::string_view text, std::vector<Symbol>* out) const {
  struct Node {
    uint32_t begin, end;
    int prev, next;
    bool alive;
  };
  std::vector<Node> nodes;
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = Utf8CharLen(text, pos);
    const int i = static_cast<int>(nodes.size());
    nodes.push_back(
        {static_cast<uint32_t>(pos), static_cast<uint32_t>(pos + len), i - 1, i + 1, true});
    pos += len;
  }
  if (nodes.empty()) return;
  nodes.back().next = -1;

  struct Bigram {
    float score;
    int left;
    uint32_t size;
    int32_t id;
    // Highest score first, then leftmost.
    bool operator<(const Bigram& o) const {
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::priority_queue<Bigram> queue;
  auto try_add = [&](int l) {
    if (l < 0 || nodes[l].next < 0) return;
    const int r = nodes[l].next;
    const std::string_view joined = text.substr(nodes[l].begin, nodes[r].end - nodes[l].begin);
    const int32_t id = vocab_.Find(joined);
    if (id < 0) return;
    // SentencePiece merges only into ordinary pieces.
    const int32_t type = vocab_.type(id);
    if (type != kTokenTypeNormal && type != kTokenTypeUserDefined) return;
    queue.push({scores_[id], l, static_cast<uint32_t>(joined.size()), id});
  };
  for (int i = 0; i + 1 < static_cast<int>(nodes.size()); ++i) try_add(i);

  std::vector<int32_t> ids(nodes.size(), -2);  // -2: look up at the end
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Node& left = nodes[b.left];
    if (!left.alive || left.next < 0) continue;
    Node& right = nodes[left.next];
    // Stale when either side has grown since the bigram was queued.
    if (right.end - left.begin != b.size) continue;
    left.end = right.end;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) nodes[left.next].prev = b.left;
    ids[b.left] = b.id;
    try_add(left.prev);
    try_add(b.left);
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!nodes[i].alive) continue;
    int32_t id = ids[i];
    if (id == -2) id = vocab_.Find(text.substr(nodes[i].begin, nodes[i].end - nodes[i].begin));
    out->push_back({id, nodes[i].begin, nodes[i].end});
  }
}

}  // namespace strata::tokenizer_internal
