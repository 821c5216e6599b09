#include "model/tokenizer/tokenizer.h"

#include <algorithm>

#include "model/tokenizer/added_tokens.h"
#include "model/tokenizer/bpe.h"
#include "model/tokenizer/pretokenizer.h"
#include "model/tokenizer/spm.h"
#include "model/tokenizer/unicode.h"
#include "model/tokenizer/vocab.h"

namespace strata {

using tokenizer_internal::AddedTokenMatcher;
using tokenizer_internal::BpeModel;
using tokenizer_internal::ByteToUnicode;
using tokenizer_internal::kReplacementChar;
using tokenizer_internal::kSpaceMarker;
using tokenizer_internal::RegexSplitter;
using tokenizer_internal::SpmModel;
using tokenizer_internal::Symbol;
using tokenizer_internal::Utf8CharLen;
using tokenizer_internal::Vocab;

namespace {

Status ValidateSpec(const TokenizerSpec& s) {
  if (s.model != "llama" && s.model != "gpt2") {
    return Status::Unsupported("tokenizer model '" + s.model +
                               "' is not supported (expected 'llama' or 'gpt2')");
  }
  if (s.tokens.empty()) return Status::InvalidArgument("tokenizer has no tokens");
  if (s.tokens.size() > static_cast<size_t>(INT32_MAX)) {
    return Status::InvalidArgument("tokenizer has more than 2^31-1 tokens");
  }
  const size_t n = s.tokens.size();
  if (!s.scores.empty() && s.scores.size() != n) {
    return Status::InvalidArgument("tokenizer has " + std::to_string(s.scores.size()) +
                                   " scores for " + std::to_string(n) + " tokens");
  }
  if (!s.token_types.empty() && s.token_types.size() != n) {
    return Status::InvalidArgument("tokenizer has " + std::to_string(s.token_types.size()) +
                                   " token types for " + std::to_string(n) + " tokens");
  }
  for (size_t i = 0; i < s.token_types.size(); ++i) {
    if (s.token_types[i] < kTokenTypeUndefined || s.token_types[i] > kTokenTypeByte) {
      return Status::InvalidArgument("token " + std::to_string(i) + " has unknown type " +
                                     std::to_string(s.token_types[i]));
    }
  }
  auto check_id = [&](const char* what, int32_t id) -> Status {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      return Status::InvalidArgument(std::string(what) + " " + std::to_string(id) +
                                     " is outside the vocabulary of " + std::to_string(n));
    }
    return Status::Ok();
  };
  STRATA_RETURN_IF_ERROR(check_id("bos id", s.bos_id));
  STRATA_RETURN_IF_ERROR(check_id("eos id", s.eos_id));
  STRATA_RETURN_IF_ERROR(check_id("unk id", s.unk_id));
  STRATA_RETURN_IF_ERROR(check_id("pad id", s.pad_id));
  for (int32_t id : s.eog_ids) {
    STRATA_RETURN_IF_ERROR(check_id("end-of-generation id", id));
    if (id < 0) return Status::InvalidArgument("end-of-generation id -1");
  }
  if (s.add_bos && s.bos_id < 0) return Status::InvalidArgument("add_bos is set but bos id is -1");
  if (s.add_eos && s.eos_id < 0) return Status::InvalidArgument("add_eos is set but eos id is -1");
  if (s.model == "llama") {
    if (s.merges.empty() && s.scores.empty()) {
      return Status::InvalidArgument("a 'llama' tokenizer needs scores or merges");
    }
    if (s.space_prefix_scheme != "" && s.space_prefix_scheme != "always" &&
        s.space_prefix_scheme != "first") {
      return Status::InvalidArgument("space_prefix_scheme '" + s.space_prefix_scheme +
                                     "' is not one of '', 'always', 'first'");
    }
  }
  return Status::Ok();
}

bool IsLlama3Pre(std::string_view pre) {
  return pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "smaug-bpe";
}

const std::string& ReplacementString() {
  static const std::string s(kReplacementChar);
  return s;
}

}  // namespace

Tokenizer::Tokenizer(TokenizerSpec spec) : spec_(std::move(spec)) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::Create(TokenizerSpec spec) {
  STRATA_RETURN_IF_ERROR(ValidateSpec(spec));
  auto tok = std::unique_ptr<Tokenizer>(new Tokenizer(std::move(spec)));
  STRATA_RETURN_IF_ERROR(tok->Init());
  return tok;
}

