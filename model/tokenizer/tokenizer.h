#pragma once
// Tokenizer: text <-> token ids for Llama-family vocabularies.
//
// Two algorithms, chosen by TokenizerSpec::model:
//   "llama"  SentencePiece style. Spaces become ▁ (U+2581), a ▁ prefix is
//            added per TokenizerSpec::add_space_prefix/space_prefix_scheme,
//            then pieces are merged over UTF-8 characters: by merge rank when
//            the spec has merges (Hugging Face BPE), else by score, highest
//            first and leftmost on ties (SentencePiece / llama.cpp).
//            Characters left outside the vocabulary become <0xNN> byte tokens
//            (byte_fallback) or unk.
//   "gpt2"   Byte-level BPE: the text is split by the pre-tokenizer regexes
//            (PCRE2, UTF + Unicode properties), each piece's bytes are mapped
//            to printable characters (GPT-2's bytes_to_unicode) and merged by
//            rank.
// Added tokens are matched in the raw text first (leftmost, longest):
// user-defined tokens always, control/unknown tokens only when parse_special.
//
// Thread-safety: a Tokenizer is immutable after Create(); every const method
// may be called from many threads at once. A StreamDecoder is for one thread.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/tokenizer/tokenizer_spec.h"

namespace strata {

// Where the ids being decoded sit in their text ("llama" with a space
// prefix only: Encode() put a ▁ before the text, decoded as a space).
enum class DecodeStart {
  kSequenceStart,  // the ids begin the text: one leading space is removed
  kContinuation,   // the ids continue earlier text (generated tokens): kept
};

namespace tokenizer_internal {
class Vocab;
class SpmModel;
class BpeModel;
class RegexSplitter;
class AddedTokenMatcher;
}  // namespace tokenizer_internal

class Tokenizer {
 public:
  // Validates the spec (ids in range, sizes consistent, merges name pieces
  // of the vocabulary, regexes compile, known model and pre-tokenizer) and
  // builds the lookup tables. Errors name the offending field.
  static Result<std::unique_ptr<Tokenizer>> Create(TokenizerSpec spec);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // add_special: prepend BOS / append EOS as the spec says (add_bos/add_eos).
  // parse_special: control tokens written in the text ("<|im_start|>",
  // "<s>") become those tokens; otherwise they are tokenized as plain text.
  // Any byte string is accepted; invalid UTF-8 is tokenized byte by byte
  // (byte tokens, unk, or the byte-level alphabet).
  std::vector<int32_t> Encode(std::string_view text, bool add_special, bool parse_special) const;

  // Concatenated text of `ids`. skip_special drops control/unknown tokens;
  // otherwise their text is written verbatim. With kSequenceStart ("llama"
  // with a space prefix) one leading space of the result is removed, as
  // SentencePiece and HF do; decode generated tokens with kContinuation.
  // Ill-formed UTF-8 (e.g. a byte-token sequence cut short) becomes U+FFFD,
  // per the WHATWG decoder. An id outside [0, vocab_size()) decodes to U+FFFD.
  std::string Decode(std::span<const int32_t> ids, bool skip_special,
                     DecodeStart start = DecodeStart::kSequenceStart) const;

  // The raw vocabulary entry (e.g. "▁the", "Ġthe", "<0x0A>"); empty for an id
  // out of range.
  std::string_view Piece(int32_t id) const;
  // The id whose vocabulary entry is exactly `piece` (lowest id on duplicates).
  std::optional<int32_t> TokenId(std::string_view piece) const;

  int32_t vocab_size() const;
  int32_t bos_id() const { return spec_.bos_id; }
  int32_t eos_id() const { return spec_.eos_id; }
  bool add_bos() const { return spec_.add_bos; }
  bool add_eos() const { return spec_.add_eos; }
  // End of generation: eos or one of spec().eog_ids.
  bool IsEog(int32_t id) const;
  // Control or unknown token (what skip_special drops). False out of range.
  bool IsSpecial(int32_t id) const;
  // The token's TokenType after defaults are applied (undefined -> normal;
  // types derived when the spec has none); kTokenTypeUnused out of range.
  int32_t token_type(int32_t id) const;
  const TokenizerSpec& spec() const { return spec_; }

 private:
  friend class StreamDecoder;
  explicit Tokenizer(TokenizerSpec spec);
  Status Init();
  void EncodeTextLlama(std::string_view text, bool at_input_start, std::vector<int32_t>* out) const;
  void EncodeTextByteLevel(std::string_view text, std::vector<int32_t>* out) const;
  // Bytes Decode writes for `id` before the leading-space rule and UTF-8
  // repair: nullptr when skip_special drops it.
  const std::string* DecodedBytes(int32_t id, bool skip_special) const;
  bool StripsLeadingSpace() const;

  TokenizerSpec spec_;
  std::unique_ptr<tokenizer_internal::Vocab> vocab_;
  std::unique_ptr<tokenizer_internal::SpmModel> spm_;                     // "llama" without merges
  std::unique_ptr<tokenizer_internal::BpeModel> bpe_;                     // merges present
  std::unique_ptr<tokenizer_internal::RegexSplitter> pre_;                // "gpt2"
  std::unique_ptr<tokenizer_internal::AddedTokenMatcher> always_tokens_;  // user-defined
  std::unique_ptr<tokenizer_internal::AddedTokenMatcher> all_added_;      // + control/unknown
};

// Streaming detokenization for one sequence. Push() returns the text that is
// complete so far: the bytes of a UTF-8 sequence that is not yet complete are
// held back until a later token completes it. Flush() returns what is left
// (an incomplete sequence as U+FFFD). The concatenation of every Push() and
// the final Flush() equals Tokenizer::Decode() of all the ids with the same
// skip_special and start, and is always valid UTF-8. The default start,
// kContinuation, suits generated tokens that follow a prompt (" there" stays
// " there"). The Tokenizer must outlive the decoder.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = true,
                         DecodeStart start = DecodeStart::kContinuation);
  std::string Push(int32_t id);
  std::string Flush();
  // What Push has held back (bytes of an incomplete UTF-8 sequence) and
  // whether nothing was produced yet from a kSequenceStart, to continue the
  // stream in another decoder: Restore(held(), at_start()) on a fresh one
  // makes its next Push/Flush return what this one's would.
  const std::string& held() const { return pending_; }
  bool at_start() const { return at_start_; }
  void Restore(std::string held, bool at_start) {
    pending_ = std::move(held);
    at_start_ = at_start;
  }

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  bool at_start_;        // kSequenceStart and no byte produced yet
  std::string pending_;  // bytes of an incomplete UTF-8 sequence
};

}  // namespace strata
