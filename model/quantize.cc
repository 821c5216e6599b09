#include "model/quantize.h"

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "model/gguf_export.h"
#include "model/synth.h"

namespace strata {

namespace {

bool IsMatrix(const Tensor& t) { return t.ne.size() >= 2; }

// llama-quantize's "use more bits" layers for Q4_K_M's attn_v and ffn_down.
bool UseMoreBits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// What llama.cpp calls a 70B model (LLM_TYPE_70B, llama-model.cpp): 80
// layers, with grouped KV heads under llama (without them it is "65B"), any
// qwen2 of 80 layers. Its attn_v is 1/8 of attn_q: llama-quantize spends
// more bits on it.
bool Is70B(const ModelConfig& c) {
  if (c.n_layers != 80) return false;
  return c.arch == "qwen2" || c.n_heads != c.n_kv_heads;
}

// The type the q4_k_m recipe gives matrix `name` of layer `layer` (-1 for
// tensors outside the layers) in a model shaped `c`.
DType Q4KMType(const std::string& name, int layer, const ModelConfig& c) {
  const bool output = name == "output.weight" || (c.tied_embeddings && name == "token_embd.weight");
  if (output) return DType::kQ6_K;
  const bool more = layer >= 0 && UseMoreBits(layer, c.n_layers);
  if (name.ends_with("attn_v.weight")) return more ? DType::kQ6_K : Is70B(c) ? DType::kQ5_K : DType::kQ4_K;
  if (name.ends_with("ffn_down.weight") && more) return DType::kQ6_K;
  return DType::kQ4_K;
}

int LayerOf(const std::string& name) {
  if (!name.starts_with("blk.")) return -1;
  return std::atoi(name.c_str() + 4);
}

}  // namespace

std::vector<std::string> QuantizeRecipeNames() {
  return {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q4_k_m"};
}

std::map<std::string, int> QuantizePlan::Census() const {
  std::map<std::string, int> c;
  for (const auto& t : tensors) c[std::string(DTypeName(t.to))] += 1;
  return c;
}

Result<QuantizePlan> PlanQuantization(const ModelWeights& w, const std::string& recipe, bool allow_requantize) {
  const bool mix = recipe == "q4_k_m";
  std::optional<DType> pure;
  if (!mix) {
    bool known = false;
    for (const auto& n : QuantizeRecipeNames()) known |= n == recipe;
    if (known) pure = DTypeFromName(recipe);
    if (!pure) {
      std::string names;
      for (const auto& n : QuantizeRecipeNames()) names += (names.empty() ? "" : ", ") + n;
      return Status::InvalidArgument("unknown quantization type '" + recipe + "' (one of " + names + ")");
    }
  }
  QuantizePlan plan;
  plan.recipe = recipe;
  Status st;
  ForEachWeightTensor(w, [&](const std::string& name, const Tensor& t) {
    if (!st.ok()) return;
    TensorQuantPlan p{name, t.ne, t.type, t.type, false};
    if (IsMatrix(t)) {
      const DType want = mix ? Q4KMType(name, LayerOf(name), w.config) : *pure;
      p.to = SynthTensorType(want, t.cols());
      p.fallback = p.to != want;
      // Decoding to f32/f16/bf16 loses nothing (f16/bf16 round once); quantizing again does.
      if (p.to != t.type && IsQuantized(t.type) && IsQuantized(p.to) && !allow_requantize) {
        st = Status::InvalidArgument("tensor " + name + " is already " + std::string(DTypeName(t.type)) +
                                     "; quantizing it again loses precision (pass --allow-requantize to do it "
                                     "anyway, or start from an f32, f16 or bf16 model)");
        return;
      }
    }
    plan.tensors.push_back(std::move(p));
  });
  STRATA_RETURN_IF_ERROR(st);
  return plan;
}

Status WriteQuantizedGguf(const ModelWeights& w, const TokenizerSpec& tok, const QuantizePlan& plan, bool synthetic,
                          int threads, const std::string& path) {
  GgufExportOptions opt;
  for (const auto& t : plan.tensors)
    if (t.to != t.from) opt.types[t.name] = t.to;
  opt.synthetic = synthetic;
  opt.fit = plan.fit;
  opt.threads = std::max(1, threads);
  return WriteModelGguf(w, tok, path, opt);
}

}  // namespace strata
