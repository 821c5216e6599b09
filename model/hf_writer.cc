#include "model/hf_writer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>
#include <utility>

#include "common/mapped_file.h"
#include "model/safetensors.h"

namespace strata {

namespace {

using OJson = nlohmann::ordered_json;

// The double whose shortest decimal form is the float's, so config.json shows
// 1e-05 rather than 9.999999747378752e-06 and reads back as the same float.
double ShortDouble(float f) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf - 1, f);
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}

std::string JoinPath(const std::string& dir, std::string_view name) {
  if (!dir.empty() && dir.back() == '/') return dir + std::string(name);
  return dir + "/" + std::string(name);
}

Status WriteText(const std::string& path, std::string_view text) {
  return WriteFileAtomic(path, text.data(), text.size());
}

// A tensor to write under its HF name; permute_heads > 0 means "rows go
// through PermuteInterleavedToNeox with that many heads first".
struct Item {
  std::string name;
  Tensor t;
  int permute_heads = 0;
};

Result<std::vector<Item>> PlanTensors(const ModelWeights& w, const std::vector<uint8_t>& zeros) {
  const ModelConfig& c = w.config;
  const bool permute = c.rope_style == RopeStyle::kInterleaved;
  auto zero = [&](int n) {
    Tensor t;
    t.type = DType::kF32;
    t.ne = {n};
    t.data = zeros.data();
    t.nbytes = static_cast<size_t>(n) * sizeof(float);
    return t;
  };
  std::vector<Item> items;
  items.push_back({"model.embed_tokens.weight", w.tok_embd, 0});
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerWeights& l = w.layers[static_cast<size_t>(i)];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const int qh = permute ? c.n_heads : 0;
    const int kh = permute ? c.n_kv_heads : 0;
    items.push_back({p + "input_layernorm.weight", l.attn_norm, 0});
    items.push_back({p + "self_attn.q_proj.weight", l.wq, qh});
    items.push_back({p + "self_attn.k_proj.weight", l.wk, kh});
    items.push_back({p + "self_attn.v_proj.weight", l.wv, 0});
    if (c.qkv_bias) {
      items.push_back({p + "self_attn.q_proj.bias", l.bq, qh});
      items.push_back({p + "self_attn.k_proj.bias", l.bk, kh});
      items.push_back({p + "self_attn.v_proj.bias", l.bv, 0});
    } else if (c.arch == "qwen2") {
      // Qwen2ForCausalLM always has q/k/v biases; zeros keep the function.
      items.push_back({p + "self_attn.q_proj.bias", zero(c.q_dim()), 0});
      items.push_back({p + "self_attn.k_proj.bias", zero(c.kv_dim()), 0});
      items.push_back({p + "self_attn.v_proj.bias", zero(c.kv_dim()), 0});
    }
    items.push_back({p + "self_attn.o_proj.weight", l.wo, 0});
    if (c.arch == "llama" && c.qkv_bias) {
      // attention_bias: true also gives o_proj a bias in LlamaAttention.
      items.push_back({p + "self_attn.o_proj.bias", zero(c.dim), 0});
    }
    items.push_back({p + "post_attention_layernorm.weight", l.ffn_norm, 0});
    items.push_back({p + "mlp.gate_proj.weight", l.w_gate, 0});
    items.push_back({p + "mlp.up_proj.weight", l.w_up, 0});
    items.push_back({p + "mlp.down_proj.weight", l.w_down, 0});
  }
  items.push_back({"model.norm.weight", w.output_norm, 0});
  if (!c.tied_embeddings) items.push_back({"lm_head.weight", w.output, 0});
  for (const Item& it : items) {
    if (IsQuantized(it.t.type))
      return Status::Unsupported("tensor '" + it.name + "' (" + it.t.name + ") is " +
                                 std::string(DTypeName(it.t.type)) +
                                 "; Hugging Face export needs f32, f16 or bf16");
  }
  return items;
}

