#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "model/backend/cpu/matmul.h"
#include "tools/commands.h"

namespace strata::cli {

void AddActivationFlags(CLI::App* cmd, bool* int8, bool* exact) {
  CLI::Option* i = cmd->add_flag("--int8-activations", *int8,
                                 "multiply every quantized weight type (q8_0 too) with activations quantized per "
                                 "token to int8 (default: the K-quants and q4_0 with AVX2 or AVX-512 VNNI; q8_0 "
                                 "with AVX-512 VNNI takes 16-bit codes)");
  CLI::Option* e = cmd->add_flag("--exact-activations", *exact, "f32 activations in every product");
  i->excludes(e);
}

void ApplyActivationFlags(bool int8, bool exact, const std::string& fallback) {
  const std::string m = int8 ? "int8" : exact ? "exact" : fallback;
  cpu::SetActivationMode(m == "int8"    ? cpu::ActivationMode::kInt8
                         : m == "exact" ? cpu::ActivationMode::kExact
                                        : cpu::ActivationMode::kAuto);
}

void AddEngineFlags(CLI::App* cmd, EngineFlags* f) {
  cmd->add_option("--config", f->config_path, "YAML config file (configs/strata.yaml documents every key)");
  cmd->add_option("--kv-block-size", f->kv_block_size, "tokens per KV block")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--kv-dtype", f->kv_dtype, "KV cache element type")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--kv-device-bytes", f->kv_device_bytes,
                  "device KV pool size, e.g. 64M (0 = sized for the context); any --kv-* tier flag runs "
                  "generation through the KV cache");
  cmd->add_option("--kv-host-bytes", f->kv_host_bytes, "host DRAM KV tier size, e.g. 512M (0 = off)");
  cmd->add_option("--kv-disk-path", f->kv_disk_path, "directory of the disk KV tier (kept across runs)");
  cmd->add_option("--kv-disk-bytes", f->kv_disk_bytes, "disk KV tier size, e.g. 4G (0 = off)");
  cmd->add_option("--kv-disk-admit-after", f->kv_disk_admit_after,
                  "hits a block needs before it is written to disk (0 = write every full block)");
  cmd->add_option("--kv-load-policy", f->kv_load_policy,
                  "auto: load cached blocks when cheaper than recomputing; always; never");
  // Stored by CLI11 itself (read back in ResolveEngineFlags), so EngineFlags
  // needs no field for them.
  cmd->add_option("--kv-host-write-policy", CLI::callback_t{},
                  "write-through: copy full blocks to host when committed; write-back: when evicted from device");
  cmd->add_option("--kv-disk-write-policy", CLI::callback_t{},
                  "write-through: copy full blocks to disk when committed; write-back: when evicted from device");
  cmd->add_option("--kv-eviction-policy", CLI::callback_t{},
                  "which cached block the device pool and the lower tiers give up first: s3fifo (default), lru, "
                  "leaf_lru, freq, learned (the device and the host tier share one)");
  cmd->add_option("--kv-prefetch-max-requests", CLI::callback_t{},
                  "waiting requests that may load cached prefixes before admission (0 = off; default 4)");
  cmd->add_option("--kv-lookup-timeout-ms", CLI::callback_t{},
                  "how long a waiting request waits for the KV tiers' answer on its cached prefix before counting it a "
                  "miss (default 50)");
  cmd->add_option("--kv-stop-write-down-seconds", CLI::callback_t{},
                  "at a graceful stop, at most this long writing the device's and host tier's blocks into the disk "
                  "tier so a restart finds them (0 = off; default 30)");
  cmd->add_option("--kv-remote", CLI::callback_t{},
                  "true: a remote tier last in the chain, reading blocks other instances of the cluster hold "
                  "(needs --metadata; same as {kind: remote} in kv.tiers)")
      ->expected(0, 1)
      ->default_str("true");
  cmd->add_option("--kv-host-pin", CLI::callback_t{},
                  "true: page-lock the host tier for device copies when a CUDA device is present (default); false: "
                  "leave it pageable");
  cmd->add_option("--threads", f->threads, "compute threads (0 = all hardware threads)")->check(CLI::Range(0, 1024));
  AddActivationFlags(cmd, &f->int8_activations, &f->exact_activations);
  cmd->add_option("--chat-template", f->chat_template,
                  "chat format: llama2, llama3, llama31, chatml, mistral, plain, ... (default: detect from the model)");
}

