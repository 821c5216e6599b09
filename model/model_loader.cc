#include "model/model_loader.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>

#include "common/logging.h"
#include "model/gguf.h"
#include "model/gguf_export.h"
#include "model/gguf_model.h"
#include "model/gguf_tokenizer.h"
#include "model/hf_model.h"
#include "model/synth.h"
#include "model/weight_pack.h"

namespace strata {

namespace {

std::string BaseNameNoExt(const std::string& path) {
  std::filesystem::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // trailing '/'
  std::string name = p.filename().string();
  if (!std::filesystem::is_directory(p)) {
    auto dot = name.rfind('.');
    if (dot != std::string::npos && dot > 0) name = name.substr(0, dot);
  }
  return name;
}

}  // namespace

Result<std::unique_ptr<LoadedModel>> LoadModel(const std::string& path, const LoadOptions& options) {
  auto m = std::make_unique<LoadedModel>();
  m->path = path;
  m->id = BaseNameNoExt(path);
  TokenizerSpec spec;
  std::vector<const MappedFile*> mapped;  // what the tensors point into
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    m->format = "hf";
    STRATA_ASSIGN_OR_RETURN(HfModel hf, LoadHfModel(path));
    m->weights = std::move(hf.weights);
    if (hf.tokenizer_json.empty())
      return Status::NotFound("model directory '" + path + "' has no tokenizer.json");
    auto s = TokenizerSpecFromHfJson(hf.tokenizer_json, hf.tokenizer_config_json);
    if (!s) return s.error().WithContext(path + "/tokenizer.json");
    spec = std::move(*s);
  } else {
    m->format = "gguf";
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> f, GgufFile::Open(path));
    std::shared_ptr<const GgufFile> file(std::move(f));
    mapped.push_back(file->mapped_file());
    STRATA_ASSIGN_OR_RETURN(spec, TokenizerSpecFromGguf(*file));
    if (file->Has("strata.synthetic")) {
      auto b = file->GetBool("strata.synthetic");
      m->synthetic = b && *b;
    }
    STRATA_ASSIGN_OR_RETURN(m->weights, WeightsFromGguf(file));
  }
  if (m->weights.digest.empty()) m->weights.digest = ComputeWeightsDigest(m->weights);
  if (options.pack_weights) {
    for (const auto& file : m->weights.files) mapped.push_back(file.get());
    PackWeightsForInt8(&m->weights, mapped);
    PackWeightPanels(&m->weights, mapped);
  }
  if (static_cast<int>(spec.tokens.size()) > m->weights.config.vocab_size)
    return Status::Corrupt(path + ": tokenizer has " + std::to_string(spec.tokens.size()) +
                           " tokens but the embedding table only " + std::to_string(m->weights.config.vocab_size));
  std::string template_text = spec.chat_template;
  auto tok = Tokenizer::Create(std::move(spec));
  if (!tok) return tok.error().WithContext(path + ": tokenizer");
  m->tokenizer = std::move(*tok);
  if (!options.chat_template.empty()) {
    auto fam = ChatTemplateFamilyFromName(options.chat_template);
    if (!fam) {
      std::string names;
      for (auto f : AllChatTemplateFamilies()) names += (names.empty() ? "" : ", ") + std::string(ChatTemplateFamilyName(f));
      return Status::InvalidArgument("unknown chat template '" + options.chat_template + "' (known: " + names + ")");
    }
    m->chat_family = *fam;
  } else {
    m->chat_family = DetectChatTemplate(template_text);
  }
  if (m->synthetic) {
    STRATA_LOG_WARN("model '{}' is SYNTHETIC: its weights are random, so its output is meaningless text", m->id);
  }
  return m;
}

std::vector<int32_t> TokenizePrompt(const LoadedModel& m, std::string_view text) {
  std::vector<int32_t> ids = m.tokenizer->Encode(text, /*add_special=*/true, /*parse_special=*/true);
  const int32_t bos = m.tokenizer->bos_id();
  if (bos >= 0 && ids.size() >= 2 && ids[0] == bos && ids[1] == bos) ids.erase(ids.begin());
  return ids;
}

Result<std::vector<int32_t>> TokenizeChat(const LoadedModel& m, const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt) {
  ChatRenderOptions opt;
  const Tokenizer& t = *m.tokenizer;
  if (t.bos_id() >= 0) opt.bos_token = std::string(t.Piece(t.bos_id()));
  if (t.eos_id() >= 0) opt.eos_token = std::string(t.Piece(t.eos_id()));
  opt.add_generation_prompt = add_generation_prompt;
  STRATA_ASSIGN_OR_RETURN(std::string text, RenderChat(m.chat_family, messages, opt));
  bool starts_with_bos = !opt.bos_token.empty() && text.starts_with(opt.bos_token);
  std::vector<int32_t> ids = t.Encode(text, /*add_special=*/!starts_with_bos, /*parse_special=*/true);
  if (t.bos_id() >= 0 && ids.size() >= 2 && ids[0] == t.bos_id() && ids[1] == t.bos_id()) ids.erase(ids.begin());
  return ids;
}

std::string DefaultModelPath() {
  std::string dir;
  if (const char* e = std::getenv("STRATA_CACHE_DIR"); e != nullptr && *e) {
    dir = e;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x) {
    dir = std::string(x) + "/strata";
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h) {
    dir = std::string(h) + "/.cache/strata";
  } else {
    dir = "/tmp/strata-cache";
  }
  return dir + "/models/strata-synthetic-tiny-random-weights.gguf";
}

Result<std::string> EnsureDefaultModel() {
  std::string path = DefaultModelPath();
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) return path;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) return Status::IoError("cannot create cache directory", std::filesystem::path(path).parent_path().string(), ec.value());
  STRATA_ASSIGN_OR_RETURN(ModelConfig c, SynthPresetConfig("tiny", 0));
  SynthOptions opt;
  opt.dtype = DType::kF32;
  opt.seed = 1;
  STRATA_LOG_WARN("no model configured: writing a small synthetic model with RANDOM weights to {}", path);
  STRATA_RETURN_IF_ERROR(WriteSyntheticGguf(c, SyntheticVocab(c.vocab_size), opt, path));
  return path;
}

}  // namespace strata
