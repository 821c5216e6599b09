#pragma once
// What kind of memory a KV tier is, and the one table of their names. The
// names are what operators write in `kv.tiers[].kind`, the keys of the API's
// `cached_tokens_by_tier`, and the `tier` label of the per-tier metrics; all
// of them come from TierKindName, and a name that is not in the table is an
// error where it is parsed, never mapped to some other tier.
//
// Header-only (plain constexpr values), so the server can name tiers without
// linking the KV cache.
//
// Thread-safety: constants and pure functions.

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

namespace strata::kvcache {

enum class TierKind : unsigned char {
  kDevice,  // the backend's KV pool the forward pass reads (GPU HBM, or host memory on the CPU backend)
  kHost,    // host DRAM (pinned when a CUDA device is present)
  kDisk,    // local disk (slab files, O_DIRECT)
  kRemote,  // another instance's tiers, through the transfer engine
};

inline constexpr size_t kNumTierKinds = 4;
inline constexpr std::array<TierKind, kNumTierKinds> kAllTierKinds = {TierKind::kDevice, TierKind::kHost,
                                                                      TierKind::kDisk, TierKind::kRemote};

constexpr std::string_view TierKindName(TierKind k) {
  switch (k) {
    case TierKind::kDevice:
      return "device";
    case TierKind::kHost:
      return "host";
    case TierKind::kDisk:
      return "disk";
    case TierKind::kRemote:
      return "remote";
  }
  return "device";  // unreachable: every enumerator is listed
}

// The kind named `name` exactly (lower case, as TierKindName spells it);
// nullopt for anything else.
constexpr std::optional<TierKind> ParseTierKind(std::string_view name) {
  for (TierKind k : kAllTierKinds)
    if (TierKindName(k) == name) return k;
  return std::nullopt;
}

constexpr size_t TierKindIndex(TierKind k) { return static_cast<size_t>(k); }

}  // namespace strata::kvcache
