#include "model/chat_template.h"

#include <array>
#include <cstdint>
#include <ctime>
#include <utility>

namespace strata {
namespace {

struct FamilyInfo {
  ChatTemplateFamily family;
  std::string_view name;
};

constexpr std::array<FamilyInfo, 14> kFamilies = {{
    {ChatTemplateFamily::kPlain, "plain"},
    {ChatTemplateFamily::kLlama2, "llama2"},
    {ChatTemplateFamily::kLlama3, "llama3"},
    {ChatTemplateFamily::kLlama3Legacy, "llama3-legacy"},
    {ChatTemplateFamily::kLlama31, "llama3.1"},
    {ChatTemplateFamily::kLlama32, "llama3.2"},
    {ChatTemplateFamily::kChatML, "chatml"},
    {ChatTemplateFamily::kQwen2, "qwen2"},
    {ChatTemplateFamily::kQwen25, "qwen2.5"},
    {ChatTemplateFamily::kQwen3, "qwen3"},
    {ChatTemplateFamily::kMistralV1, "mistral-v0.1"},
    {ChatTemplateFamily::kMistralV2, "mistral-v0.2"},
    {ChatTemplateFamily::kMistralV3, "mistral-v0.3"},
    {ChatTemplateFamily::kMistralNemo, "mistral-nemo"},
}};

// The default system prompts Qwen2 and Qwen2.5 templates write when the
// conversation has none. Detection keys on them too.
constexpr std::string_view kQwen2DefaultSystem = "You are a helpful assistant.";
constexpr std::string_view kQwen25DefaultSystem =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// Llama-3.1 templates default date_string to this when the caller gives none.
constexpr std::string_view kLlama31DefaultDate = "26 Jul 2024";

enum class Role { kSystem, kUser, kAssistant };

bool Contains(std::string_view text, std::string_view needle) {
  return text.find(needle) != std::string_view::npos;
}

// True when `text` contains `word` immediately followed by a closing quote of
// either kind, i.e. a string literal that ends with it.
bool ContainsLiteralEnding(std::string_view text, std::string_view word) {
  for (char quote : {'\'', '"'}) {
    std::string needle(word);
    needle += quote;
    if (Contains(text, needle)) return true;
  }
  return false;
}

// True when `text` contains a string literal that starts with `word`.
bool ContainsLiteralStarting(std::string_view text, std::string_view word) {
  for (char quote : {'\'', '"'}) {
    std::string needle(1, quote);
    needle += word;
    if (Contains(text, needle)) return true;
  }
  return false;
}

// ---- Python string semantics ------------------------------------------------
// Chat templates run under Python's Jinja, so `| trim`, `.strip()` and
// `.strip('\n')` follow Python's str methods: whitespace is what str.isspace()
// accepts, over Unicode code points.

bool IsPythonSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Decodes the UTF-8 code point at s[pos]; returns its length in bytes, or 0 when
// the bytes there are not valid UTF-8 (they then count as non-whitespace).
size_t DecodeUtf8(std::string_view s, size_t pos, uint32_t* cp) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t b0 = byte(pos);
  size_t len;
  uint32_t value;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  } else if ((b0 & 0xE0) == 0xC0) {
    len = 2;
    value = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3;
    value = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4;
    value = b0 & 0x07;
  } else {
    return 0;
  }
  if (pos + len > s.size()) return 0;
  for (size_t i = 1; i < len; ++i) {
    if ((byte(pos + i) & 0xC0) != 0x80) return 0;
    value = (value << 6) | (byte(pos + i) & 0x3F);
  }
  *cp = value;
  return len;
}

std::string_view PyLstrip(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    uint32_t cp = 0;
    const size_t len = DecodeUtf8(s, pos, &cp);
    if (len == 0 || !IsPythonSpace(cp)) break;
    pos += len;
  }
  return s.substr(pos);
}

