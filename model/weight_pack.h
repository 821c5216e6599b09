#pragma once
// Weights repacked at load for the CPU's products. For int8 ones: Q4_0, Q8_0
// and K-quant (Q4_K, Q5_K, Q6_K) matrices get a second copy of their rows in
// the layout of the 16-row lane kernels (cpu::internal::PackLanes;
// Tensor::lanes), so those kernels no longer transpose each block of 16 rows
// on every call (what cost the Q8_0/Q4_0 one 10-15% against f32 activations
// at batch 1: docs/PERFORMANCE.md; the Q4_K and Q5_K copies are 2.8% and
// 2.3% larger than the file's rows, their scales unpacked). The file's layout stays
// valid and is what every other path reads; the packed copy gives the same
// bits. For f32-activation ones: matrices whose rows are too wide for x to
// stay in L1 get their rows split into column panels (Tensor::panels,
// cpu::DecodePanelCols), which every MatMul path then reads.
//
// Thread: the loading thread, before any forward pass uses the weights.

#include <vector>

#include "common/mapped_file.h"
#include "model/weights.h"

namespace strata {

// Whether PackWeightsForInt8 packs t: a Q4_0, Q8_0 or K-quant matrix of at least 16
// rows that MatMul, at the active SIMD level and activation mode
// (cpu::GetActivationMode), multiplies through a kernel that reads lanes.
bool WantsLanePack(const Tensor& t);

// Packs each layer's matrices and the output matrix of `w` that
// WantsLanePack, into storage `w` owns (64-byte aligned), and drops the
// packed tensors' original pages from the process where they lie in one of
// `mapped` (so resident memory stays about the file's size; what reads the
// original later faults it back in). Returns how many tensors were packed.
int PackWeightsForInt8(ModelWeights* w, const std::vector<const MappedFile*>& mapped);

// Whether PackWeightPanels splits t into column panels: a matrix MatMul
// multiplies with f32 activations (at the active activation mode) whose
// rows cpu::DecodePanelCols says to split, and not lane-packed.
bool WantsPanels(const Tensor& t);

// Gives each layer matrix and the output matrix of `w` that WantsPanels a
// column-panel copy (Tensor::panels, cpu::PackPanels) in storage `w` owns,
// and drops the originals' pages as PackWeightsForInt8 does (every MatMul
// path reads the panels). Returns how many tensors were split.
int PackWeightPanels(ModelWeights* w, const std::vector<const MappedFile*>& mapped);

}  // namespace strata
