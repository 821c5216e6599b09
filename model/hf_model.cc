#include "model/hf_model.h"

#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/mapped_file.h"
#include "model/safetensors.h"

namespace strata {

namespace {

using nlohmann::json;

// ---- config.json -----------------------------------------------------------

Status BadKey(std::string_view key, std::string_view what) {
  return Status::Corrupt("config.json: '" + std::string(key) + "' " + std::string(what));
}

// Absent or null → nullopt; present with the wrong type → Corrupt.
Result<std::optional<int64_t>> OptInt(const json& j, std::string_view key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<int64_t>();
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      return BadKey(key, "is out of range");
    return std::optional<int64_t>(it->get<int64_t>());
  }
  // Some exporters write integral values as floats (e.g. 8192.0).
  if (it->is_number_float()) {
    double d = it->get<double>();
    if (std::isfinite(d) && std::fabs(d) < 9e18 && d == std::trunc(d))
      return std::optional<int64_t>(static_cast<int64_t>(d));
  }
  return BadKey(key, "must be an integer, not " + it->dump());
}

Result<std::optional<double>> OptNumber(const json& j, std::string_view key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) return BadKey(key, "must be a number, not " + it->dump());
  return std::optional<double>(it->get<double>());
}

Result<std::optional<bool>> OptBool(const json& j, std::string_view key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<bool>();
  if (!it->is_boolean()) return BadKey(key, "must be true or false, not " + it->dump());
  return std::optional<bool>(it->get<bool>());
}

Result<std::optional<std::string>> OptString(const json& j, std::string_view key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return BadKey(key, "must be a string, not " + it->dump());
  return std::optional<std::string>(it->get<std::string>());
}

Result<int> ToInt(std::string_view key, int64_t v) {
  if (v < INT_MIN || v > INT_MAX)
    return BadKey(key, "value " + std::to_string(v) + " is out of range");
  return static_cast<int>(v);
}

Result<int> RequireInt(const json& j, std::string_view key) {
  STRATA_ASSIGN_OR_RETURN(std::optional<int64_t> v, OptInt(j, key));
  if (!v)
    return Status::NotFound("config.json: required key '" + std::string(key) + "' is missing");
  return ToInt(key, *v);
}

Result<int> IntOr(const json& j, std::string_view key, int def) {
  STRATA_ASSIGN_OR_RETURN(std::optional<int64_t> v, OptInt(j, key));
  if (!v) return def;
  return ToInt(key, *v);
}

Result<float> FloatOr(const json& j, std::string_view key, float def) {
  STRATA_ASSIGN_OR_RETURN(std::optional<double> v, OptNumber(j, key));
  return v ? static_cast<float>(*v) : def;
}

Result<bool> BoolOr(const json& j, std::string_view key, bool def) {
  STRATA_ASSIGN_OR_RETURN(std::optional<bool> v, OptBool(j, key));
  return v.value_or(def);
}

// The architecture from "architectures" (first supported entry) or
// "model_type".
Result<std::string> ParseArch(const json& j) {
  static const std::map<std::string, std::string, std::less<>> kByClass = {
      {"LlamaForCausalLM", "llama"},
      {"MistralForCausalLM", "mistral"},
      {"Qwen2ForCausalLM", "qwen2"},
  };
  auto it = j.find("architectures");
  if (it != j.end() && !it->is_null()) {
    if (!it->is_array()) return BadKey("architectures", "must be an array of strings");
    std::string names;
    for (const auto& a : *it) {
      if (!a.is_string()) return BadKey("architectures", "must be an array of strings");
      auto m = kByClass.find(a.get<std::string>());
      if (m != kByClass.end()) return m->second;
      names += (names.empty() ? "" : ", ") + a.get<std::string>();
    }
    if (!it->empty())
      return Status::Unsupported("config.json: architecture " + names +
                                 " is not supported (LlamaForCausalLM, MistralForCausalLM, "
                                 "Qwen2ForCausalLM are)");
  }
  STRATA_ASSIGN_OR_RETURN(std::optional<std::string> mt, OptString(j, "model_type"));
  if (!mt) return Status::NotFound("config.json has neither 'architectures' nor 'model_type'");
  if (*mt == "llama" || *mt == "mistral" || *mt == "qwen2") return *mt;
  return Status::Unsupported("config.json: model_type '" + *mt +
                             "' is not supported (llama, mistral, qwen2 are)");
}