std::string_view PyRstrip(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    // Step back to the first byte of the last code point (at most 3
    // continuation bytes), then check it decodes to exactly the tail.
    size_t start = end - 1;
    while (start > 0 && end - start < 4 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
    uint32_t cp = 0;
    const size_t len = DecodeUtf8(s, start, &cp);
    if (len == 0 || start + len != end || !IsPythonSpace(cp)) break;
    end = start;
  }
  return s.substr(0, end);
}

// Python's str.strip() and Jinja's `trim` filter.
std::string_view PyStrip(std::string_view s) { return PyRstrip(PyLstrip(s)); }

// Python's str.lstrip('\n') / rstrip('\n').
std::string_view LstripNewlines(std::string_view s) {
  const size_t pos = s.find_first_not_of('\n');
  return pos == std::string_view::npos ? std::string_view() : s.substr(pos);
}
std::string_view RstripNewlines(std::string_view s) {
  const size_t pos = s.find_last_not_of('\n');
  return pos == std::string_view::npos ? std::string_view() : s.substr(0, pos + 1);
}

// ---- Validation --------------------------------------------------------------

Result<std::vector<Role>> ParseRoles(const std::vector<ChatMessage>& messages) {
  if (messages.empty())
    return Status::InvalidArgument("chat template: the conversation has no messages");
  std::vector<Role> roles;
  roles.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role == "system") {
      roles.push_back(Role::kSystem);
    } else if (role == "user") {
      roles.push_back(Role::kUser);
    } else if (role == "assistant") {
      roles.push_back(Role::kAssistant);
    } else {
      return Status::InvalidArgument("chat template: message " + std::to_string(i) +
                                     " has unknown role '" + role +
                                     "' (supported: system, user, assistant)");
    }
  }
  return roles;
}

Status AlternationError(ChatTemplateFamily family, size_t index, const std::string& role) {
  return Status::InvalidArgument(
      "chat template " + std::string(ChatTemplateFamilyName(family)) + ": message " +
      std::to_string(index) + " is '" + role +
      "', but roles must alternate user/assistant/user/... after an optional first system "
      "message");
}

Status NoSystemRoleError(ChatTemplateFamily family, size_t index) {
  return Status::InvalidArgument("chat template " + std::string(ChatTemplateFamilyName(family)) +
                                 ": message " + std::to_string(index) +
                                 " is 'system', but this format supports only user and "
                                 "assistant messages");
}

// ---- Renderers ---------------------------------------------------------------
// Each mirrors one reference template, statement by statement; the comments name
// the template behaviour being reproduced where it is not obvious.

Result<std::string> RenderLlama2(const std::vector<ChatMessage>& messages,
                                 const std::vector<Role>& roles, const ChatRenderOptions& opt) {
  const bool has_system = roles[0] == Role::kSystem;
  const size_t first = has_system ? 1 : 0;
  std::string out;
  for (size_t i = first; i < messages.size(); ++i) {
    const size_t loop_index = i - first;
    const bool expect_user = loop_index % 2 == 0;
    if ((roles[i] == Role::kUser) != expect_user) {
      return AlternationError(ChatTemplateFamily::kLlama2, i, messages[i].role);
    }
    std::string content;
    if (loop_index == 0 && has_system) {
      content = "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n" + messages[i].content;
    } else {
      content = messages[i].content;
    }
    if (roles[i] == Role::kUser) {
      out += opt.bos_token;
      out += "[INST] ";
      out += PyStrip(content);
      out += " [/INST]";
    } else if (roles[i] == Role::kAssistant) {
      out += ' ';
      out += PyStrip(content);
      out += ' ';
      out += opt.eos_token;
    }
    // A system message in an assistant's slot passes the alternation check and
    // then matches no branch of the template: it renders nothing.
  }
  return out;
}

void AppendLlama3Turn(std::string& out, std::string_view role, std::string_view content) {
  out += "<|start_header_id|>";
  out += role;
  out += "<|end_header_id|>\n\n";
  out += PyStrip(content);
  out += "<|eot_id|>";
}

constexpr std::string_view kLlama3AssistantHeader =
    "<|start_header_id|>assistant<|end_header_id|>\n\n";

