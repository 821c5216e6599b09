#include "model/model_config.h"

#include <cmath>
#include <string>

namespace strata {

Status ModelConfig::Validate() const {
  auto bad = [&](const std::string& what) {
    return Status::Corrupt("model config (" + arch + "): " + what);
  };
  if (arch != "llama" && arch != "mistral" && arch != "qwen2")
    return Status::Unsupported("architecture '" + arch + "' is not supported (llama, mistral, qwen2 are)");
  if (vocab_size <= 0 || vocab_size > (1 << 24)) return bad("vocab size " + std::to_string(vocab_size) + " out of range");
  if (dim <= 0 || dim > (1 << 16)) return bad("embedding size " + std::to_string(dim) + " out of range");
  if (n_layers <= 0 || n_layers > 1024) return bad("layer count " + std::to_string(n_layers) + " out of range");
  if (n_heads <= 0 || n_heads > 1024) return bad("head count " + std::to_string(n_heads) + " out of range");
  if (n_kv_heads <= 0 || n_kv_heads > n_heads || n_heads % n_kv_heads != 0)
    return bad("KV head count " + std::to_string(n_kv_heads) + " must divide head count " + std::to_string(n_heads));
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > 1024)
    return bad("head dimension " + std::to_string(head_dim) + " must be even and positive");
  if (ffn_dim <= 0 || ffn_dim > (1 << 20)) return bad("feed-forward size " + std::to_string(ffn_dim) + " out of range");
  if (context_length <= 0 || context_length > (1 << 24))
    return bad("context length " + std::to_string(context_length) + " out of range");
  if (!(rms_eps > 0.0f) || rms_eps > 1.0f) return bad("RMSNorm epsilon out of range");
  if (!(rope_theta > 0.0f)) return bad("RoPE theta must be positive");
  if (rope_scaling.type != RopeScaling::Type::kNone && !(rope_scaling.factor > 0.0f))
    return bad("RoPE scaling factor must be positive");
  if (rope_scaling.type == RopeScaling::Type::kLlama3 &&
      (!(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor) || rope_scaling.original_context <= 0))
    return bad("Llama-3 RoPE scaling needs high_freq_factor > low_freq_factor and an original context");
  return Status::Ok();
}

void ComputeRopeInvFreq(const ModelConfig& c, float* inv_freq) {
  const int half = c.head_dim / 2;
  const double two_pi = 2.0 * M_PI;
  for (int i = 0; i < half; ++i) {
    double freq = 1.0 / std::pow(static_cast<double>(c.rope_theta), (2.0 * i) / c.head_dim);
    const auto& s = c.rope_scaling;
    if (s.type == RopeScaling::Type::kLinear) {
      freq /= s.factor;
    } else if (s.type == RopeScaling::Type::kLlama3) {
      double low_wavelen = s.original_context / s.low_freq_factor;
      double high_wavelen = s.original_context / s.high_freq_factor;
      double wavelen = two_pi / freq;
      if (wavelen < high_wavelen) {
        // high frequencies kept
      } else if (wavelen > low_wavelen) {
        freq /= s.factor;
      } else {
        double smooth = (s.original_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        freq = (1.0 - smooth) * freq / s.factor + smooth * freq;
      }
    }
    if (static_cast<int>(c.rope_freq_factors.size()) == half) freq /= c.rope_freq_factors[i];
    inv_freq[i] = static_cast<float>(freq);
  }
}

}  // namespace strata
