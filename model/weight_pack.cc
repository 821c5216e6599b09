#include "model/weight_pack.h"

#include <cstdint>
#include <utility>

#include "model/backend/cpu/matmul.h"
#include "model/backend/cpu/matmul_q8.h"

namespace strata {

bool WantsLanePack(const Tensor& t) {
  using namespace cpu::internal;
  return t.present() && LanePackable(t.type) && t.rows() >= kLaneRows && ActiveQ8Kernels().reads_lanes &&
         cpu::UsesInt8Activations(t.type, cpu::GetActivationMode());
}

int PackWeightsForInt8(ModelWeights* w, const std::vector<const MappedFile*>& mapped) {
  int packed = 0;
  auto pack = [&](Tensor* t) {
    if (!WantsLanePack(*t) || t->lanes != nullptr) return;
    const size_t n = cpu::internal::LanePackedBytes(*t);
    std::vector<uint8_t> buf(n + 64);
    uint8_t* out = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
    cpu::internal::PackLanes(*t, out);
    w->Own(std::move(buf));
    t->lanes = out;
    for (const MappedFile* m : mapped) {
      if (m != nullptr && m->Contains(t->data, n)) m->DropPages(t->data, n);
    }
    ++packed;
  };
  for (LayerWeights& l : w->layers) {
    for (const LayerTensorInfo& info : kLayerTensors) {
      if (info.kind == LayerTensorInfo::Kind::kMatrix) pack(&(l.*info.member));
    }
  }
  pack(&w->output);
  return packed;
}

}  // namespace strata
