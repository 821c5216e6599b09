#pragma once
// Architecture hyper-parameters of a Llama-family model (llama, mistral,
// qwen2), read from GGUF metadata or a Hugging Face config.json.

#include <string>
#include <vector>

#include "common/status.h"

namespace strata {

// How RoPE pairs dimensions inside a head.
enum class RopeStyle {
  kInterleaved,  // pairs (2i, 2i+1): GGUF llama/mistral (Q/K rows permuted by the converter)
  kNeox,         // pairs (i, i + d/2): Hugging Face checkpoints, GGUF qwen2
};

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  float factor = 1.0f;
  // Llama-3 style (rope_type "llama3"):
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_context = 8192;
};

struct ModelConfig {
  std::string arch = "llama";  // llama | mistral | qwen2
  std::string name;            // general.name or the directory's name
  int vocab_size = 0;
  int dim = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;  // usually dim / n_heads
  int ffn_dim = 0;
  int context_length = 0;
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeStyle rope_style = RopeStyle::kInterleaved;
  RopeScaling rope_scaling;
  bool tied_embeddings = false;  // output head shares the token embedding
  bool qkv_bias = false;         // q/k/v projections have biases (qwen2)
  // Per-frequency divisors (head_dim / 2 entries) from a GGUF rope_freqs
  // tensor (how llama.cpp stores Llama-3.1 scaling); empty when absent.
  std::vector<float> rope_freq_factors;

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  // Checks internal consistency (positive sizes, heads divide, ...).
  Status Validate() const;
};

// Per-dimension-pair inverse frequencies (head_dim / 2 entries), with the
// configured scaling applied.
void ComputeRopeInvFreq(const ModelConfig& c, float* inv_freq);

}  // namespace strata