Status WriteShard(const std::string& path, const std::vector<const Item*>& items,
                  const ModelConfig& c) {
  SafetensorsWriter wr;
  // transformers refuses safetensors files without a "format" it knows.
  wr.SetMetadata("format", "pt");
  // Permuted copies for this shard only; freed when the shard is written.
  std::vector<std::vector<uint8_t>> copies;
  for (const Item* it : items) {
    Tensor t = it->t;
    if (it->permute_heads > 0) {
      auto permuted = PermuteInterleavedToNeox(t, it->permute_heads, c.head_dim);
      if (!permuted) return permuted.error().WithContext("tensor '" + it->name + "'");
      copies.push_back(std::move(*permuted));
      t.data = copies.back().data();  // moving the outer vector keeps this buffer
    }
    STRATA_RETURN_IF_ERROR(wr.AddTensor(t, it->name));
  }
  return wr.Write(path);
}

Status RemoveIfPresent(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  if (ec) return Status::IoError("cannot remove stale", path, ec.value());
  return Status::Ok();
}

// config.json cannot hold GGUF's per-frequency RoPE divisors. llama.cpp
// derives them from Llama-3 scaling, so look for the Llama-3 parameters that
// reproduce them: the standard low/high factors and original context, with the
// factor solved from the lowest frequency (its divisor is the factor itself
// past the low-frequency wavelength, and a known blend of 1 and the factor in
// the band between). Anything else fails rather than change the function.
Result<ModelConfig> ResolveFreqFactors(const ModelConfig& in) {
  if (in.rope_freq_factors.empty()) return in;
  const size_t half = static_cast<size_t>(in.head_dim / 2);
  if (in.rope_freq_factors.size() != half)
    return Status::InvalidArgument("rope_freq_factors has " +
                                   std::to_string(in.rope_freq_factors.size()) +
                                   " entries, expected head_dim/2 = " + std::to_string(half));
  std::vector<float> target(half), got(half);
  ComputeRopeInvFreq(in, target.data());
  ModelConfig base = in;
  base.rope_freq_factors.clear();
  std::vector<RopeScaling> candidates = {in.rope_scaling};
  if (in.rope_scaling.type == RopeScaling::Type::kNone && half > 0) {
    RopeScaling l3;
    l3.type = RopeScaling::Type::kLlama3;
    l3.low_freq_factor = 1.0f;
    l3.high_freq_factor = 4.0f;
    l3.original_context = 8192;
    const size_t i = half - 1;  // lowest frequency, longest wavelength
    const double freq = 1.0 / std::pow(static_cast<double>(in.rope_theta), (2.0 * i) / in.head_dim);
    const double wavelen = 2.0 * M_PI / freq;
    const double div = in.rope_freq_factors[i];
    const double low_wavelen = l3.original_context / l3.low_freq_factor;
    const double high_wavelen = l3.original_context / l3.high_freq_factor;
    double factor = 0;
    if (wavelen > low_wavelen) {
      factor = div;
    } else if (wavelen >= high_wavelen) {
      // div = 1 / ((1 - smooth) / factor + smooth)
      const double smooth = (l3.original_context / wavelen - l3.low_freq_factor) /
                            (l3.high_freq_factor - l3.low_freq_factor);
      if (div > 0 && 1.0 / div - smooth > 0) factor = (1.0 - smooth) / (1.0 / div - smooth);
    }
    if (factor > 0) {
      l3.factor = static_cast<float>(factor);
      candidates.push_back(l3);
    }
  }
  for (const RopeScaling& s : candidates) {
    base.rope_scaling = s;
    ComputeRopeInvFreq(base, got.data());
    bool same = true;
    for (size_t i = 0; i < half && same; ++i)
      same = std::fabs(got[i] - target[i]) <= 1e-5f * std::fabs(target[i]);
    if (same) return base;
  }
  return Status::Unsupported(
      "the RoPE frequency factors (GGUF rope_freqs.weight) do not match Llama-3 scaling with "
      "low_freq_factor 1, high_freq_factor 4, original context 8192; config.json cannot express "
      "them");
}

}  // namespace

