#pragma once
// Loading a model for serving: a GGUF file or a Hugging Face directory, its
// tokenizer and chat format, and the rules that turn a prompt or a chat into
// the token ids the model is fed.

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/chat.h"
#include "model/chat_template.h"
#include "model/tokenizer/tokenizer.h"
#include "model/weights.h"

namespace strata {

struct LoadOptions {
  // Overrides the chat format detected from the model's template ("llama3",
  // "chatml", ...); empty = detect.
  std::string chat_template;
  // Gives CPU-only copies to the matrices that the activation mode set
  // before loading multiplies faster from them (model/weight_pack.h): Q4_0
  // / Q8_0 packed for the int8 lane kernel, wide rows split into column
  // panels for f32 activations. A loader for another backend (a GPU) sets
  // false: the copies cost host memory and it reads `data`.
  bool pack_weights = true;
};

struct LoadedModel {
  ModelWeights weights;
  std::unique_ptr<Tokenizer> tokenizer;
  ChatTemplateFamily chat_family = ChatTemplateFamily::kPlain;
  std::string path;    // as given
  std::string format;  // "gguf" | "hf"
  // Served model id: the file's or directory's base name without extension.
  std::string id;
  bool synthetic = false;  // random weights (strata model synth)
};

// Loads `path`: a directory is read as a Hugging Face model, anything else as
// GGUF. Errors name the file and the problem.
Result<std::unique_ptr<LoadedModel>> LoadModel(const std::string& path, const LoadOptions& options = {});

// Token ids for a text prompt: BOS first when the tokenizer's config says so,
// special-token text recognised, and never two BOS tokens.
std::vector<int32_t> TokenizePrompt(const LoadedModel& m, std::string_view text);

// Renders `messages` with the model's chat format and tokenizes the result;
// no BOS is added when the rendered text already starts with it.
Result<std::vector<int32_t>> TokenizeChat(const LoadedModel& m, const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt = true);

// Where the quick-start model lives: $STRATA_CACHE_DIR, else
// $XDG_CACHE_HOME/strata, else $HOME/.cache/strata; then models/<name>.gguf.
std::string DefaultModelPath();
// Writes the synthetic default model (preset "tiny", random weights, the
// synthetic vocabulary) to DefaultModelPath() unless it is already there, and
// returns its path. Logs a warning that its weights are random.
Result<std::string> EnsureDefaultModel();

}  // namespace strata
