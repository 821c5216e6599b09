// strata generate: one-shot local generation, for checks and scripts.

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/mapped_file.h"
#include "common/thread_pool.h"
#include "kvcache/block_hash.h"
#include "kvcache/disk_store.h"
#include "kvcache/host_store.h"
#include "kvcache/kv_manager.h"
#include "model/generate.h"
#include "model/model_loader.h"
#include "scheduler/cached_generate.h"
#include "tools/commands.h"
#include "tools/kv_stack.h"

namespace strata::cli {

namespace {

struct GenerateFlags {
  EngineFlags engine;
  std::string model;
  std::string prompt;
  std::string messages_file;
  std::vector<int32_t> prompt_tokens;
  int max_tokens = -1;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = -1;
  float min_p = 0.0f;
  int64_t seed = -1;
  float presence_penalty = 0, frequency_penalty = 0, repetition_penalty = 1;
  std::vector<std::string> stop;
  int logprobs = -1;
  bool ignore_eos = false;
  bool json = false;
};

// OpenAI-style messages: [{"role": "...", "content": "..." | [{"type": "text", "text": "..."}]}].
Result<std::vector<ChatMessage>> ReadMessages(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument(path + ": not valid JSON");
  if (!j.is_array()) return Status::InvalidArgument(path + ": expected a JSON array of messages");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& m = j[i];
    std::string where = path + ": message " + std::to_string(i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return Status::InvalidArgument(where + " needs a string 'role'");
    ChatMessage msg;
    msg.role = m["role"].get<std::string>();
    if (!m.contains("content") || m["content"].is_null()) {
      msg.content = "";
    } else if (m["content"].is_string()) {
      msg.content = m["content"].get<std::string>();
    } else if (m["content"].is_array()) {
      for (const auto& part : m["content"]) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          return Status::InvalidArgument(where + ": only content parts of type 'text' are supported");
        msg.content += part["text"].get<std::string>();
      }
    } else {
      return Status::InvalidArgument(where + ": 'content' must be a string or an array of text parts");
    }
    out.push_back(std::move(msg));
  }
  return out;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "strata generate: %s\n", s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

int Run(CLI::App* cmd, GenerateFlags& f) {
  std::string err;
  if (!ResolveEngineFlags(cmd, &f.engine, &f.model, &err)) return Fail(Status::InvalidArgument(err));
  int sources = !f.prompt.empty() + !f.messages_file.empty() + !f.prompt_tokens.empty();
  if (cmd->count("--prompt") > 0 && f.prompt.empty()) sources += 1;  // an explicit empty prompt
  if (sources != 1) return Fail(Status::InvalidArgument("give exactly one of --prompt, --messages, --prompt-tokens"));
  auto loaded = LoadCommandModel(f.engine, &f.model);
  if (!loaded) return Fail(loaded.error());
  LoadedModel& m = **loaded;
  const ModelConfig& c = m.weights.config;

  std::vector<int32_t> prompt;
  if (!f.prompt_tokens.empty()) {
    prompt = f.prompt_tokens;  // used as given
  } else if (!f.messages_file.empty()) {
    auto msgs = ReadMessages(f.messages_file);
    if (!msgs) return Fail(msgs.error());
    auto ids = TokenizeChat(m, *msgs);
    if (!ids) return Fail(ids.error());
    prompt = std::move(*ids);
  } else {
    prompt = TokenizePrompt(m, f.prompt);
  }
  for (int32_t id : prompt)
    if (id < 0 || id >= c.vocab_size)
      return Fail(Status::InvalidArgument("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                          std::to_string(c.vocab_size) + ")"));

  GenerateOptions go;
  go.max_tokens = f.max_tokens;
  go.stop = f.stop;
  go.ignore_eos = f.ignore_eos;
  go.sampling.temperature = f.temperature;
  go.sampling.top_p = f.top_p;
  go.sampling.top_k = f.top_k;
  go.sampling.min_p = f.min_p;
  if (f.seed >= 0) go.sampling.seed = static_cast<uint64_t>(f.seed);
  go.sampling.presence_penalty = f.presence_penalty;
  go.sampling.frequency_penalty = f.frequency_penalty;
  go.sampling.repetition_penalty = f.repetition_penalty;
  if (f.logprobs >= 0) {
    go.sampling.logprobs = true;
    go.sampling.top_logprobs = f.logprobs;
  }
  auto max_tokens = ResolveMaxTokens(static_cast<int>(prompt.size()), f.max_tokens, c.context_length);
  if (!max_tokens) return Fail(max_tokens.error());

  ThreadPool pool(f.engine.threads);
  KvOptions kv;
  kv.block_size = f.engine.kv_block_size;
  kv.dtype = *DTypeFromName(f.engine.kv_dtype);
  int total = static_cast<int>(prompt.size()) + *max_tokens;
  kv.num_blocks = (total + kv.block_size - 1) / kv.block_size;
  const kvcache::KvCacheConfig& kvc = f.engine.kv;
  const bool cached = kvc.tiers_configured;
  if (cached) {
    KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, kv.block_size, kv.dtype};
    auto blocks = DeviceBlocks(kvc, layout, c.context_length, total);
    if (!blocks) return Fail(blocks.error());
    kv.num_blocks = *blocks;
    std::vector<std::string> warnings;
    if (Status s = kvcache::ValidateKvCacheConfig(kvc, layout.block_bytes() * static_cast<uint64_t>(kv.num_blocks),
                                                  &warnings);
        !s.ok())
      return Fail(s);
    for (const auto& w : warnings) STRATA_LOG_WARN("{}", w);
  }
  auto cpu = OpenCpuModel(m, kv, &pool);
  if (!cpu) return Fail(cpu.error());
  CpuModel& model = **cpu;
  STRATA_LOG_INFO("model {} ({}; {} layers, dim {}, vocab {}), {} prompt tokens, kv {} x{} blocks, {} threads", m.id,
                  m.format, c.n_layers, c.dim, c.vocab_size, prompt.size(), f.engine.kv_dtype, kv.num_blocks,
                  pool.num_threads());

  std::function<void(std::string_view)> on_text;
  if (!f.json) {
    on_text = [](std::string_view s) {
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
    };
  }
  std::unique_ptr<KvStack> stack;
  scheduler::CachedGenerateOutput cached_out;
  Result<GenerateOutput> out = GenerateOutput{};
  if (cached) {
    auto st = OpenKvStack(kvc, m, *model.backend, model.pool, *model.forward, kvcache::RealClock());
    if (!st) return Fail(st.error());
    stack = std::move(*st);
    auto r = scheduler::CachedGenerate(*model.forward, *stack->manager, *m.tokenizer, prompt, go, {}, on_text);
    if (!r) return Fail(r.error());
    cached_out = std::move(*r);
    out = std::move(cached_out.gen);
    STRATA_LOG_INFO("kv cache: {} of {} prompt tokens cached (load policy {})", cached_out.cached_tokens,
                    prompt.size(), kvcache::LoadPolicyName(kvc.load_policy));
    stack.reset();  // waits for write-throughs (disk) before the process reports
  } else {
    out = Generate(*model.forward, *m.tokenizer, prompt, go, on_text);
  }
  if (!out) return Fail(out.error());
  if (!f.json) {
    std::fputc('\n', stdout);
    STRATA_LOG_INFO("finish_reason={} prompt {} tok in {:.1f} ms, {} generated in {:.1f} ms", FinishReasonName(out->finish_reason),
                    prompt.size(), out->prefill_seconds * 1e3, out->tokens.size(), out->decode_seconds * 1e3);
    return 0;
  }
  nlohmann::json j;
  j["model"] = m.id;
  j["prompt_tokens"] = prompt;
  j["tokens"] = out->tokens;
  j["text"] = out->text;
  j["finish_reason"] = std::string(FinishReasonName(out->finish_reason));
  if (cached) {
    j["cached_tokens"] = cached_out.cached_tokens;
    nlohmann::json cache = {{"device_hit_tokens", 0}, {"host_hit_tokens", 0}, {"disk_hit_tokens", 0}};
    for (size_t t = 0; t < cached_out.tier_names.size(); ++t)
      cache[cached_out.tier_names[t] + "_hit_tokens"] = cached_out.tier_hit_tokens[t];
    j["cache"] = cache;
  }
  double n_gen = static_cast<double>(out->tokens.size());
  j["timings"] = {
      {"prefill_ms", out->prefill_seconds * 1e3},
      {"decode_ms", out->decode_seconds * 1e3},
      {"prompt_tokens_per_s", out->prefill_seconds > 0 ? prompt.size() / out->prefill_seconds : 0.0},
      {"decode_tokens_per_s", out->decode_seconds > 0 && n_gen > 1 ? (n_gen - 1) / out->decode_seconds : 0.0},
  };
  if (go.sampling.logprobs) {
    nlohmann::json lp = nlohmann::json::array();
    for (const auto& s : out->samples) {
      nlohmann::json top = nlohmann::json::array();
      for (const auto& t : s.top) top.push_back({{"id", t.id}, {"logprob", t.logprob}});
      lp.push_back({{"id", s.token}, {"logprob", s.logprob}, {"top", top}});
    }
    j["logprobs"] = lp;
  }
  std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::printf("%s\n", text.c_str());
  return 0;
}

}  // namespace

void RegisterGenerate(CLI::App& app, int* exit_code) {
  auto f = std::make_shared<GenerateFlags>();
  CLI::App* cmd = app.add_subcommand("generate", "generate text from a prompt with a local model");
  cmd->add_option("--model", f->model, "GGUF file or Hugging Face directory (default: a synthetic model with random weights)");
  cmd->add_option("--prompt", f->prompt, "text prompt");
  cmd->add_option("--messages", f->messages_file, "JSON file with an OpenAI-style messages array (uses the chat template)");
  cmd->add_option("--prompt-tokens", f->prompt_tokens, "prompt as token ids, used as given")->delimiter(',');
  cmd->add_option("--max-tokens", f->max_tokens, "tokens to generate (default: the rest of the context)")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--temperature", f->temperature, "0 = greedy")->check(CLI::Range(0.0, 2.0))->capture_default_str();
  cmd->add_option("--top-p", f->top_p, "nucleus sampling mass, (0, 1]")->capture_default_str();
  cmd->add_option("--top-k", f->top_k, "-1 = off")->capture_default_str();
  cmd->add_option("--min-p", f->min_p, "[0, 1]")->capture_default_str();
  cmd->add_option("--seed", f->seed, "sampling seed (same seed, same output)");
  cmd->add_option("--presence-penalty", f->presence_penalty, "[-2, 2]");
  cmd->add_option("--frequency-penalty", f->frequency_penalty, "[-2, 2]");
  cmd->add_option("--repetition-penalty", f->repetition_penalty, "> 0, 1 = off");
  cmd->add_option("--stop", f->stop, "stop string (repeatable)");
  cmd->add_option("--logprobs", f->logprobs, "include each token's logprob and this many alternatives (0-20)")
      ->check(CLI::Range(0, 20));
  cmd->add_flag("--ignore-eos", f->ignore_eos, "keep generating past end-of-sequence tokens");
  cmd->add_flag("--json", f->json, "print one JSON object instead of streaming text");
  AddEngineFlags(cmd, &f->engine);
  cmd->callback([cmd, f, exit_code] { *exit_code = Run(cmd, *f); });
}

}  // namespace strata::cli
