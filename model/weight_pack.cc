#include "model/weight_pack.h"

#include <cstdint>
#include <utility>

#include "model/backend/cpu/matmul.h"
#include "model/backend/cpu/matmul_q8.h"

namespace strata {

bool WantsLanePack(const Tensor& t) {
  using namespace cpu::internal;
  return t.present() && LanePackable(t.type) && t.rows() >= kLaneRows && ReadsLanes(ActiveQ8Kernels(), t.type) &&
         cpu::UsesIntegerActivations(t.type, cpu::GetActivationMode());
}

namespace {

// Calls fn on each layer matrix and the output matrix of w.
template <class Fn>
void ForEachMatrix(ModelWeights* w, Fn&& fn) {
  for (LayerWeights& l : w->layers) {
    for (const LayerTensorInfo& info : kLayerTensors) {
      if (info.kind == LayerTensorInfo::Kind::kMatrix) fn(&(l.*info.member));
    }
  }
  fn(&w->output);
}

// Owned by w, 64-byte aligned.
uint8_t* AlignedBuffer(ModelWeights* w, size_t n) {
  std::vector<uint8_t> buf(n + 64);
  uint8_t* out = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
  w->Own(std::move(buf));
  return out;
}

void DropOriginal(const Tensor& t, size_t n, const std::vector<const MappedFile*>& mapped) {
  for (const MappedFile* m : mapped) {
    if (m != nullptr && m->Contains(t.data, n)) m->DropPages(t.data, n);
  }
}

}  // namespace

int PackWeightsForInt8(ModelWeights* w, const std::vector<const MappedFile*>& mapped) {
  int packed = 0;
  ForEachMatrix(w, [&](Tensor* t) {
    if (!WantsLanePack(*t) || t->lanes != nullptr) return;
    const size_t n = cpu::internal::LanePackedBytes(*t);
    uint8_t* out = AlignedBuffer(w, n);
    cpu::internal::PackLanes(*t, out);
    t->lanes = out;
    // The file's bytes of the packed rows (the Q4_K/Q5_K copies are larger).
    const int64_t rows = t->rows() / cpu::internal::kLaneRows * cpu::internal::kLaneRows;
    DropOriginal(*t, static_cast<size_t>(rows) * RowBytes(t->type, t->cols()), mapped);
    ++packed;
  });
  return packed;
}

bool WantsPanels(const Tensor& t) {
  return t.present() && t.lanes == nullptr && t.rows() > 1 &&
         !cpu::UsesIntegerActivations(t.type, cpu::GetActivationMode()) && cpu::DecodePanelCols(t.type, t.cols()) > 0;
}

int PackWeightPanels(ModelWeights* w, const std::vector<const MappedFile*>& mapped) {
  int packed = 0;
  ForEachMatrix(w, [&](Tensor* t) {
    if (!WantsPanels(*t) || t->panels != nullptr) return;
    const int64_t pc = cpu::DecodePanelCols(t->type, t->cols());
    const size_t n = cpu::PanelPackedBytes(*t, pc);
    uint8_t* out = AlignedBuffer(w, n);
    cpu::PackPanels(*t, pc, out);
    t->panels = out;
    t->panel_cols = pc;
    DropOriginal(*t, n, mapped);
    ++packed;
  });
  return packed;
}

}  // namespace strata
