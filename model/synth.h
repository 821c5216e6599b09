#pragma once
// Synthetic models: random weights with the exact shapes of real ones, for
// tests, benchmarks and the zero-download quick start. Every tensor is a pure
// function of (seed, tensor name, shape, type), so a model can be streamed to
// a file tensor by tensor without holding it in memory, or built in memory
// for a test, with identical bytes.

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/backend/dtype.h"
#include "model/model_config.h"
#include "model/weights.h"

namespace strata {

struct SynthOptions {
  DType dtype = DType::kF32;  // matrices; norms stay f32
  uint64_t seed = 1;
  // Standard deviation of matrix entries; 0 = 1/sqrt(fan_in) (keeps
  // activations O(1), so logits have realistic margins).
  float init_std = 0.0f;
};

// Names: "tiny" (tests and the default model), "bench-110m", "bench-1b".
// `vocab_size` <= 0 keeps the preset's (tiny: 512, others: 32000).
Result<ModelConfig> SynthPresetConfig(const std::string& preset, int vocab_size);
std::vector<std::string> SynthPresetNames();

// The type a matrix with rows of `cols` elements gets when `want` is asked:
// K-quants need cols % 256 == 0 and 32-blocks cols % 32 == 0; otherwise it
// falls back (K-quant → q8_0 → f16) as llama.cpp's quantizer does.
DType SynthTensorType(DType want, int64_t cols);

// The bytes of one synthetic tensor (ne[0] innermost) stored as `type`.
// `kind` picks the distribution: 'w' matrix (N(0, std)), 'n' norm (1 + 0.1 N),
// 'b' bias (N(0, 0.1)), 'e' embedding (N(0, 1)).
std::vector<uint8_t> SynthTensorBytes(const std::string& name, char kind, const std::vector<int64_t>& ne,
                                      DType type, const SynthOptions& opt);

// A whole model in memory (tensors owned by the returned weights), named as
// GGUF names them. Digest computed.
Result<ModelWeights> MakeSyntheticWeights(const ModelConfig& c, const SynthOptions& opt);

// Calls fn(name, kind, ne) for every tensor of the architecture in GGUF
// naming and order.
template <typename Fn>
void ForEachModelTensor(const ModelConfig& c, Fn&& fn);

}  // namespace strata

#include "model/synth_inl.h"
