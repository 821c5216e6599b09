#include "model/gguf_export.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "common/thread_pool.h"
#include "model/backend/cpu/quant.h"
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

// GGUF llama/mistral expect the interleaved RoPE pairing, qwen2 the NeoX
// one. Weights in the NeoX pairing under another arch (a Hugging Face Llama
// directory) are written with their Q/K rows permuted to the interleaved
// pairing, as llama.cpp's converter does: the same function.
bool NeedsInterleaving(const ModelConfig& c) { return c.rope_style == RopeStyle::kNeox && c.arch != "qwen2"; }

// `full`: the caller writes Q/K permuted (NeedsInterleaving) and Llama-3
// scaling as a rope_freqs tensor (RopeFreqFactors); the synthetic writer
// does neither.
Status CheckWritable(const ModelConfig& c, bool full) {
  STRATA_RETURN_IF_ERROR(c.Validate());
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3 && !full)
    return Status::Unsupported("writing Llama-3 RoPE scaling to GGUF (a rope_freqs tensor) is not implemented here");
  const bool neox = c.rope_style == RopeStyle::kNeox;
  if (neox != (c.arch == "qwen2") && !(full && NeedsInterleaving(c)))
    return Status::Unsupported("GGUF '" + c.arch + "' implies " + (neox ? "interleaved" : "NeoX") +
                               " RoPE; these weights use the other pairing (convert Q/K first)");
  return Status::Ok();
}

// GGUF carries Llama-3 RoPE scaling as per-frequency divisors (tensor
// rope_freqs.weight, head_dim/2 f32; llama.cpp divides each frequency by
// its entry): the unscaled frequency ÷ the one `c` computes. Empty when `c`
// scales by a single factor or not at all (the keys say that).
std::vector<float> RopeFreqFactors(const ModelConfig& c) {
  if (c.rope_scaling.type != RopeScaling::Type::kLlama3 && c.rope_freq_factors.empty()) return {};
  const int half = c.head_dim / 2;
  ModelConfig plain = c;
  plain.rope_scaling = RopeScaling{};
  plain.rope_freq_factors.clear();
  std::vector<float> base(static_cast<size_t>(half)), scaled(static_cast<size_t>(half)), out(static_cast<size_t>(half));
  ComputeRopeInvFreq(plain, base.data());
  ComputeRopeInvFreq(c, scaled.data());
  for (int i = 0; i < half; ++i)
    out[static_cast<size_t>(i)] = static_cast<float>(static_cast<double>(base[static_cast<size_t>(i)]) /
                                                     static_cast<double>(scaled[static_cast<size_t>(i)]));
  return out;
}

// The heads of tensor `name` whose rows (or, for a bias, elements) go from
// the NeoX to the interleaved pairing; 0 for every other tensor.
int InterleaveHeads(const ModelConfig& c, const std::string& name) {
  if (!NeedsInterleaving(c) || !name.starts_with("blk.")) return 0;
  if (name.ends_with(".attn_q.weight") || name.ends_with(".attn_q.bias")) return c.n_heads;
  if (name.ends_with(".attn_k.weight") || name.ends_with(".attn_k.bias")) return c.n_kv_heads;
  return 0;
}

// Output row `r` of a head-permuted tensor comes from this input row: the
// interleaved pair (2i, 2i + 1) of a head is the NeoX pair (i, i + d/2).
int64_t InterleavedSource(int64_t r, int head_dim) {
  const int64_t head = r / head_dim * head_dim, j = r % head_dim;
  return head + j / 2 + (j % 2) * (head_dim / 2);
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
  return WriteModelGguf(w, tok, path, GgufExportOptions{});
}

namespace {

// The bytes of rows [r0, r1) of `t` converted to `to`, into `out`; with
// head_dim > 0, row r is read from InterleavedSource(r) (same type: its
// bytes, copied).
void ConvertRows(const Tensor& t, DType to, QuantFit fit, int head_dim, int64_t r0, int64_t r1, uint8_t* out) {
  const int64_t cols = t.cols();
  std::vector<float> row(static_cast<size_t>(cols));
  const size_t out_row = RowBytes(to, cols);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* src = t.row(head_dim > 0 ? InterleavedSource(r, head_dim) : r);
    uint8_t* dst = out + static_cast<size_t>(r - r0) * out_row;
    if (to == t.type) {
      std::memcpy(dst, src, out_row);
      continue;
    }
    cpu::DequantizeRow(t.type, src, row.data(), cols);
    cpu::QuantizeRow(to, row.data(), dst, cols, fit);
  }
}

// A bias (1-D, unquantized) with its elements in the interleaved pairing.
std::vector<uint8_t> InterleavedVector(const Tensor& t, int head_dim) {
  const size_t elem = RowBytes(t.type, 1);
  std::vector<uint8_t> out(t.nbytes);
  for (int64_t i = 0; i < t.ne[0]; ++i)
    std::memcpy(out.data() + static_cast<size_t>(i) * elem,
                t.data + static_cast<size_t>(InterleavedSource(i, head_dim)) * elem, elem);
  return out;
}

