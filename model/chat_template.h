#pragma once
// Chat templates: turning an OpenAI-style conversation into the prompt text a
// chat model was trained on.
//
// Strata does not run a Jinja interpreter. It recognises the template a model
// ships (tokenizer_config.json "chat_template" or GGUF
// "tokenizer.chat_template") as one of a fixed set of formats, and renders that
// format in C++. For every supported format the output is byte-for-byte what
// the real template renders under Jinja (transformers' apply_chat_template) for
// conversations of system/user/assistant text messages; the unit tests prove it
// against @huggingface/jinja on the real template texts. See
// docs/chat-templates.md for the formats, detection rules and limits.
//
// BOS: every format except kChatML/kQwen* writes options.bos_token where its
// template does (at the start for Llama-3, Mistral and plain; before each
// [INST] for Llama-2). The engine must tokenize the rendered text with
// special-token parsing and must NOT add another BOS. ChatML/Qwen templates
// write no BOS, and neither do we.
//
// Whitespace trimming (Jinja's `trim`, Python's str.strip) follows Python's
// rules, since the real templates run under Python's Jinja.
//
// Message content is inserted verbatim, as the templates do: text such as
// "<|im_end|>" inside a user message is indistinguishable from the template's
// own markers once rendered.
//
// All functions are pure and thread-safe (kLlama32 reads the clock).

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/chat.h"

namespace strata {

// One concrete prompt format. Several entries belong to one model family when
// that family's real templates disagree on details a model is sensitive to.
enum class ChatTemplateFamily {
  kPlain,         // "plain": Strata's own fallback for models without a known template
  kLlama2,        // "llama2": Llama-2-chat ([INST] <<SYS>> ... [/INST])
  kLlama3,        // "llama3": Meta-Llama-3-Instruct, honours add_generation_prompt
  kLlama3Legacy,  // "llama3-legacy": first Llama-3-Instruct template, which writes the
                  //   assistant header even when add_generation_prompt is false
  kLlama31,       // "llama3.1": Llama-3.1/3.3 system header with knowledge cutoff and
                  //   "Today Date" (default "26 Jul 2024")
  kLlama32,       // "llama3.2": as llama3.1, but the default date is today (local time)
  kChatML,        // "chatml": <|im_start|>role ... <|im_end|>, no default system message
  kQwen2,         // "qwen2": ChatML with default system "You are a helpful assistant."
  kQwen25,        // "qwen2.5": ChatML with default system "You are Qwen, created by ..."
  kQwen3,         // "qwen3": ChatML with Qwen3's <think> handling of assistant turns
  kMistralV1,     // "mistral-v0.1": [INST] u [/INST]a</s> + space; no system role
  kMistralV2,     // "mistral-v0.2": [INST] u [/INST]a</s>; no system role (also Mixtral)
  kMistralV3,     // "mistral-v0.3": [INST] u[/INST] a</s>; system joins the last user turn
  kMistralNemo,   // "mistral-nemo": [INST]u[/INST]a</s>; system joins the last user turn
};

// The canonical name, as accepted by --chat-template: "llama3.1", "mistral-v0.3", ...
std::string_view ChatTemplateFamilyName(ChatTemplateFamily family);

// Parses a canonical name (exact, case-sensitive); "mistral" is also accepted
// as an alias of "mistral-v0.3". nullopt when the name is unknown.
std::optional<ChatTemplateFamily> ChatTemplateFamilyFromName(std::string_view name);

// All formats, in enum order (for help texts and tests).
const std::vector<ChatTemplateFamily>& AllChatTemplateFamilies();

// Picks the format from the model's own Jinja template text by its markers
// ("<|start_header_id|>", "<|im_start|>", "[INST]" with or without "<<SYS>>",
// spacing around [INST], default system prompts, ...). Empty or unrecognised
// text gives kPlain. Never fails; see docs/chat-templates.md for the rules.
ChatTemplateFamily DetectChatTemplate(std::string_view template_text);

struct ChatRenderOptions {
  std::string bos_token;  // the tokenizer's BOS text, e.g. "<s>"; may be empty
  std::string eos_token;  // the tokenizer's EOS text, e.g. "</s>"; may be empty
  // Append the header that makes the model answer as the assistant.
  bool add_generation_prompt = true;
  // kLlama31/kLlama32: the "Today Date" text (e.g. "26 Jul 2024"); empty means
  // the template's default. Ignored by other formats.
  std::string date_string;
  // kQwen3: false appends an empty <think></think> block after the generation
  // prompt, which switches thinking off (Qwen3's enable_thinking=false).
  // Ignored by other formats.
  bool enable_thinking = true;
};

// Renders `messages` in `family`'s format: exactly what the family's reference
// template renders for them. Roles are "system", "user" and "assistant".
//
// Errors (InvalidArgument; "message N" counts from 0 in `messages`):
//   - an empty conversation;
//   - a role other than system/user/assistant (the message names it);
//   - a conversation the real template rejects: Llama-2 and Mistral need
//     user/assistant turns alternating, starting with user, after an optional
//     first system message; Mistral v0.1/v0.2 accept no system message at all.
// Where the real template silently drops a message (Llama-2: a system message
// in an assistant's slot) this function drops it too.
Result<std::string> RenderChat(ChatTemplateFamily family, const std::vector<ChatMessage>& messages,
                               const ChatRenderOptions& options);

}  // namespace strata
