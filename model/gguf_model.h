#pragma once
// Mapping between GGUF files and Strata's model structures: architecture
// metadata (llama, mistral, qwen2) to ModelConfig, tensors to ModelWeights,
// and back (for `strata model synth`).

#include <memory>
#include <string>

#include "common/status.h"
#include "model/gguf.h"
#include "model/weights.h"

namespace strata {

// Reads `{arch}.*` metadata into a ModelConfig (validated).
Result<ModelConfig> ModelConfigFromGguf(const GgufFile& f);

// Builds ModelWeights whose tensors point into `f` (no copies); the weights
// keep `f` alive. Checks every tensor's presence, shape and type, and computes
// the digest.
Result<ModelWeights> WeightsFromGguf(std::shared_ptr<const GgufFile> f);

// GGUF tensor names for layer `i`.
std::string GgufLayerTensorName(int layer, const char* what);

}  // namespace strata