bool ResolveEngineFlags(CLI::App* cmd, EngineFlags* f, std::string* model_path, std::string* error) {
  auto unset = [&](const char* flag) { return cmd->count(flag) == 0; };
  auto fail = [&](const Status& s) {
    *error = s.message();
    return false;
  };
  f->kv.block_size = f->kv_block_size;
  f->kv.dtype = f->kv_dtype;
  if (!f->config_path.empty()) {
    auto cfg = Config::LoadFile(f->config_path);
    if (!cfg) return fail(cfg.error());
    std::vector<std::string> known = {"model.path", "model.chat_template", "engine.threads",
                                     "engine.activations"};
    for (const auto& k : kvcache::KvConfigKeys()) known.push_back(k);
    for (const auto& k : f->extra_config_keys) known.push_back(k);
    if (Status s = cfg->CheckKnownKeys(known); !s.ok()) return fail(s);
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
      if (*v < 0 || *v > 1024)
        return fail(Status::InvalidArgument(f->config_path + ": engine.threads out of range [0, 1024]"));
      f->threads = static_cast<int>(*v);
    }
    if (unset("--exact-activations") && unset("--int8-activations")) {
      auto v = cfg->GetString("engine.activations", "auto");
      if (!v) return fail(v.error());
      if (*v != "auto" && *v != "exact" && *v != "int8")
        return fail(Status::InvalidArgument(f->config_path + ": engine.activations must be auto, exact or int8, not '" +
                                            *v + "'"));
      f->activations = *v;
    }
    auto kv = kvcache::KvCacheConfigFromYaml(*cfg, f->kv);
    if (!kv) return fail(kv.error());
    f->kv = *kv;
  }
  // Flags override the file.
  const std::pair<const char*, const std::string*> text_flags[] = {
      {"--kv-block-size", nullptr},
      {"--kv-dtype", &f->kv_dtype},
      {"--kv-device-bytes", &f->kv_device_bytes},
      {"--kv-host-bytes", &f->kv_host_bytes},
      {"--kv-disk-path", &f->kv_disk_path},
      {"--kv-disk-bytes", &f->kv_disk_bytes},
      {"--kv-disk-admit-after", &f->kv_disk_admit_after},
      {"--kv-load-policy", &f->kv_load_policy},
  };
  for (const auto& [flag, value] : text_flags) {
    if (unset(flag)) continue;
    const std::string text = value != nullptr ? *value : std::to_string(f->kv_block_size);
    if (Status s = kvcache::ApplyKvFlag(flag, text, &f->kv); !s.ok()) return fail(s);
  }
  for (const char* flag :
       {"--kv-host-write-policy", "--kv-disk-write-policy", "--kv-prefetch-max-requests", "--kv-lookup-timeout-ms",
        "--kv-stop-write-down-seconds", "--kv-host-pin", "--kv-remote", "--kv-eviction-policy"}) {
    if (unset(flag)) continue;
    std::string text = cmd->get_option(flag)->as<std::string>();
    if (text.empty()) text = "true";  // a bare --kv-remote
    if (Status s = kvcache::ApplyKvFlag(flag, text, &f->kv); !s.ok()) return fail(s);
  }
  f->kv_block_size = f->kv.block_size;
  f->kv_dtype = f->kv.dtype;
  ApplyActivationFlags(f->int8_activations, f->exact_activations, f->activations);
  return true;
}

Result<std::unique_ptr<LoadedModel>> LoadCommandModel(const EngineFlags& f, std::string* model_path) {
  if (model_path->empty()) {
    STRATA_ASSIGN_OR_RETURN(*model_path, EnsureDefaultModel());
  }
  LoadOptions lo;
  lo.chat_template = f.chat_template;
  return LoadModel(*model_path, lo);
}

}  // namespace strata::cli
