#include "model/tokenizer/pretokenizer.h"

#include <pcre2.h>

#include "model/tokenizer/unicode.h"

namespace strata::tokenizer_internal {

const char* const kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

Result<std::vector<std::string>> PreTokenizerRegexes(std::string_view pre) {
  if (pre.empty() || pre == "default" || pre == "gpt2" || pre == "gpt-2") {
    return std::vector<std::string>{kGpt2Regex};
  }
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "smaug-bpe") {
    return std::vector<std::string>{kLlama3Regex};
  }
  if (pre == "qwen2" || pre == "deepseek-r1-qwen") return std::vector<std::string>{kQwen2Regex};
  return Status::Unsupported("pre-tokenizer '" + std::string(pre) +
                             "' is not supported (known: default, gpt2, llama-bpe, qwen2)");
}

namespace {
pcre2_code* Code(void* p) { return static_cast<pcre2_code*>(p); }
}  // namespace

Result<std::unique_ptr<RegexSplitter>> RegexSplitter::Create(
    const std::vector<std::string>& patterns) {
  auto splitter = std::unique_ptr<RegexSplitter>(new RegexSplitter());
  for (const std::string& pattern : patterns) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return Status::InvalidArgument("pre-tokenizer regex '" + pattern + "' at offset " +
                                     std::to_string(offset) + ": " +
                                     reinterpret_cast<const char*>(msg));
    }
    // Without JIT pcre2_match() interprets the pattern: slower, same result.
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    splitter->codes_.push_back(code);
  }
  return splitter;
}

RegexSplitter::~RegexSplitter() {
  for (void* c : codes_) pcre2_code_free(Code(c));
}

std::vector<std::string_view> RegexSplitter::Split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (text.empty()) return pieces;
  pieces.push_back(text);
  if (codes_.empty()) return pieces;

  // Per call, so that concurrent callers share nothing mutable. The JIT
  // stack may grow to 8 MiB for long runs that backtrack.
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* mctx = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  if (jit_stack != nullptr) pcre2_jit_stack_assign(mctx, nullptr, jit_stack);

  std::vector<std::string_view> next;
  for (void* code : codes_) {
    next.clear();
    for (std::string_view piece : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t start = 0, last = 0;
      while (start < piece.size()) {
        const int rc = pcre2_match(Code(code), subject, piece.size(), start, 0, md, mctx);
        // A match error (resource limits) leaves the rest of the piece whole
        // rather than failing the request.
        if (rc < 0) break;
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t s = ov[0], e = ov[1];
        if (e <= s) {  // empty match: move on one character
          start = s + Utf8CharLen(piece, s < piece.size() ? s : piece.size() - 1);
          continue;
        }
        if (s > last) next.push_back(piece.substr(last, s - last));
        next.push_back(piece.substr(s, e - s));
        last = start = e;
      }
      if (last < piece.size()) next.push_back(piece.substr(last));
    }
    pieces.swap(next);
  }
  if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
  pcre2_match_context_free(mctx);
  pcre2_match_data_free(md);
  return pieces;
}

}  // namespace strata::tokenizer_internal
