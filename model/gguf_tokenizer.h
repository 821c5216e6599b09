#pragma once
// Tokenizer metadata in GGUF files (tokenizer.ggml.* keys and
// tokenizer.chat_template), both directions.

#include "common/status.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/tokenizer/tokenizer_spec.h"

namespace strata {

// Reads the spec; errors name the key (missing tokens, mismatched array
// lengths, an unknown tokenizer model).
Result<TokenizerSpec> TokenizerSpecFromGguf(const GgufFile& f);

// Writes every tokenizer key `spec` carries.
void AddTokenizerToGguf(const TokenizerSpec& spec, GgufWriter* w);

// A SentencePiece-style vocabulary for synthetic models that have no real one:
// <unk>, <s>, </s>, the 256 byte-fallback tokens, ▁ and the printable ASCII
// characters (with and without ▁), then common English words, then unused
// filler up to `vocab_size` (>= 400). Any text encodes (through byte fallback).
TokenizerSpec SyntheticVocab(int vocab_size);

}  // namespace strata