Result<RopeScaling> ParseRopeScaling(const json& s, std::string_view key) {
  RopeScaling r;
  if (s.is_null()) return r;
  if (!s.is_object()) return BadKey(key, "must be an object or null");
  STRATA_ASSIGN_OR_RETURN(std::optional<std::string> type, OptString(s, "rope_type"));
  if (!type) {
    STRATA_ASSIGN_OR_RETURN(type, OptString(s, "type"));
  }
  if (!type) return BadKey(key, "has neither 'rope_type' nor 'type'");
  auto need = [&](std::string_view k) -> Result<double> {
    STRATA_ASSIGN_OR_RETURN(std::optional<double> v, OptNumber(s, k));
    if (!v)
      return Status::NotFound("config.json: " + std::string(key) + " '" + *type + "' needs '" +
                              std::string(k) + "'");
    return *v;
  };
  if (*type == "default") return r;
  if (*type == "linear") {
    r.type = RopeScaling::Type::kLinear;
    STRATA_ASSIGN_OR_RETURN(double f, need("factor"));
    r.factor = static_cast<float>(f);
    return r;
  }
  if (*type == "llama3") {
    r.type = RopeScaling::Type::kLlama3;
    STRATA_ASSIGN_OR_RETURN(double f, need("factor"));
    STRATA_ASSIGN_OR_RETURN(double lo, need("low_freq_factor"));
    STRATA_ASSIGN_OR_RETURN(double hi, need("high_freq_factor"));
    STRATA_ASSIGN_OR_RETURN(double orig, need("original_max_position_embeddings"));
    r.factor = static_cast<float>(f);
    r.low_freq_factor = static_cast<float>(lo);
    r.high_freq_factor = static_cast<float>(hi);
    if (!(orig >= 1 && orig <= INT_MAX))
      return BadKey(key, "original_max_position_embeddings out of range");
    r.original_context = static_cast<int>(orig);
    return r;
  }
  return Status::Unsupported("config.json: RoPE scaling type '" + *type +
                             "' is not supported (default, linear, llama3 are)");
}

// What config.json says beyond ModelConfig.
struct HfConfig {
  ModelConfig config;
  bool o_proj_bias = false;  // llama attention_bias: o_proj.bias exists too
};