Status Tokenizer::Init() {
  STRATA_ASSIGN_OR_RETURN(Vocab vocab, Vocab::Build(spec_));
  vocab_ = std::make_unique<Vocab>(std::move(vocab));
  const bool llama = spec_.model == "llama";
  if (!spec_.merges.empty()) {
    auto bpe = BpeModel::Create(spec_.merges, *vocab_);
    if (!bpe.ok()) return bpe.error().WithContext("tokenizer merges");
    bpe_ = std::move(bpe).value();
  } else if (llama) {
    spm_ = std::make_unique<SpmModel>(*vocab_, spec_.scores);
  }
  if (!llama) {
    std::vector<std::string> regexes = spec_.pre_regexes;
    if (regexes.empty()) {
      STRATA_ASSIGN_OR_RETURN(regexes, tokenizer_internal::PreTokenizerRegexes(spec_.pre));
      // As llama.cpp: Llama-3's tokenizer.json says "ignore_merges", GGUF
      // has no key for it.
      if (IsLlama3Pre(spec_.pre)) spec_.ignore_merges = true;
    }
    STRATA_ASSIGN_OR_RETURN(pre_, RegexSplitter::Create(regexes));
  }
  always_tokens_ = std::make_unique<AddedTokenMatcher>();
  all_added_ = std::make_unique<AddedTokenMatcher>();
  for (int32_t id = 0; id < vocab_->size(); ++id) {
    const int32_t type = vocab_->type(id);
    if (type == kTokenTypeUserDefined) {
      always_tokens_->Add(vocab_->piece(id), id);
      all_added_->Add(vocab_->piece(id), id);
    } else if (type == kTokenTypeControl || type == kTokenTypeUnknown) {
      all_added_->Add(vocab_->piece(id), id);
    }
  }
  always_tokens_->Finish();
  all_added_->Finish();
  return Status::Ok();
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  std::vector<int32_t> out;
  if (add_special && spec_.add_bos && spec_.bos_id >= 0) out.push_back(spec_.bos_id);
  const AddedTokenMatcher& matcher = parse_special ? *all_added_ : *always_tokens_;
  size_t pos = 0;
  while (pos < text.size()) {
    AddedTokenMatcher::Match m;
    const bool found = matcher.FindNext(text, pos, &m);
    const size_t end = found ? m.pos : text.size();
    if (end > pos) {
      const std::string_view segment = text.substr(pos, end - pos);
      if (spec_.model == "llama") {
        EncodeTextLlama(segment, pos == 0, &out);
      } else {
        EncodeTextByteLevel(segment, &out);
      }
    }
    if (!found) break;
    out.push_back(m.id);
    pos = m.pos + m.len;
  }
  if (add_special && spec_.add_eos && spec_.eos_id >= 0) out.push_back(spec_.eos_id);
  return out;
}

void Tokenizer::EncodeTextLlama(std::string_view text, bool at_input_start,
                                std::vector<int32_t>* out) const {
  bool prefix = spec_.add_space_prefix;
  if (prefix && !spec_.space_prefix_scheme.empty()) {
    // HF Metaspace: no second marker when the text already starts with one.
    if (text.front() == ' ' || text.starts_with(kSpaceMarker)) prefix = false;
    if (spec_.space_prefix_scheme == "first" && !at_input_start) prefix = false;
  }
  std::string norm;
  norm.reserve(text.size() + 8);
  if (prefix) norm.append(kSpaceMarker);
  for (char c : text) {
    if (c == ' ') {
      norm.append(kSpaceMarker);
    } else {
      norm.push_back(c);
    }
  }

  std::vector<Symbol> syms;
  if (bpe_ != nullptr) {
    for (size_t pos = 0; pos < norm.size();) {
      const size_t len = Utf8CharLen(norm, pos);
      syms.push_back({vocab_->Find(std::string_view(norm).substr(pos, len)),
                      static_cast<uint32_t>(pos), static_cast<uint32_t>(pos + len)});
      pos += len;
    }
    bpe_->Merge(&syms);
  } else {
    spm_->Encode(norm, &syms);
  }

  for (const Symbol& s : syms) {
    if (s.id >= 0) {
      out->push_back(s.id);
      continue;
    }
    // Not in the vocabulary: its bytes as byte tokens when all exist, else
    // unk, else nothing (as HF's BPE does).
    const std::string_view piece = std::string_view(norm).substr(s.begin, s.end - s.begin);
    bool all_bytes = spec_.byte_fallback;
    for (size_t i = 0; all_bytes && i < piece.size(); ++i) {
      all_bytes = vocab_->byte_token(static_cast<uint8_t>(piece[i])) >= 0;
    }
    if (all_bytes) {
      for (char c : piece) out->push_back(vocab_->byte_token(static_cast<uint8_t>(c)));
    } else if (spec_.unk_id >= 0) {
      out->push_back(spec_.unk_id);
    }
  }
}