std::string RenderLlama3(const std::vector<ChatMessage>& messages, const ChatRenderOptions& opt,
                         bool always_generation_prompt) {
  std::string out = opt.bos_token;
  for (const ChatMessage& m : messages) AppendLlama3Turn(out, m.role, m.content);
  if (opt.add_generation_prompt || always_generation_prompt) out += kLlama3AssistantHeader;
  return out;
}

std::string TodayDateString() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[32];
  const size_t n = std::strftime(buf, sizeof(buf), "%d %b %Y", &local);
  return std::string(buf, n);
}

std::string RenderLlama31(const std::vector<ChatMessage>& messages, const std::vector<Role>& roles,
                          const ChatRenderOptions& opt, bool default_date_is_today) {
  std::string date = opt.date_string;
  if (date.empty())
    date = default_date_is_today ? TodayDateString() : std::string(kLlama31DefaultDate);
  const bool has_system = roles[0] == Role::kSystem;
  std::string out = opt.bos_token;
  out += "<|start_header_id|>system<|end_header_id|>\n\n";
  out += "Cutting Knowledge Date: December 2023\n";
  out += "Today Date: " + date + "\n\n";
  if (has_system) out += PyStrip(messages[0].content);
  out += "<|eot_id|>";
  for (size_t i = has_system ? 1 : 0; i < messages.size(); ++i) {
    AppendLlama3Turn(out, messages[i].role, messages[i].content);
  }
  if (opt.add_generation_prompt) out += kLlama3AssistantHeader;
  return out;
}

void AppendChatMLTurn(std::string& out, std::string_view role, std::string_view content) {
  out += "<|im_start|>";
  out += role;
  out += '\n';
  out += content;
  out += "<|im_end|>\n";
}

