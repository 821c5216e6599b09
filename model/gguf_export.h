#pragma once
// Writing models as standard GGUF files that other GGUF readers load.

#include <string>

#include "common/status.h"
#include "model/synth.h"
#include "model/tokenizer/tokenizer_spec.h"
#include "model/weights.h"

namespace strata {

// Writes `w` (any supported tensor types) with `tok` as its tokenizer.
Status WriteModelGguf(const ModelWeights& w, const TokenizerSpec& tok, const std::string& path);

// Writes a synthetic model tensor by tensor (generated while writing, so a
// multi-GB model never sits in memory). The file says it is synthetic:
// general.name ends in "-random-weights" and key strata.synthetic = true.
Status WriteSyntheticGguf(const ModelConfig& c, const TokenizerSpec& tok, const SynthOptions& opt,
                          const std::string& path);

}  // namespace strata