Result<std::string> MakeHfConfigJson(const ModelConfig& config, DType dtype) {
  STRATA_ASSIGN_OR_RETURN(const ModelConfig c, ResolveFreqFactors(config));
  std::string cls;
  if (c.arch == "llama")
    cls = "LlamaForCausalLM";
  else if (c.arch == "mistral")
    cls = "MistralForCausalLM";
  else if (c.arch == "qwen2")
    cls = "Qwen2ForCausalLM";
  else
    return Status::Unsupported("architecture '" + c.arch + "' has no Hugging Face equivalent here");
  const char* torch_dtype = dtype == DType::kF32    ? "float32"
                            : dtype == DType::kF16  ? "float16"
                            : dtype == DType::kBF16 ? "bfloat16"
                                                    : nullptr;
  if (torch_dtype == nullptr)
    return Status::Unsupported("dtype " + std::string(DTypeName(dtype)) +
                               " has no torch_dtype (f32, f16, bf16 do)");
  try {
    OJson j = OJson::object();
    j["architectures"] = {cls};
    j["model_type"] = c.arch;
    j["hidden_size"] = c.dim;
    j["intermediate_size"] = c.ffn_dim;
    j["num_hidden_layers"] = c.n_layers;
    j["num_attention_heads"] = c.n_heads;
    j["num_key_value_heads"] = c.n_kv_heads;
    j["head_dim"] = c.head_dim;
    j["vocab_size"] = c.vocab_size;
    j["max_position_embeddings"] = c.context_length;
    j["rms_norm_eps"] = ShortDouble(c.rms_eps);
    j["rope_theta"] = ShortDouble(c.rope_theta);
    const RopeScaling& s = c.rope_scaling;
    switch (s.type) {
      case RopeScaling::Type::kNone:
        j["rope_scaling"] = nullptr;
        break;
      case RopeScaling::Type::kLinear:
        // "type" too, for transformers releases before "rope_type".
        j["rope_scaling"] = {
            {"rope_type", "linear"}, {"type", "linear"}, {"factor", ShortDouble(s.factor)}};
        break;
      case RopeScaling::Type::kLlama3:
        j["rope_scaling"] = {{"rope_type", "llama3"},
                             {"factor", ShortDouble(s.factor)},
                             {"low_freq_factor", ShortDouble(s.low_freq_factor)},
                             {"high_freq_factor", ShortDouble(s.high_freq_factor)},
                             {"original_max_position_embeddings", s.original_context}};
        break;
    }
    j["tie_word_embeddings"] = c.tied_embeddings;
    j["hidden_act"] = "silu";
    if (c.arch == "llama") {
      j["attention_bias"] = c.qkv_bias;
      j["mlp_bias"] = false;
    } else if (c.arch == "mistral") {
      j["sliding_window"] = nullptr;
    } else {
      j["use_sliding_window"] = false;
      j["sliding_window"] = nullptr;
      j["max_window_layers"] = c.n_layers;
    }
    j["torch_dtype"] = torch_dtype;
    return j.dump(2) + "\n";
  } catch (const std::exception& e) {
    return Status::Internal(std::string("cannot build config.json: ") + e.what());
  }
}

Result<std::vector<uint8_t>> PermuteInterleavedToNeox(const Tensor& t, int n_heads, int head_dim) {
  if (n_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0)
    return Status::InvalidArgument("RoPE permutation of '" + t.name +
                                   "' needs positive heads and an even head_dim, got " +
                                   std::to_string(n_heads) + " x " + std::to_string(head_dim));
  if (IsQuantized(t.type))
    return Status::InvalidArgument("RoPE permutation of '" + t.name + "': quantized type " +
                                   std::string(DTypeName(t.type)) + " is not supported");
  if (t.data == nullptr || t.ne.empty())
    return Status::InvalidArgument("RoPE permutation of '" + t.name + "': tensor is absent");
  // A bias (1-D) has one element per output row.
  const bool is_vector = t.ne.size() == 1;
  const int64_t nrows = is_vector ? t.ne[0] : t.rows();
  const size_t row_bytes = is_vector ? RowBytes(t.type, 1) : RowBytes(t.type, t.cols());
  if (nrows != static_cast<int64_t>(n_heads) * head_dim)
    return Status::InvalidArgument(
        "RoPE permutation of '" + t.name + "': " + std::to_string(nrows) + " rows, expected " +
        std::to_string(n_heads) + " heads x " + std::to_string(head_dim));
  if (t.nbytes != static_cast<size_t>(nrows) * row_bytes)
    return Status::InvalidArgument("RoPE permutation of '" + t.name +
                                   "': byte size does not match its shape");
  std::vector<uint8_t> out(t.nbytes);
  const int half = head_dim / 2;
  for (int h = 0; h < n_heads; ++h) {
    const size_t head = static_cast<size_t>(h) * static_cast<size_t>(head_dim);
    for (int i = 0; i < half; ++i) {
      const size_t ui = static_cast<size_t>(i);
      std::memcpy(out.data() + (head + ui) * row_bytes, t.data + (head + 2 * ui) * row_bytes,
                  row_bytes);
      std::memcpy(out.data() + (head + ui + half) * row_bytes,
                  t.data + (head + 2 * ui + 1) * row_bytes, row_bytes);
    }
  }
  return out;
}