// Plain ChatML, and Qwen2/Qwen2.5 when `default_system` is not empty: those
// write it as a system turn when the conversation does not open with one.
std::string RenderChatML(const std::vector<ChatMessage>& messages, const std::vector<Role>& roles,
                         const ChatRenderOptions& opt, std::string_view default_system) {
  std::string out;
  if (!default_system.empty() && roles[0] != Role::kSystem) {
    AppendChatMLTurn(out, "system", default_system);
  }
  for (const ChatMessage& m : messages) AppendChatMLTurn(out, m.role, m.content);
  if (opt.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}
bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string RenderQwen3(const std::vector<ChatMessage>& messages, const std::vector<Role>& roles,
                        const ChatRenderOptions& opt) {
  constexpr std::string_view kThinkOpen = "<think>";
  constexpr std::string_view kThinkClose = "</think>";
  std::string out;
  if (roles[0] == Role::kSystem) AppendChatMLTurn(out, "system", messages[0].content);

  // The last "real" user query: the latest user message that is not a wrapped
  // tool response. Only assistant turns after it keep their reasoning.
  size_t last_query = messages.size() - 1;
  for (size_t i = messages.size(); i-- > 0;) {
    const std::string& c = messages[i].content;
    if (roles[i] == Role::kUser &&
        !(StartsWith(c, "<tool_response>") && EndsWith(c, "</tool_response>"))) {
      last_query = i;
      break;
    }
  }

  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string_view full = messages[i].content;
    if (roles[i] == Role::kUser || (roles[i] == Role::kSystem && i != 0)) {
      AppendChatMLTurn(out, messages[i].role, full);
      continue;
    }
    if (roles[i] != Role::kAssistant) continue;  // the first system turn, written above
    std::string_view content = full;
    std::string_view reasoning;
    const size_t first_close = full.find(kThinkClose);
    if (first_close != std::string_view::npos) {
      // content.split('</think>')[-1].lstrip('\n')
      content = LstripNewlines(full.substr(full.rfind(kThinkClose) + kThinkClose.size()));
      // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
      std::string_view before = RstripNewlines(full.substr(0, first_close));
      const size_t open = before.rfind(kThinkOpen);
      if (open != std::string_view::npos) before = before.substr(open + kThinkOpen.size());
      reasoning = LstripNewlines(before);
    }
    out += "<|im_start|>assistant\n";
    const bool is_last = i + 1 == messages.size();
    if (i > last_query && (is_last || !reasoning.empty())) {
      out += "<think>\n";
      out += RstripNewlines(LstripNewlines(reasoning));
      out += "\n</think>\n\n";
      out += LstripNewlines(content);
    } else {
      out += content;
    }
    out += "<|im_end|>\n";
  }
  if (opt.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!opt.enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

// Mistral v0.1 / v0.2: no system role, [INST] with spaces inside, the answer
// right after [/INST]. v0.1 puts a space after each </s>.
Result<std::string> RenderMistralLegacy(ChatTemplateFamily family,
                                        const std::vector<ChatMessage>& messages,
                                        const std::vector<Role>& roles,
                                        const ChatRenderOptions& opt) {
  std::string out = opt.bos_token;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (roles[i] == Role::kSystem) return NoSystemRoleError(family, i);
    if ((roles[i] == Role::kUser) != (i % 2 == 0)) {
      return AlternationError(family, i, messages[i].role);
    }
    if (roles[i] == Role::kUser) {
      out += "[INST] " + messages[i].content + " [/INST]";
    } else {
      out += messages[i].content + opt.eos_token;
      if (family == ChatTemplateFamily::kMistralV1) out += ' ';
    }
  }
  return out;
}

// Mistral v0.3 and Nemo: an optional first system message is prepended to the
// final message when that is a user turn (and dropped otherwise, as the
// templates do). v0.3 writes "[INST] x[/INST] answer</s>" with the answer
// trimmed; Nemo writes "[INST]x[/INST]answer</s>" verbatim.
Result<std::string> RenderMistralV3(ChatTemplateFamily family,
                                    const std::vector<ChatMessage>& messages,
                                    const std::vector<Role>& roles, const ChatRenderOptions& opt) {
  const bool nemo = family == ChatTemplateFamily::kMistralNemo;
  const bool has_system = roles[0] == Role::kSystem;
  const size_t first = has_system ? 1 : 0;
  // The templates check alternation over every turn before writing anything.
  for (size_t i = first; i < messages.size(); ++i) {
    if ((roles[i] == Role::kUser) != ((i - first) % 2 == 0)) {
      return AlternationError(family, i, messages[i].role);
    }
  }
  std::string out = opt.bos_token;
  const std::string_view inst_open = nemo ? "[INST]" : "[INST] ";
  for (size_t i = first; i < messages.size(); ++i) {
    if (roles[i] == Role::kUser) {
      out += inst_open;
      if (has_system && i + 1 == messages.size()) {
        out += messages[0].content;
        out += "\n\n";
      }
      out += messages[i].content;
      out += "[/INST]";
    } else if (roles[i] == Role::kAssistant) {
      if (nemo) {
        out += messages[i].content;
      } else {
        out += ' ';
        out += PyStrip(messages[i].content);
      }
      out += opt.eos_token;
    } else {
      return NoSystemRoleError(family, i);
    }
  }
  return out;
}

std::string RenderPlain(const std::vector<ChatMessage>& messages, const ChatRenderOptions& opt) {
  std::string out = opt.bos_token;
  for (const ChatMessage& m : messages) out += m.role + ": " + m.content + "\n";
  if (opt.add_generation_prompt) out += "assistant:";
  return out;
}

}  // namespace

std::string_view ChatTemplateFamilyName(ChatTemplateFamily family) {
  for (const FamilyInfo& info : kFamilies) {
    if (info.family == family) return info.name;
  }
  return "unknown";
}

std::optional<ChatTemplateFamily> ChatTemplateFamilyFromName(std::string_view name) {
  for (const FamilyInfo& info : kFamilies) {
    if (info.name == name) return info.family;
  }
  if (name == "mistral") return ChatTemplateFamily::kMistralV3;
  return std::nullopt;
}

