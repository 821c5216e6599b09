#include <string>
#include <vector>

#include "common/config.h"
#include "tools/commands.h"

namespace strata::cli {

void AddEngineFlags(CLI::App* cmd, EngineFlags* f) {
  cmd->add_option("--config", f->config_path, "YAML config file (configs/strata.yaml documents every key)");
  cmd->add_option("--kv-block-size", f->kv_block_size, "tokens per KV block")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--kv-dtype", f->kv_dtype, "KV cache element type")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--threads", f->threads, "compute threads (0 = all hardware threads)")->check(CLI::Range(0, 1024));
  cmd->add_option("--chat-template", f->chat_template,
                  "chat format: llama2, llama3, llama31, chatml, mistral, plain, ... (default: detect from the model)");
}

bool ResolveEngineFlags(CLI::App* cmd, EngineFlags* f, std::string* model_path, std::string* error) {
  if (f->config_path.empty()) return true;
  auto cfg = Config::LoadFile(f->config_path);
  if (!cfg) {
    *error = cfg.error().message();
    return false;
  }
  static const std::vector<std::string> kKnown = {"model.path", "model.chat_template", "engine.threads",
                                                  "kv.block_size", "kv.dtype"};
  if (Status s = cfg->CheckKnownKeys(kKnown); !s.ok()) {
    *error = s.message();
    return false;
  }
  auto unset = [&](const char* flag) { return cmd->count(flag) == 0; };
  auto fail = [&](const Status& s) {
    *error = s.message();
    return false;
  };
  if (model_path != nullptr && model_path->empty()) {
    auto v = cfg->GetString("model.path", "");
    if (!v) return fail(v.error());
    *model_path = *v;
  }
  if (unset("--chat-template")) {
    auto v = cfg->GetString("model.chat_template", f->chat_template);
    if (!v) return fail(v.error());
    f->chat_template = *v;
  }
  if (unset("--threads")) {
    auto v = cfg->GetInt("engine.threads", f->threads);
    if (!v) return fail(v.error());
    if (*v < 0 || *v > 1024) return fail(Status::InvalidArgument(f->config_path + ": engine.threads out of range [0, 1024]"));
    f->threads = static_cast<int>(*v);
  }
  if (unset("--kv-block-size")) {
    auto v = cfg->GetInt("kv.block_size", f->kv_block_size);
    if (!v) return fail(v.error());
    if (*v < 1 || *v > 4096) return fail(Status::InvalidArgument(f->config_path + ": kv.block_size out of range [1, 4096]"));
    f->kv_block_size = static_cast<int>(*v);
  }
  if (unset("--kv-dtype")) {
    auto v = cfg->GetString("kv.dtype", f->kv_dtype);
    if (!v) return fail(v.error());
    if (*v != "f32" && *v != "f16" && *v != "bf16")
      return fail(Status::InvalidArgument(f->config_path + ": kv.dtype must be f32, f16 or bf16, not '" + *v + "'"));
    f->kv_dtype = *v;
  }
  return true;
}

}  // namespace strata::cli