namespace {

Status WriteHfModelImpl(const std::string& dir, const ModelWeights& w,
                        std::string_view tokenizer_json, std::string_view tokenizer_config_json,
                        size_t max_shard_bytes) {
  const ModelConfig& c = w.config;
  STRATA_RETURN_IF_ERROR(ValidateWeights(w));
  if (c.arch == "mistral" && c.qkv_bias)
    return Status::Unsupported("mistral with q/k/v biases has no Hugging Face equivalent");
  STRATA_ASSIGN_OR_RETURN(std::string config_json, MakeHfConfigJson(c, w.tok_embd.type));

  std::vector<uint8_t> zeros(static_cast<size_t>(std::max(c.q_dim(), c.dim)) * sizeof(float), 0);
  STRATA_ASSIGN_OR_RETURN(std::vector<Item> items, PlanTensors(w, zeros));

  // Greedy sharding in HF order.
  std::vector<std::vector<const Item*>> shards(1);
  uint64_t shard_bytes = 0, total = 0;
  for (const Item& it : items) {
    if (max_shard_bytes > 0 && shard_bytes > 0 && shard_bytes + it.t.nbytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&it);
    shard_bytes += it.t.nbytes;
    total += it.t.nbytes;
  }

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("cannot create directory", dir, ec.value());

  const std::string single = JoinPath(dir, "model.safetensors");
  const std::string index = JoinPath(dir, "model.safetensors.index.json");
  if (shards.size() == 1) {
    STRATA_RETURN_IF_ERROR(RemoveIfPresent(index));
    STRATA_RETURN_IF_ERROR(WriteShard(single, shards[0], c));
  } else {
    STRATA_RETURN_IF_ERROR(RemoveIfPresent(single));
    nlohmann::json weight_map = nlohmann::json::object();  // sorted by name, as HF writes it
    for (size_t s = 0; s < shards.size(); ++s) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
      STRATA_RETURN_IF_ERROR(WriteShard(JoinPath(dir, name), shards[s], c));
      for (const Item* it : shards[s]) weight_map[it->name] = name;
    }
    OJson idx = OJson::object();
    idx["metadata"] = {{"total_size", total}};
    idx["weight_map"] = std::move(weight_map);
    STRATA_RETURN_IF_ERROR(WriteText(index, idx.dump(2) + "\n"));
  }

  STRATA_RETURN_IF_ERROR(WriteText(JoinPath(dir, "config.json"), config_json));
  if (!tokenizer_json.empty())
    STRATA_RETURN_IF_ERROR(WriteText(JoinPath(dir, "tokenizer.json"), tokenizer_json));
  if (!tokenizer_config_json.empty())
    STRATA_RETURN_IF_ERROR(
        WriteText(JoinPath(dir, "tokenizer_config.json"), tokenizer_config_json));
  return Status::Ok();
}

}  // namespace

Status WriteHfModel(const std::string& dir, const ModelWeights& w, std::string_view tokenizer_json,
                    std::string_view tokenizer_config_json, size_t max_shard_bytes) {
  try {
    return WriteHfModelImpl(dir, w, tokenizer_json, tokenizer_config_json, max_shard_bytes);
  } catch (const std::exception& e) {  // bad_alloc for permuted copies, json errors
    return Status::Internal("writing Hugging Face model '" + dir + "': " + e.what());
  }
}

}  // namespace strata
