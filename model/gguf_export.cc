#include "model/gguf_export.h"

#include "model/gguf_tokenizer.h"
#include "model/gguf_writer.h"

namespace strata {

namespace {

void AddConfig(const ModelConfig& c, const std::string& name, GgufWriter* w) {
  const std::string a = c.arch + ".";
  w->SetString("general.architecture", c.arch);
  w->SetString("general.name", name);
  w->SetU32(a + "context_length", static_cast<uint32_t>(c.context_length));
  w->SetU32(a + "embedding_length", static_cast<uint32_t>(c.dim));
  w->SetU32(a + "block_count", static_cast<uint32_t>(c.n_layers));
  w->SetU32(a + "feed_forward_length", static_cast<uint32_t>(c.ffn_dim));
  w->SetU32(a + "attention.head_count", static_cast<uint32_t>(c.n_heads));
  w->SetU32(a + "attention.head_count_kv", static_cast<uint32_t>(c.n_kv_heads));
  w->SetU32(a + "attention.key_length", static_cast<uint32_t>(c.head_dim));
  w->SetU32(a + "attention.value_length", static_cast<uint32_t>(c.head_dim));
  w->SetU32(a + "rope.dimension_count", static_cast<uint32_t>(c.head_dim));
  w->SetF32(a + "attention.layer_norm_rms_epsilon", c.rms_eps);
  w->SetF32(a + "rope.freq_base", c.rope_theta);
  w->SetU32(a + "vocab_size", static_cast<uint32_t>(c.vocab_size));
  if (c.rope_scaling.type == RopeScaling::Type::kLinear) {
    w->SetString(a + "rope.scaling.type", "linear");
    w->SetF32(a + "rope.scaling.factor", c.rope_scaling.factor);
  }
}

Status CheckWritable(const ModelConfig& c) {
  STRATA_RETURN_IF_ERROR(c.Validate());
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3)
    return Status::Unsupported("writing Llama-3 RoPE scaling to GGUF (a rope_freqs tensor) is not implemented");
  // GGUF llama/mistral expect the interleaved RoPE pairing (Q/K permuted),
  // qwen2 the NeoX one; a mismatch would change the function computed.
  bool neox = c.rope_style == RopeStyle::kNeox;
  if (neox != (c.arch == "qwen2"))
    return Status::Unsupported("GGUF '" + c.arch + "' implies " + (neox ? "interleaved" : "NeoX") +
                               " RoPE; these weights use the other pairing (convert Q/K first)");
  return Status::Ok();
}

}  // namespace

// GGUF names a byte-level pre-tokenizer by id only; a regex Strata does not
// recognise (pre == "custom") cannot be written and read back.
Status CheckTokenizerWritable(const TokenizerSpec& tok) {
  if (tok.model == "gpt2" && (tok.pre.empty() || tok.pre == "custom"))
    return Status::Unsupported("the tokenizer's pre-tokenizer regex has no GGUF 'tokenizer.ggml.pre' id; "
                               "it cannot be written to GGUF (use --format hf)");
  return Status::Ok();
}

Status WriteModelGguf(const ModelWeights& w, const TokenizerSpec& tok, const std::string& path) {
  const ModelConfig& c = w.config;
  STRATA_RETURN_IF_ERROR(CheckWritable(c));
  STRATA_RETURN_IF_ERROR(CheckTokenizerWritable(tok));
  GgufWriter out;
  AddConfig(c, c.name.empty() ? "strata-model" : c.name, &out);
  AddTokenizerToGguf(tok, &out);
  auto add = [&](const std::string& name, const Tensor& t) -> Status {
    if (!t.present()) return Status::Ok();
    return out.AddTensor(name, t.type, t.ne, t.data, t.nbytes);
  };
  STRATA_RETURN_IF_ERROR(add("token_embd.weight", w.tok_embd));
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerWeights& l = w.layers[static_cast<size_t>(i)];
    std::string p = "blk." + std::to_string(i) + ".";
    STRATA_RETURN_IF_ERROR(add(p + "attn_norm.weight", l.attn_norm));
    STRATA_RETURN_IF_ERROR(add(p + "attn_q.weight", l.wq));
    STRATA_RETURN_IF_ERROR(add(p + "attn_k.weight", l.wk));
    STRATA_RETURN_IF_ERROR(add(p + "attn_v.weight", l.wv));
    STRATA_RETURN_IF_ERROR(add(p + "attn_q.bias", l.bq));
    STRATA_RETURN_IF_ERROR(add(p + "attn_k.bias", l.bk));
    STRATA_RETURN_IF_ERROR(add(p + "attn_v.bias", l.bv));
    STRATA_RETURN_IF_ERROR(add(p + "attn_output.weight", l.wo));
    STRATA_RETURN_IF_ERROR(add(p + "ffn_norm.weight", l.ffn_norm));
    STRATA_RETURN_IF_ERROR(add(p + "ffn_gate.weight", l.w_gate));
    STRATA_RETURN_IF_ERROR(add(p + "ffn_up.weight", l.w_up));
    STRATA_RETURN_IF_ERROR(add(p + "ffn_down.weight", l.w_down));
  }
  STRATA_RETURN_IF_ERROR(add("output_norm.weight", w.output_norm));
  if (!c.tied_embeddings) STRATA_RETURN_IF_ERROR(add("output.weight", w.output));
  return out.Write(path);
}

Status WriteSyntheticGguf(const ModelConfig& c, const TokenizerSpec& tok, const SynthOptions& opt,
                          const std::string& path) {
  STRATA_RETURN_IF_ERROR(CheckWritable(c));
  STRATA_RETURN_IF_ERROR(CheckTokenizerWritable(tok));
  if (static_cast<int>(tok.tokens.size()) != c.vocab_size)
    return Status::InvalidArgument("vocabulary has " + std::to_string(tok.tokens.size()) +
                                   " tokens but the model's vocab size is " + std::to_string(c.vocab_size));
  GgufWriter out;
  std::string name = (c.name.empty() ? std::string("strata-synthetic") : c.name) + "-random-weights";
  AddConfig(c, name, &out);
  out.SetBool("strata.synthetic", true);
  out.SetU64("strata.synthetic.seed", opt.seed);
  AddTokenizerToGguf(tok, &out);
  Status st;
  ForEachModelTensor(c, [&](const std::string& tname, char kind, const std::vector<int64_t>& ne) {
    if (!st.ok()) return;
    DType type = (kind == 'n' || kind == 'b') ? DType::kF32 : SynthTensorType(opt.dtype, ne[0]);
    st = out.AddTensorProduced(tname, type, ne, [tname, kind, ne, type, opt](const GgufWriter::Sink& sink) {
      std::vector<uint8_t> bytes = SynthTensorBytes(tname, kind, ne, type, opt);
      return sink(bytes.data(), bytes.size());
    });
  });
  STRATA_RETURN_IF_ERROR(st);
  return out.Write(path);
}

}  // namespace strata