// Streams `t` converted to `to` (rows head-permuted when head_dim > 0) into
// `sink`, a chunk of rows at a time, the rows of a chunk split over `threads`.
Status ProduceConverted(const Tensor& t, DType to, QuantFit fit, int head_dim, ThreadPool* pool,
                        const GgufWriter::Sink& sink) {
  const int64_t rows = t.rows();
  const size_t out_row = RowBytes(to, t.cols());
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>((size_t{16} << 20) / std::max<size_t>(out_row, 1)));
  std::vector<uint8_t> buf(static_cast<size_t>(std::min(chunk, rows)) * out_row);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t r1 = std::min(rows, r0 + chunk);
    if (pool != nullptr) {
      pool->ParallelFor(static_cast<size_t>(r1 - r0), 1, [&](size_t b, size_t e) {
        ConvertRows(t, to, fit, head_dim, r0 + static_cast<int64_t>(b), r0 + static_cast<int64_t>(e),
                    buf.data() + b * out_row);
      });
    } else {
      ConvertRows(t, to, fit, head_dim, r0, r1, buf.data());
    }
    STRATA_RETURN_IF_ERROR(sink(buf.data(), static_cast<size_t>(r1 - r0) * out_row));
  }
  return Status::Ok();
}

}  // namespace

Status WriteModelGguf(const ModelWeights& w, const TokenizerSpec& tok, const std::string& path,
                      const GgufExportOptions& opt) {
  const ModelConfig& c = w.config;
  STRATA_RETURN_IF_ERROR(CheckWritable(c, /*full=*/true));
  STRATA_RETURN_IF_ERROR(CheckTokenizerWritable(tok));
  GgufWriter out;
  AddConfig(c, c.name.empty() ? "strata-model" : c.name, &out);
  if (opt.synthetic) out.SetBool("strata.synthetic", true);
  AddTokenizerToGguf(tok, &out);
  if (std::vector<float> f = RopeFreqFactors(c); !f.empty()) {
    const auto n = static_cast<int64_t>(f.size());
    std::vector<uint8_t> bytes(f.size() * sizeof(float));
    std::memcpy(bytes.data(), f.data(), bytes.size());
    STRATA_RETURN_IF_ERROR(out.AddTensorOwned("rope_freqs.weight", DType::kF32, {n}, std::move(bytes)));
  }
  std::unique_ptr<ThreadPool> pool;
  if (opt.threads > 1) pool = std::make_unique<ThreadPool>(opt.threads, 0);
  Status st;
  ForEachWeightTensor(w, [&](const std::string& name, const Tensor& t) {
    if (!st.ok()) return;
    auto it = opt.types.find(name);
    const DType to = it == opt.types.end() ? t.type : it->second;
    const int heads = InterleaveHeads(c, name);
    if (heads > 0) {
      const int64_t rows = t.ne.size() == 1 ? t.ne[0] : t.rows();
      if (rows != static_cast<int64_t>(heads) * c.head_dim || (t.ne.size() == 1 && IsQuantized(t.type))) {
        st = Status::InvalidArgument("tensor " + name + ": " + std::to_string(rows) + " rows, expected " +
                                     std::to_string(heads) + " heads x " + std::to_string(c.head_dim) +
                                     " for the RoPE permutation");
        return;
      }
      if (t.ne.size() == 1) {
        st = out.AddTensorProduced(name, t.type, t.ne, [t, hd = c.head_dim](const GgufWriter::Sink& sink) {
          const std::vector<uint8_t> v = InterleavedVector(t, hd);
          return sink(v.data(), v.size());
        });
        return;
      }
    }
    if (to == t.type && heads == 0) {
      st = out.AddTensor(name, t.type, t.ne, t.data, t.nbytes);
      return;
    }
    if (t.cols() % GetDTypeInfo(to).block_elems != 0) {
      st = Status::InvalidArgument("tensor " + name + ": rows of " + std::to_string(t.cols()) +
                                   " elements do not divide into " + std::string(DTypeName(to)) + " blocks");
      return;
    }
    ThreadPool* p = pool.get();
    // The Tensor is a view (copied); its bytes belong to `w`, which outlives Write().
    const int head_dim = heads > 0 ? c.head_dim : 0;
    st = out.AddTensorProduced(name, to, t.ne, [t, to, fit = opt.fit, head_dim, p](const GgufWriter::Sink& sink) {
      return ProduceConverted(t, to, fit, head_dim, p, sink);
    });
  });
  STRATA_RETURN_IF_ERROR(st);
  return out.Write(path);
}

Status WriteSyntheticGguf(const ModelConfig& c, const TokenizerSpec& tok, const SynthOptions& opt,
                          const std::string& path) {
  STRATA_RETURN_IF_ERROR(CheckWritable(c, /*full=*/false));
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