Result<HfConfig> ParseConfigJson(const json& j) {
  if (!j.is_object()) return Status::Corrupt("config.json is not a JSON object");
  HfConfig h;
  ModelConfig& c = h.config;
  c.rope_style = RopeStyle::kNeox;
  STRATA_ASSIGN_OR_RETURN(c.arch, ParseArch(j));

  if (auto q = j.find("quantization_config"); q != j.end() && !q->is_null()) {
    std::string method =
        q->is_object() && q->contains("quant_method") ? q->at("quant_method").dump() : "?";
    return Status::Unsupported("config.json: quantized checkpoints (quant_method " + method +
                               ") are not supported");
  }
  STRATA_ASSIGN_OR_RETURN(std::optional<std::string> act, OptString(j, "hidden_act"));
  if (act && *act != "silu")
    return Status::Unsupported("config.json: hidden_act '" + *act + "' is not supported (silu is)");
  STRATA_ASSIGN_OR_RETURN(bool mlp_bias, BoolOr(j, "mlp_bias", false));
  if (mlp_bias) return Status::Unsupported("config.json: 'mlp_bias': true is not supported");

  STRATA_ASSIGN_OR_RETURN(c.dim, RequireInt(j, "hidden_size"));
  STRATA_ASSIGN_OR_RETURN(c.n_layers, RequireInt(j, "num_hidden_layers"));
  STRATA_ASSIGN_OR_RETURN(c.n_heads, RequireInt(j, "num_attention_heads"));
  STRATA_ASSIGN_OR_RETURN(c.ffn_dim, RequireInt(j, "intermediate_size"));
  STRATA_ASSIGN_OR_RETURN(c.vocab_size, RequireInt(j, "vocab_size"));
  STRATA_ASSIGN_OR_RETURN(c.n_kv_heads, IntOr(j, "num_key_value_heads", c.n_heads));
  if (c.n_heads <= 0) return BadKey("num_attention_heads", "must be positive");
  STRATA_ASSIGN_OR_RETURN(c.head_dim, IntOr(j, "head_dim", c.dim / c.n_heads));
  // transformers' defaults per architecture.
  const int default_ctx = c.arch == "llama" ? 2048 : c.arch == "mistral" ? 131072 : 32768;
  STRATA_ASSIGN_OR_RETURN(c.context_length, IntOr(j, "max_position_embeddings", default_ctx));
  STRATA_ASSIGN_OR_RETURN(c.rms_eps, FloatOr(j, "rms_norm_eps", 1e-6f));
  STRATA_ASSIGN_OR_RETURN(c.tied_embeddings, BoolOr(j, "tie_word_embeddings", false));

  // transformers v5 moves rope_theta and the scaling into "rope_parameters".
  const json* rope_params = nullptr;
  if (auto rp = j.find("rope_parameters"); rp != j.end() && rp->is_object()) rope_params = &*rp;
  STRATA_ASSIGN_OR_RETURN(std::optional<double> theta, OptNumber(j, "rope_theta"));
  if (!theta && rope_params != nullptr) {
    STRATA_ASSIGN_OR_RETURN(theta, OptNumber(*rope_params, "rope_theta"));
  }
  c.rope_theta = theta ? static_cast<float>(*theta) : 10000.0f;
  if (auto rs = j.find("rope_scaling"); rs != j.end() && !rs->is_null()) {
    STRATA_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(*rs, "rope_scaling"));
  } else if (rope_params != nullptr) {
    STRATA_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(*rope_params, "rope_parameters"));
  }

  if (c.arch == "qwen2") {
    c.qkv_bias = true;
  } else if (c.arch == "llama") {
    STRATA_ASSIGN_OR_RETURN(bool bias, BoolOr(j, "attention_bias", false));
    c.qkv_bias = bias;
    h.o_proj_bias = bias;
  }

  // Sliding window: see the header. qwen2 applies it only with
  // use_sliding_window; mistral whenever sliding_window is set.
  bool sliding = c.arch == "mistral";
  if (c.arch == "qwen2") {
    STRATA_ASSIGN_OR_RETURN(sliding, BoolOr(j, "use_sliding_window", false));
  }
  if (sliding) {
    STRATA_ASSIGN_OR_RETURN(std::optional<int64_t> window, OptInt(j, "sliding_window"));
    if (window && *window <= 0) return BadKey("sliding_window", "must be positive");
    if (window && *window < c.context_length) {
      STRATA_LOG_WARN(
          "config.json: sliding_window {} < max_position_embeddings {}; sliding-window attention "
          "is not implemented, so the context is limited to {} tokens",
          *window, c.context_length, *window);
      c.context_length = static_cast<int>(*window);
    }
  }
  STRATA_RETURN_IF_ERROR(c.Validate());
  return h;
}

// ---- files ------------------------------------------------------------------

std::string JoinPath(const std::string& dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return dir + std::string(name);
  return dir + "/" + std::string(name);
}

bool FileExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// The file's text, or "" when it does not exist.
Result<std::string> ReadOptionalFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::string();
    return Status::IoError("cannot stat", path, errno);
  }
  return ReadFileToString(path);
}

std::string BaseName(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  size_t slash = dir.rfind('/');
  return slash == std::string::npos ? dir : dir.substr(slash + 1);
}

