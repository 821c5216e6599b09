// strata eval kld: how far a model's next-token distributions are from a
// reference model's on the same text (model/eval_kld.h).

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/mapped_file.h"
#include "common/thread_pool.h"
#include "model/eval_kld.h"
#include "model/model_loader.h"
#include "tools/commands.h"

namespace strata::cli {

namespace {

struct KldFlags {
  std::string model, reference, text_path;
  int context = 0, chunks = 0, threads = 0;
  bool int8_activations = false, exact_activations = false, json = false;
};

int Fail(const Status& s) {
  std::fprintf(stderr, "strata eval kld: %s\n", s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

// Plain text, as llama-perplexity reads it: BOS when the tokenizer adds one,
// and special-token spellings ("<s>") kept as text.
std::vector<int32_t> TokenizeText(const LoadedModel& m, const std::string& text) {
  return m.tokenizer->Encode(text, /*add_special=*/true, /*parse_special=*/false);
}

int RunKld(const KldFlags& f) {
  // Both models: a quantized reference is judged the same way.
  ApplyActivationFlags(f.int8_activations, f.exact_activations);
  std::string text;
  if (f.text_path.empty()) {
    text = DefaultEvalText();
  } else {
    auto t = ReadFileToString(f.text_path);
    if (!t) return Fail(t.error().WithContext("--text " + f.text_path));
    text = std::move(*t);
  }
  auto model = LoadModel(f.model);
  if (!model) return Fail(model.error().WithContext("--model " + f.model));
  auto ref = LoadModel(f.reference);
  if (!ref) return Fail(ref.error().WithContext("--reference " + f.reference));
  std::vector<int32_t> tokens = TokenizeText(**ref, text);
  if (TokenizeText(**model, text) != tokens)
    return Fail(Status::InvalidArgument("the model and the reference tokenize the text differently "
                                        "(different vocabularies); KL divergence needs the same one"));
  KldOptions opt;
  const int max_ctx = std::min((*model)->weights.config.context_length, (*ref)->weights.config.context_length);
  opt.context = f.context > 0 ? f.context : std::min(512, max_ctx);
  opt.max_chunks = f.chunks;
  opt.bos_id = (*ref)->tokenizer->add_bos() ? (*ref)->tokenizer->bos_id() : -1;
  ThreadPool pool(f.threads);  // 0 = the machine's threads
  auto r = EvaluateKld((*model)->weights, (*ref)->weights, tokens, opt, &pool);
  if (!r) return Fail(r.error());
  if (f.json) {
    nlohmann::json j = {{"model", f.model},
                        {"reference", f.reference},
                        {"text", f.text_path.empty() ? "default" : f.text_path},
                        {"text_tokens", tokens.size()},
                        {"context", opt.context},
                        {"chunks", r->chunks},
                        {"positions", r->positions},
                        {"mean_kld", r->mean_kld},
                        {"p99_kld", r->p99_kld},
                        {"max_kld", r->max_kld},
                        {"top1_agreement", r->top1_agreement},
                        {"model_ppl", r->model_ppl},
                        {"reference_ppl", r->reference_ppl}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("positions        %lld (%d chunks of %d tokens, second halves scored; text %zu tokens)\n",
              static_cast<long long>(r->positions), r->chunks, opt.context, tokens.size());
  std::printf("mean KLD         %.6g\n", r->mean_kld);
  std::printf("p99 / max KLD    %.6g / %.6g\n", r->p99_kld, r->max_kld);
  std::printf("top-1 agreement  %.4f\n", r->top1_agreement);
  std::printf("perplexity       model %.4f, reference %.4f\n", r->model_ppl, r->reference_ppl);
  return 0;
}

}  // namespace

void RegisterEval(CLI::App& app, int* exit_code) {
  CLI::App* eval = app.add_subcommand("eval", "measure a model's accuracy against a reference");
  eval->require_subcommand(1);
  auto f = std::make_shared<KldFlags>();
  CLI::App* kld = eval->add_subcommand(
      "kld", "KL divergence and top-1 agreement of next-token distributions against a reference model");
  kld->add_option("--model", f->model, "the model judged (GGUF file or Hugging Face directory)")->required();
  kld->add_option("--reference", f->reference, "the reference model, e.g. the f32 original")->required();
  kld->add_option("--text", f->text_path, "text file to evaluate on (default: the project's own story text)");
  kld->add_option("--context", f->context, "tokens per chunk (0 = min(512, context length))")
      ->check(CLI::NonNegativeNumber);
  kld->add_option("--chunks", f->chunks, "at most this many chunks (0 = all the text holds)")
      ->check(CLI::NonNegativeNumber);
  kld->add_option("--threads", f->threads, "threads (0 = all)")->check(CLI::NonNegativeNumber);
  AddActivationFlags(kld, &f->int8_activations, &f->exact_activations);
  kld->add_flag("--json", f->json, "print one JSON object");
  kld->callback([f, exit_code] { *exit_code = RunKld(*f); });

  auto words = std::make_shared<int>(6000);
  CLI::App* text = eval->add_subcommand("text", "print the default evaluation text (to give other tools the same text)");
  text->add_option("--words", *words, "about this many words")->check(CLI::PositiveNumber)->capture_default_str();
  text->callback([words, exit_code] {
    std::fputs(DefaultEvalText(*words).c_str(), stdout);
    std::fputs("\n", stdout);
    *exit_code = 0;
  });
}

}  // namespace strata::cli
