// strata model info | synth | quantize: inspect model files; write synthetic and quantized models.

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <cctype>
#include <algorithm>

#include "common/logging.h"
#include "common/mapped_file.h"
#include "common/thread_pool.h"
#include "model/gguf.h"
#include "model/gguf_export.h"
#include "model/gguf_tokenizer.h"
#include "model/hf_writer.h"
#include "model/model_loader.h"
#include "model/quantize.h"
#include "model/synth.h"
#include "tools/commands.h"

namespace strata::cli {

namespace {

int Fail(const char* cmd, const Status& s) {
  std::fprintf(stderr, "strata model %s: %s\n", cmd, s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

const char* RopeStyleName(RopeStyle s) { return s == RopeStyle::kNeox ? "neox (halves)" : "interleaved (pairs)"; }

// Reading a model's tensors or metadata: no forward pass, nothing to repack.
LoadOptions NoPack() {
  LoadOptions o;
  o.pack_weights = false;
  return o;
}

int RunInfo(const std::string& path, bool json) {
  auto loaded = LoadModel(path, NoPack());
  if (!loaded) return Fail("info", loaded.error());
  const LoadedModel& m = **loaded;
  const ModelConfig& c = m.weights.config;
  // Parameters and bytes per tensor type.
  std::map<std::string, std::pair<int64_t, int64_t>> by_type;  // type -> (tensors, params)
  int64_t params = 0, bytes = 0;
  auto add = [&](const Tensor& t) {
    if (!t.present()) return;
    auto& e = by_type[std::string(DTypeName(t.type))];
    e.first += 1;
    e.second += t.elements();
    params += t.elements();
    bytes += static_cast<int64_t>(t.nbytes);
  };
  add(m.weights.tok_embd);
  add(m.weights.output_norm);
  if (!c.tied_embeddings) add(m.weights.output);
  for (const auto& l : m.weights.layers)
    for (const Tensor* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv, &l.ffn_norm, &l.w_gate,
                            &l.w_up, &l.w_down})
      add(*t);
  const Tokenizer& tok = *m.tokenizer;
  const char* scaling = c.rope_scaling.type == RopeScaling::Type::kNone     ? "none"
                        : c.rope_scaling.type == RopeScaling::Type::kLinear ? "linear"
                                                                            : "llama3";
  if (json) {
    nlohmann::json j;
    j["id"] = m.id;
    j["path"] = m.path;
    j["format"] = m.format;
    j["synthetic"] = m.synthetic;
    j["digest"] = m.weights.digest;
    j["architecture"] = {{"arch", c.arch},
                         {"name", c.name},
                         {"vocab_size", c.vocab_size},
                         {"dim", c.dim},
                         {"layers", c.n_layers},
                         {"heads", c.n_heads},
                         {"kv_heads", c.n_kv_heads},
                         {"head_dim", c.head_dim},
                         {"ffn_dim", c.ffn_dim},
                         {"context_length", c.context_length},
                         {"rms_eps", c.rms_eps},
                         {"rope_theta", c.rope_theta},
                         {"rope_style", c.rope_style == RopeStyle::kNeox ? "neox" : "interleaved"},
                         {"rope_scaling", scaling},
                         {"rope_scaling_factor", c.rope_scaling.factor},
                         {"tied_embeddings", c.tied_embeddings},
                         {"qkv_bias", c.qkv_bias}};
    j["parameters"] = params;
    j["weight_bytes"] = bytes;
    nlohmann::json types = nlohmann::json::object();
    for (const auto& [t, e] : by_type) types[t] = {{"tensors", e.first}, {"parameters", e.second}};
    j["tensor_types"] = types;
    j["tokenizer"] = {{"model", tok.spec().model},
                      {"pre", tok.spec().pre},
                      {"vocab_size", tok.vocab_size()},
                      {"bos_id", tok.bos_id()},
                      {"eos_id", tok.eos_id()},
                      {"add_bos", tok.add_bos()},
                      {"eog_ids", tok.spec().eog_ids},
                      {"chat_template", std::string(ChatTemplateFamilyName(m.chat_family))}};
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("model          %s%s\n", m.id.c_str(), m.synthetic ? "  (SYNTHETIC: random weights)" : "");
  std::printf("path           %s (%s)\n", m.path.c_str(), m.format.c_str());
  std::printf("digest         %s\n", m.weights.digest.c_str());
  std::printf("architecture   %s%s%s\n", c.arch.c_str(), c.name.empty() ? "" : "  name: ", c.name.c_str());
  std::printf("shapes         dim %d, layers %d, heads %d, kv heads %d, head dim %d, ffn %d, vocab %d\n", c.dim,
              c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size);
  std::printf("context        %d tokens; RoPE theta %g, %s, scaling %s (factor %g)\n", c.context_length,
              c.rope_theta, RopeStyleName(c.rope_style), scaling, c.rope_scaling.factor);
  std::printf("norm           RMSNorm eps %g; embeddings %s; qkv bias %s\n", c.rms_eps,
              c.tied_embeddings ? "tied" : "untied", c.qkv_bias ? "yes" : "no");
  std::printf("parameters     %lld (%.1f MiB of weights)\n", static_cast<long long>(params), bytes / 1048576.0);
  for (const auto& [t, e] : by_type)
    std::printf("  %-6s       %lld tensors, %lld parameters\n", t.c_str(), static_cast<long long>(e.first),
                static_cast<long long>(e.second));
  std::printf("tokenizer      %s%s%s, %d tokens, bos %d, eos %d, add_bos %s\n", tok.spec().model.c_str(),
              tok.spec().pre.empty() ? "" : " pre=", tok.spec().pre.c_str(), tok.vocab_size(), tok.bos_id(),
              tok.eos_id(), tok.add_bos() ? "yes" : "no");
  std::printf("chat template  %s\n", std::string(ChatTemplateFamilyName(m.chat_family)).c_str());
  if (m.format == "gguf") {
    auto f = GgufFile::Open(path);
    if (f) {
      std::printf("metadata (GGUF v%u, %zu keys, %zu tensors)\n", (*f)->version(), (*f)->metadata().size(),
                  (*f)->tensors().size());
      for (const auto& k : (*f)->ListKeys())
        std::printf("  %-44s %-14s %s\n", k.key.c_str(), k.type.c_str(), k.rendered.c_str());
    }
  }
  return 0;
}

struct SynthFlags {
  std::string preset, out, dtype = "f32", vocab_from, format = "gguf";
  uint64_t seed = 1;
};

Result<TokenizerSpec> VocabFrom(const std::string& path) {
  std::error_code ec;
  if (path.ends_with(".json")) {
    STRATA_ASSIGN_OR_RETURN(std::string tj, ReadFileToString(path));
    std::string cfg;
    auto cfg_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
    if (std::filesystem::exists(cfg_path, ec)) {
      STRATA_ASSIGN_OR_RETURN(cfg, ReadFileToString(cfg_path.string()));
    }
    return TokenizerSpecFromHfJson(tj, cfg);
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> f, GgufFile::Open(path));
  return TokenizerSpecFromGguf(*f);
}

int RunSynth(const SynthFlags& f) {
  auto dtype = DTypeFromName(f.dtype);
  if (!dtype) return Fail("synth", Status::InvalidArgument("unknown --dtype '" + f.dtype + "'"));
  TokenizerSpec vocab;
  int vocab_size = 0;
  if (!f.vocab_from.empty()) {
    auto v = VocabFrom(f.vocab_from);
    if (!v) return Fail("synth", v.error().WithContext("--vocab-from " + f.vocab_from));
    vocab = std::move(*v);
    vocab_size = static_cast<int>(vocab.tokens.size());
  }
  auto config = SynthPresetConfig(f.preset, vocab_size);
  if (!config) return Fail("synth", config.error());
  if (f.vocab_from.empty()) vocab = SyntheticVocab(config->vocab_size);
  SynthOptions opt;
  opt.dtype = *dtype;
  opt.seed = f.seed;
  if (f.format == "gguf") {
    Status s = WriteSyntheticGguf(*config, vocab, opt, f.out);
    if (!s.ok()) return Fail("synth", s);
  } else {
    if (IsQuantized(*dtype))
      return Fail("synth", Status::InvalidArgument("--format hf supports f32, f16 and bf16 weights, not " + f.dtype));
    auto w = MakeSyntheticWeights(*config, opt);
    if (!w) return Fail("synth", w.error());
    w->config.name += "-random-weights";
    auto tj = TokenizerSpecToHfTokenizerJson(vocab);
    if (!tj) return Fail("synth", tj.error());
    auto cj = TokenizerSpecToHfConfigJson(vocab);
    if (!cj) return Fail("synth", cj.error());
    Status s = WriteHfModel(f.out, *w, *tj, *cj);
    if (!s.ok()) return Fail("synth", s);
  }
  STRATA_LOG_INFO("wrote synthetic {} model '{}' ({}, {} weights, RANDOM values, seed {}) to {}", f.preset,
                  config->name, f.format, f.dtype, f.seed, f.out);
  return 0;
}

struct QuantizeFlags {
  std::string model, out, dtype, fit = "least-squares";
  int threads = 0;
  bool allow_requantize = false, json = false;
};

std::string ShapeText(const std::vector<int64_t>& ne) {
  std::string s;
  for (int64_t d : ne) s += (s.empty() ? "" : " x ") + std::to_string(d);
  return s;
}

int RunQuantize(const QuantizeFlags& f) {
  auto loaded = LoadModel(f.model, NoPack());
  if (!loaded) return Fail("quantize", loaded.error());
  const LoadedModel& m = **loaded;
  auto plan = PlanQuantization(m.weights, f.dtype, f.allow_requantize);
  if (!plan) return Fail("quantize", plan.error().WithContext(f.model));
  plan->fit = f.fit == "ggml" ? QuantFit::kGgml : QuantFit::kLeastSquares;
  const int threads = f.threads > 0 ? f.threads : HardwareThreads();
  Status s = WriteQuantizedGguf(m.weights, m.tokenizer->spec(), *plan, m.synthetic, threads, f.out);
  // (A Hugging Face Llama directory loads with NeoX RoPE pairing, which GGUF
  // llama cannot carry without permuting Q/K: WriteModelGguf refuses it.)
  if (!s.ok()) return Fail("quantize", s.WithContext(f.out));
  std::error_code ec;
  const auto out_bytes = std::filesystem::file_size(f.out, ec);
  int fallbacks = 0;
  for (const auto& t : plan->tensors) fallbacks += t.fallback ? 1 : 0;
  if (f.json) {
    nlohmann::json j;
    j["model"] = f.model;
    j["out"] = f.out;
    j["dtype"] = f.dtype;
    j["fit"] = f.fit;
    j["out_bytes"] = ec ? 0 : out_bytes;
    j["fallbacks"] = fallbacks;
    nlohmann::json ts = nlohmann::json::array();
    for (const auto& t : plan->tensors)
      ts.push_back({{"name", t.name}, {"shape", t.ne}, {"from", DTypeName(t.from)}, {"to", DTypeName(t.to)},
                    {"fallback", t.fallback}});
    j["tensors"] = ts;
    j["census"] = plan->Census();
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  for (const auto& t : plan->tensors)
    std::printf("%-28s %-16s %-5s -> %-5s%s\n", t.name.c_str(), ShapeText(t.ne).c_str(),
                std::string(DTypeName(t.from)).c_str(), std::string(DTypeName(t.to)).c_str(),
                t.fallback ? "  (fallback: rows do not divide into the recipe's blocks)" : "");
  std::printf("census (%s):", f.dtype.c_str());
  for (const auto& [type, n] : plan->Census()) std::printf(" %s %d", type.c_str(), n);
  std::printf("; %d fallbacks\nwrote %s (%.1f MiB)\n", fallbacks, f.out.c_str(), ec ? 0.0 : out_bytes / 1048576.0);
  return 0;
}

}  // namespace

void RegisterModel(CLI::App& app, int* exit_code) {
  CLI::App* model = app.add_subcommand("model", "inspect, quantize and synthesize model files");
  model->require_subcommand(1);
  model->fallthrough();

  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  CLI::App* info = model->add_subcommand("info", "print architecture, shapes, tensor types and tokenizer");
  info->add_option("path", *path, "GGUF file or Hugging Face directory")->required();
  info->add_flag("--json", *json, "print one JSON object");
  info->callback([path, json, exit_code] { *exit_code = RunInfo(*path, *json); });

  auto sf = std::make_shared<SynthFlags>();
  CLI::App* synth = model->add_subcommand("synth", "write a model with random weights and a real model's shapes");
  std::string presets;
  for (const auto& p : SynthPresetNames()) presets += (presets.empty() ? "" : ", ") + p;
  synth->add_option("--preset", sf->preset, "shape preset: " + presets)->required()->check(CLI::IsMember(SynthPresetNames()));
  synth->add_option("--out", sf->out, "output GGUF file (or directory with --format hf)")->required();
  synth->add_option("--dtype", sf->dtype, "weight type: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"}))
      ->capture_default_str();
  synth->add_option("--vocab-from", sf->vocab_from, "take the vocabulary from a GGUF file or a tokenizer.json");
  synth->add_option("--seed", sf->seed, "random seed")->capture_default_str();
  synth->add_option("--format", sf->format, "gguf or hf (Hugging Face directory)")
      ->check(CLI::IsMember({"gguf", "hf"}))
      ->capture_default_str();
  synth->callback([sf, exit_code] { *exit_code = RunSynth(*sf); });

  auto qf = std::make_shared<QuantizeFlags>();
  CLI::App* quant = model->add_subcommand(
      "quantize", "write a GGUF copy of a model with its matrices in another type (llama-quantize's recipes)");
  quant->add_option("--model", qf->model,
                    "input: GGUF file (or a Hugging Face directory whose RoPE pairing GGUF can carry, e.g. qwen2) "
                    "with f32, f16 or bf16 weights")
      ->required();
  quant->add_option("--out", qf->out, "output GGUF file")->required();
  quant->add_option("--dtype", qf->dtype,
                    "q8_0, q4_0, q4_k, q5_k, q6_k (every matrix), q4_k_m (llama.cpp's Q4_K_M mix), f16, bf16, f32")
      ->required()
      ->check(CLI::IsMember(QuantizeRecipeNames(), CLI::ignore_case));
  quant->add_option("--threads", qf->threads, "threads converting (0 = all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  quant->add_option("--fit", qf->fit,
                    "how q8_0 and q4_0 blocks choose their scale: least-squares (the least squared error) or "
                    "ggml (llama-quantize's bytes); other types are ggml's either way")
      ->check(CLI::IsMember({"least-squares", "ggml"}))
      ->capture_default_str();
  quant->add_flag("--allow-requantize", qf->allow_requantize, "quantize tensors that are already quantized");
  quant->add_flag("--json", qf->json, "print the plan and census as one JSON object");
  quant->callback([qf, exit_code] {
    for (auto& c : qf->dtype) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    *exit_code = RunQuantize(*qf);
  });
}

}  // namespace strata::cli