// Where each tensor lives: one file, or shards through the index. Shards are
// opened on first use, once each.
class TensorSource {
 public:
  static Result<TensorSource> Open(const std::string& dir) {
    TensorSource s;
    s.dir_ = dir;
    const std::string single = JoinPath(dir, "model.safetensors");
    const std::string index = JoinPath(dir, "model.safetensors.index.json");
    if (FileExists(single)) {
      STRATA_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(single));
      s.single_ = "model.safetensors";
      s.shards_[s.single_] = std::move(f);
      return s;
    }
    if (!FileExists(index)) {
      std::string hint = FileExists(JoinPath(dir, "pytorch_model.bin"))
                             ? " (PyTorch .bin checkpoints are not supported)"
                             : "";
      return Status::NotFound("no model.safetensors or model.safetensors.index.json in '" + dir +
                              "'" + hint);
    }
    STRATA_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index));
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    auto bad = [&](const std::string& what) { return Status::Corrupt("'" + index + "': " + what); };
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object()) return bad("'weight_map' is missing or not an object");
    for (const auto& [name, file] : wm->items()) {
      if (!file.is_string()) return bad("weight_map entry for '" + name + "' is not a string");
      std::string f = file.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        return bad("weight_map entry for '" + name + "' names a bad shard file '" + f + "'");
      s.weight_map_[name] = std::move(f);
    }
    return s;
  }

  // The tensor `name` (its name set to the HF name), NotFound when absent.
  Result<Tensor> Get(const std::string& name) {
    std::string shard = single_;
    if (shard.empty()) {
      auto it = weight_map_.find(name);
      if (it == weight_map_.end())
        return Status::NotFound("tensor '" + name + "' is not in the weight_map of '" +
                                JoinPath(dir_, "model.safetensors.index.json") + "'");
      shard = it->second;
    }
    auto& f = shards_[shard];
    if (f == nullptr) {
      STRATA_ASSIGN_OR_RETURN(f, SafetensorsFile::Open(JoinPath(dir_, shard)));
    }
    const Tensor* t = f->Find(name);
    if (t == nullptr) {
      if (single_.empty())
        return Status::Corrupt("tensor '" + name + "' is listed in the index under '" + shard +
                               "' but that file does not hold it");
      return Status::NotFound("tensor '" + name + "' not found in '" + f->path() + "'");
    }
    return *t;
  }

  // Moves every opened mapping into `files`; tensors taken from Get() stay
  // valid as long as those live.
  void ReleaseInto(std::vector<std::unique_ptr<MappedFile>>& files) {
    for (auto& [name, f] : shards_)
      if (f != nullptr) files.push_back(f->ReleaseMapping());
    shards_.clear();
  }

 private:
  std::string dir_;
  std::string single_;  // "model.safetensors" when not sharded
  std::map<std::string, std::string> weight_map_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_;
};

// True when every element of an F32/F16/BF16 tensor is +0 or -0.
bool AllZero(const Tensor& t) {
  const size_t esize = static_cast<size_t>(GetDTypeInfo(t.type).block_bytes);
  for (size_t i = 0; i < t.nbytes; ++i) {
    uint8_t b = t.data[i];
    // Little-endian: the sign bit is the top bit of each element's last byte.
    if ((i % esize) == esize - 1) b &= 0x7f;
    if (b != 0) return false;
  }
  return true;
}