void Tokenizer::EncodeTextByteLevel(std::string_view text, std::vector<int32_t>* out) const {
  const auto& alphabet = ByteToUnicode();
  std::vector<Symbol> syms;
  std::string mapped;
  for (std::string_view piece : pre_->Split(text)) {
    if (spec_.ignore_merges) {
      mapped.clear();
      for (char c : piece) mapped.append(alphabet[static_cast<uint8_t>(c)]);
      const int32_t whole = vocab_->Find(mapped);
      if (whole >= 0) {
        out->push_back(whole);
        continue;
      }
    }
    syms.clear();
    for (size_t i = 0; i < piece.size(); ++i) {
      syms.push_back({vocab_->byte_char_token(static_cast<uint8_t>(piece[i])),
                      static_cast<uint32_t>(i), static_cast<uint32_t>(i + 1)});
    }
    if (bpe_ != nullptr) bpe_->Merge(&syms);
    for (const Symbol& s : syms) {
      if (s.id >= 0) {
        out->push_back(s.id);
      } else if (spec_.unk_id >= 0) {
        out->push_back(spec_.unk_id);
      }
    }
  }
}

const std::string* Tokenizer::DecodedBytes(int32_t id, bool skip_special) const {
  if (id < 0 || id >= vocab_->size()) return &ReplacementString();
  if (skip_special && vocab_->IsSpecial(id)) return nullptr;
  return &vocab_->decoded(id);
}

bool Tokenizer::StripsLeadingSpace() const {
  return spec_.model == "llama" && spec_.add_space_prefix;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special,
                              DecodeStart start) const {
  std::string raw;
  for (int32_t id : ids) {
    if (const std::string* bytes = DecodedBytes(id, skip_special)) raw.append(*bytes);
  }
  std::string_view view = raw;
  if (start == DecodeStart::kSequenceStart && StripsLeadingSpace() && !view.empty() &&
      view.front() == ' ') {
    view.remove_prefix(1);
  }
  std::string out;
  out.reserve(view.size());
  tokenizer_internal::AppendUtf8Lossy(view, /*final=*/true, &out);
  return out;
}

std::string_view Tokenizer::Piece(int32_t id) const {
  if (id < 0 || id >= vocab_->size()) return {};
  return vocab_->piece(id);
}

std::optional<int32_t> Tokenizer::TokenId(std::string_view piece) const {
  // Unlike Vocab::Find, unused tokens have ids too.
  const int32_t id = vocab_->Find(piece);
  if (id >= 0) return id;
  for (int32_t i = 0; i < vocab_->size(); ++i) {
    if (vocab_->type(i) == kTokenTypeUnused && vocab_->piece(i) == piece) return i;
  }
  return std::nullopt;
}

int32_t Tokenizer::vocab_size() const { return vocab_->size(); }

bool Tokenizer::IsEog(int32_t id) const {
  if (id < 0) return false;
  if (id == spec_.eos_id) return true;
  return std::find(spec_.eog_ids.begin(), spec_.eog_ids.end(), id) != spec_.eog_ids.end();
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_->size() && vocab_->IsSpecial(id);
}

int32_t Tokenizer::token_type(int32_t id) const {
  return id >= 0 && id < vocab_->size() ? vocab_->type(id) : kTokenTypeUnused;
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special, DecodeStart start)
    : tokenizer_(tokenizer),
      skip_special_(skip_special),
      at_start_(start == DecodeStart::kSequenceStart) {}

std::string StreamDecoder::Push(int32_t id) {
  const std::string* bytes = tokenizer_.DecodedBytes(id, skip_special_);
  if (bytes == nullptr || bytes->empty()) return {};
  std::string_view view = *bytes;
  if (at_start_) {
    at_start_ = false;
    if (tokenizer_.StripsLeadingSpace() && view.front() == ' ') view.remove_prefix(1);
  }
  pending_.append(view);
  std::string out;
  const size_t used = tokenizer_internal::AppendUtf8Lossy(pending_, /*final=*/false, &out);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::Flush() {
  std::string out;
  tokenizer_internal::AppendUtf8Lossy(pending_, /*final=*/true, &out);
  pending_.clear();
  return out;
}

}  // namespace strata