const std::vector<ChatTemplateFamily>& AllChatTemplateFamilies() {
  static const std::vector<ChatTemplateFamily> kAll = [] {
    std::vector<ChatTemplateFamily> all;
    for (const FamilyInfo& info : kFamilies) all.push_back(info.family);
    return all;
  }();
  return kAll;
}

ChatTemplateFamily DetectChatTemplate(std::string_view text) {
  if (Contains(text, "<|start_header_id|>")) {
    if (Contains(text, "Cutting Knowledge Date")) {
      return Contains(text, "strftime_now") ? ChatTemplateFamily::kLlama32
                                            : ChatTemplateFamily::kLlama31;
    }
    // The first Llama-3-Instruct template never reads add_generation_prompt.
    return Contains(text, "add_generation_prompt") ? ChatTemplateFamily::kLlama3
                                                   : ChatTemplateFamily::kLlama3Legacy;
  }
  if (Contains(text, "<|im_start|>")) {
    if (Contains(text, "enable_thinking") || Contains(text, "reasoning_content")) {
      return ChatTemplateFamily::kQwen3;
    }
    if (Contains(text, kQwen25DefaultSystem)) return ChatTemplateFamily::kQwen25;
    if (Contains(text, kQwen2DefaultSystem)) return ChatTemplateFamily::kQwen2;
    return ChatTemplateFamily::kChatML;
  }
  if (Contains(text, "[INST]")) {
    if (Contains(text, "<<SYS>>")) return ChatTemplateFamily::kLlama2;
    // Tekken-era templates (Nemo) write "[INST]" with no space after it.
    if (ContainsLiteralEnding(text, "[INST]")) return ChatTemplateFamily::kMistralNemo;
    // v0.1/v0.2 put a space before [/INST]; v0.3 does not.
    if (ContainsLiteralStarting(text, " [/INST]")) {
      return Contains(text, "eos_token + ' '") || Contains(text, "eos_token + \" \"")
                 ? ChatTemplateFamily::kMistralV1
                 : ChatTemplateFamily::kMistralV2;
    }
    return ChatTemplateFamily::kMistralV3;
  }
  return ChatTemplateFamily::kPlain;
}

Result<std::string> RenderChat(ChatTemplateFamily family, const std::vector<ChatMessage>& messages,
                               const ChatRenderOptions& options) {
  STRATA_ASSIGN_OR_RETURN(std::vector<Role> roles, ParseRoles(messages));
  switch (family) {
    case ChatTemplateFamily::kPlain:
      return RenderPlain(messages, options);
    case ChatTemplateFamily::kLlama2:
      return RenderLlama2(messages, roles, options);
    case ChatTemplateFamily::kLlama3:
      return RenderLlama3(messages, options, /*always_generation_prompt=*/false);
    case ChatTemplateFamily::kLlama3Legacy:
      return RenderLlama3(messages, options, /*always_generation_prompt=*/true);
    case ChatTemplateFamily::kLlama31:
      return RenderLlama31(messages, roles, options, /*default_date_is_today=*/false);
    case ChatTemplateFamily::kLlama32:
      return RenderLlama31(messages, roles, options, /*default_date_is_today=*/true);
    case ChatTemplateFamily::kChatML:
      return RenderChatML(messages, roles, options, "");
    case ChatTemplateFamily::kQwen2:
      return RenderChatML(messages, roles, options, kQwen2DefaultSystem);
    case ChatTemplateFamily::kQwen25:
      return RenderChatML(messages, roles, options, kQwen25DefaultSystem);
    case ChatTemplateFamily::kQwen3:
      return RenderQwen3(messages, roles, options);
    case ChatTemplateFamily::kMistralV1:
    case ChatTemplateFamily::kMistralV2:
      return RenderMistralLegacy(family, messages, roles, options);
    case ChatTemplateFamily::kMistralV3:
    case ChatTemplateFamily::kMistralNemo:
      return RenderMistralV3(family, messages, roles, options);
  }
  return Status::InvalidArgument("chat template: unknown format value " +
                                 std::to_string(static_cast<int>(family)));
}

}  // namespace strata