Status LoadTensors(TensorSource& src, const HfConfig& h, ModelWeights& w) {
  const ModelConfig& c = w.config;
  STRATA_ASSIGN_OR_RETURN(w.tok_embd, src.Get("model.embed_tokens.weight"));
  STRATA_ASSIGN_OR_RETURN(w.output_norm, src.Get("model.norm.weight"));
  if (c.tied_embeddings) {
    w.output = w.tok_embd;
  } else {
    STRATA_ASSIGN_OR_RETURN(w.output, src.Get("lm_head.weight"));
  }
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    STRATA_ASSIGN_OR_RETURN(l.attn_norm, src.Get(p + "input_layernorm.weight"));
    STRATA_ASSIGN_OR_RETURN(l.wq, src.Get(p + "self_attn.q_proj.weight"));
    STRATA_ASSIGN_OR_RETURN(l.wk, src.Get(p + "self_attn.k_proj.weight"));
    STRATA_ASSIGN_OR_RETURN(l.wv, src.Get(p + "self_attn.v_proj.weight"));
    STRATA_ASSIGN_OR_RETURN(l.wo, src.Get(p + "self_attn.o_proj.weight"));
    if (c.qkv_bias) {
      STRATA_ASSIGN_OR_RETURN(l.bq, src.Get(p + "self_attn.q_proj.bias"));
      STRATA_ASSIGN_OR_RETURN(l.bk, src.Get(p + "self_attn.k_proj.bias"));
      STRATA_ASSIGN_OR_RETURN(l.bv, src.Get(p + "self_attn.v_proj.bias"));
    }
    if (h.o_proj_bias) {
      STRATA_ASSIGN_OR_RETURN(Tensor bo, src.Get(p + "self_attn.o_proj.bias"));
      if (bo.ne != std::vector<int64_t>{c.dim})
        return Status::Corrupt("tensor '" + bo.name + "' has the wrong shape");
      if (!AllZero(bo))
        return Status::Unsupported("tensor '" + bo.name +
                                   "' is non-zero; attention output biases are not supported");
    }
    STRATA_ASSIGN_OR_RETURN(l.ffn_norm, src.Get(p + "post_attention_layernorm.weight"));
    STRATA_ASSIGN_OR_RETURN(l.w_gate, src.Get(p + "mlp.gate_proj.weight"));
    STRATA_ASSIGN_OR_RETURN(l.w_up, src.Get(p + "mlp.up_proj.weight"));
    STRATA_ASSIGN_OR_RETURN(l.w_down, src.Get(p + "mlp.down_proj.weight"));
  }
  return Status::Ok();
}

Result<HfModel> LoadHfModelImpl(const std::string& dir) {
  const std::string config_path = JoinPath(dir, "config.json");
  if (!FileExists(config_path)) return Status::NotFound("config.json not found in '" + dir + "'");
  STRATA_ASSIGN_OR_RETURN(std::string config_text, ReadFileToString(config_path));
  json j = json::parse(config_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Corrupt("'" + config_path + "' is not valid JSON");
  Result<HfConfig> parsed = ParseConfigJson(j);
  if (!parsed) return parsed.error().WithContext(dir);

  HfModel m;
  m.weights.config = parsed->config;
  m.weights.config.name = BaseName(dir);
  STRATA_ASSIGN_OR_RETURN(TensorSource src, TensorSource::Open(dir));
  Status s = LoadTensors(src, *parsed, m.weights);
  src.ReleaseInto(m.weights.files);
  STRATA_RETURN_IF_ERROR(s.WithContext(dir));
  STRATA_RETURN_IF_ERROR(ValidateWeights(m.weights).WithContext(dir));

  STRATA_ASSIGN_OR_RETURN(m.tokenizer_json, ReadOptionalFile(JoinPath(dir, "tokenizer.json")));
  STRATA_ASSIGN_OR_RETURN(m.tokenizer_config_json,
                          ReadOptionalFile(JoinPath(dir, "tokenizer_config.json")));
  STRATA_ASSIGN_OR_RETURN(m.generation_config_json,
                          ReadOptionalFile(JoinPath(dir, "generation_config.json")));
  return m;
}

}  // namespace

Result<ModelConfig> ParseHfConfig(std::string_view config_json) {
  try {
    json j = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return Status::Corrupt("config.json is not valid JSON");
    STRATA_ASSIGN_OR_RETURN(HfConfig h, ParseConfigJson(j));
    return h.config;
  } catch (const std::exception& e) {
    return Status::Corrupt(std::string("config.json: ") + e.what());
  }
}

Result<HfModel> LoadHfModel(const std::string& dir) {
  try {
    return LoadHfModelImpl(dir);
  } catch (const std::exception& e) {  // json type errors, bad_alloc
    return Status::Corrupt("Hugging Face model '" + dir + "': " + e.what());
  }
}

}  // namespace strata
