#include "model/eval_kld.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/forward.h"

namespace strata {

double KlDivergence(const float* ref, const float* cand, int n) {
  double max_r = -INFINITY, max_c = -INFINITY;
  for (int i = 0; i < n; ++i) {
    max_r = std::max(max_r, static_cast<double>(ref[i]));
    max_c = std::max(max_c, static_cast<double>(cand[i]));
  }
  double sum_r = 0, sum_c = 0;
  for (int i = 0; i < n; ++i) {
    sum_r += std::exp(static_cast<double>(ref[i]) - max_r);
    sum_c += std::exp(static_cast<double>(cand[i]) - max_c);
  }
  const double log_zr = max_r + std::log(sum_r), log_zc = max_c + std::log(sum_c);
  double kl = 0;
  for (int i = 0; i < n; ++i) {
    const double lp = static_cast<double>(ref[i]) - log_zr;
    const double lq = static_cast<double>(cand[i]) - log_zc;
    kl += std::exp(lp) * (lp - lq);
  }
  return std::max(0.0, kl);
}

namespace {

// log softmax(logits)[token], in double.
double LogProb(const float* logits, int n, int32_t token) {
  double m = -INFINITY;
  for (int i = 0; i < n; ++i) m = std::max(m, static_cast<double>(logits[i]));
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(static_cast<double>(logits[i]) - m);
  return static_cast<double>(logits[token]) - m - std::log(s);
}

int ArgMax(const float* v, int n) { return static_cast<int>(std::max_element(v, v + n) - v); }

Status ChunkLogits(ForwardEngine& engine, std::span<const int32_t> chunk, std::vector<float>* logits) {
  std::vector<int32_t> table(static_cast<size_t>(engine.num_blocks()));
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  ForwardSeq seq;
  seq.tokens = chunk;
  seq.start_pos = 0;
  seq.block_table = table;
  seq.all_logits = true;
  return engine.Forward(std::span<const ForwardSeq>(&seq, 1), logits);
}

}  // namespace

Result<KldResult> EvaluateKld(const ModelWeights& model, const ModelWeights& reference,
                              std::span<const int32_t> tokens, const KldOptions& opt, ThreadPool* pool) {
  const ModelConfig& a = model.config;
  const ModelConfig& b = reference.config;
  if (a.vocab_size != b.vocab_size)
    return Status::InvalidArgument("the model's vocabulary has " + std::to_string(a.vocab_size) +
                                   " tokens, the reference's " + std::to_string(b.vocab_size));
  const int ctx = opt.context;
  if (ctx < 4 || ctx > std::min(a.context_length, b.context_length))
    return Status::InvalidArgument("context " + std::to_string(ctx) + " must be in [4, " +
                                   std::to_string(std::min(a.context_length, b.context_length)) + "]");
  int chunks = static_cast<int>(tokens.size() / static_cast<size_t>(ctx));
  if (opt.max_chunks > 0) chunks = std::min(chunks, opt.max_chunks);
  if (chunks == 0)
    return Status::InvalidArgument("the text has " + std::to_string(tokens.size()) +
                                   " tokens, fewer than one chunk of " + std::to_string(ctx));
  KvOptions kv;
  kv.block_size = 16;
  kv.dtype = opt.kv_dtype;
  kv.num_blocks = (ctx + kv.block_size - 1) / kv.block_size;
  STRATA_ASSIGN_OR_RETURN(auto me, ForwardEngine::Create(model, kv, pool));
  STRATA_ASSIGN_OR_RETURN(auto re, ForwardEngine::Create(reference, kv, pool));
  const int vocab = a.vocab_size;
  const int first = ctx / 2;
  std::vector<double> klds;
  double nll_model = 0, nll_ref = 0;
  int64_t agree = 0;
  std::vector<float> lm, lr;
  std::vector<int32_t> chunk(static_cast<size_t>(ctx));
  for (int c = 0; c < chunks; ++c) {
    std::copy_n(tokens.begin() + static_cast<ptrdiff_t>(c) * ctx, ctx, chunk.begin());
    if (opt.bos_id >= 0) chunk[0] = opt.bos_id;
    for (int32_t t : chunk)
      if (t < 0 || t >= vocab) return Status::InvalidArgument("token id " + std::to_string(t) + " out of range");
    STRATA_RETURN_IF_ERROR(ChunkLogits(*me, chunk, &lm));
    STRATA_RETURN_IF_ERROR(ChunkLogits(*re, chunk, &lr));
    for (int p = first; p < ctx - 1; ++p) {
      const float* m = lm.data() + static_cast<size_t>(p) * static_cast<size_t>(vocab);
      const float* r = lr.data() + static_cast<size_t>(p) * static_cast<size_t>(vocab);
      klds.push_back(KlDivergence(r, m, vocab));
      agree += ArgMax(m, vocab) == ArgMax(r, vocab) ? 1 : 0;
      const int32_t next = chunk[static_cast<size_t>(p) + 1];
      nll_model -= LogProb(m, vocab, next);
      nll_ref -= LogProb(r, vocab, next);
    }
  }
  KldResult res;
  res.chunks = chunks;
  res.positions = static_cast<int64_t>(klds.size());
  const double n = static_cast<double>(klds.size());
  for (double k : klds) res.mean_kld += k / n;
  std::vector<double> sorted = klds;
  std::sort(sorted.begin(), sorted.end());
  res.max_kld = sorted.back();
  res.p99_kld = sorted[std::min(sorted.size() - 1, static_cast<size_t>(0.99 * n))];
  res.top1_agreement = static_cast<double>(agree) / n;
  res.model_ppl = std::exp(nll_model / n);
  res.reference_ppl = std::exp(nll_ref / n);
  return res;
}

// ---- The default text ---------------------------------------------------------

namespace {

struct Rng {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  template <size_t N>
  const char* Pick(const char* const (&words)[N]) {
    return words[Next() % N];
  }
};

const char* const kNames[] = {"Lily", "Tom", "Mia", "Ben", "Sara", "Max", "Anna", "Sam", "Lucy", "Jack", "Emma", "Leo"};
const char* const kAnimals[] = {"dog", "cat", "bird", "frog", "bunny", "duck", "fox", "bear", "fish", "horse"};
const char* const kPlaces[] = {"park", "garden", "forest", "beach", "kitchen", "river", "hill", "school", "farm",
                               "library", "market", "lake"};
const char* const kObjects[] = {"ball", "kite", "box", "book", "cake", "hat", "boat", "flower", "toy car", "red cup",
                                "blanket", "drum", "map", "key", "apple", "shell"};
const char* const kAdjectives[] = {"big", "little", "shiny", "soft", "old", "bright", "funny", "quiet", "warm",
                                   "colorful", "strange", "happy", "tiny", "heavy"};
const char* const kFeelings[] = {"happy", "sad", "proud", "scared", "surprised", "tired", "curious", "excited",
                                 "angry", "calm"};
const char* const kVerbs[] = {"find", "fix", "carry", "share", "build", "paint", "hide", "open", "clean", "catch"};
const char* const kPast[] = {"found", "fixed", "carried", "shared", "built", "painted", "hid", "opened", "cleaned",
                             "caught"};
const char* const kTimes[] = {"One day", "In the morning", "After lunch", "Later that day", "On a sunny day",
                              "When it began to rain", "The next day", "In the evening"};
const char* const kSayings[] = {"Look at this!", "Can you help me?", "I am not afraid.", "This is fun!",
                                "Where did it go?", "Let us try again.", "Thank you, my friend.", "Be careful!"};
const char* const kLessons[] = {"sharing makes everyone happy", "it is good to be kind", "friends help each other",
                                "you should never give up", "it is okay to ask for help", "being brave is not easy"};

std::string Sentence(Rng& r, const std::string& hero, const std::string& friend_) {
  std::string s;
  switch (r.Next() % 10) {
    case 0:
      s = std::string(r.Pick(kTimes)) + ", " + hero + " went to the " + r.Pick(kPlaces) + " with a " +
          r.Pick(kAdjectives) + " " + r.Pick(kObjects) + ".";
      break;
    case 1:
      s = hero + " saw a " + r.Pick(kAdjectives) + " " + r.Pick(kAnimals) + " near the " + r.Pick(kPlaces) + ".";
      break;
    case 2:
      s = std::string("\"") + r.Pick(kSayings) + "\" said " + hero + ".";
      break;
    case 3:
      s = hero + " felt " + r.Pick(kFeelings) + " because the " + r.Pick(kObjects) + " was " + r.Pick(kAdjectives) +
          ".";
      break;
    case 4:
      s = hero + " wanted to " + r.Pick(kVerbs) + " the " + r.Pick(kObjects) + ", but it was too " +
          r.Pick(kAdjectives) + ".";
      break;
    case 5:
      s = "So " + hero + " asked " + friend_ + " for help, and " + friend_ + " said yes.";
      break;
    case 6:
      s = std::string("Together they ") + r.Pick(kPast) + " the " + r.Pick(kObjects) + " and " + r.Pick(kPast) +
          " the " + r.Pick(kObjects) + " too.";
      break;
    case 7:
      s = "The " + std::string(r.Pick(kAnimals)) + " was " + r.Pick(kFeelings) + " and ran to the " +
          r.Pick(kPlaces) + ".";
      break;
    case 8:
      s = friend_ + " smiled and gave " + hero + " a " + r.Pick(kAdjectives) + " " + r.Pick(kObjects) + ".";
      break;
    default:
      s = std::string("\"") + r.Pick(kSayings) + "\" " + friend_ + " asked, and " + hero + " laughed.";
      break;
  }
  return s;
}

}  // namespace

std::string DefaultEvalText(int words, uint64_t seed) {
  Rng r{seed};
  std::string text;
  int count = 0;
  while (count < words) {
    const std::string hero = r.Pick(kNames);
    std::string friend_ = r.Pick(kNames);
    if (friend_ == hero) friend_ = "the " + std::string(r.Pick(kAnimals));
    std::string para = "Once upon a time, there was a " + std::string(r.Pick(kAdjectives)) + " " +
                       (r.Next() % 2 ? "girl" : "boy") + " named " + hero + ".";
    const int sentences = 5 + static_cast<int>(r.Next() % 5);
    for (int i = 0; i < sentences; ++i) para += " " + Sentence(r, hero, friend_);
    para += std::string(" In the end, ") + hero + " learned that " + r.Pick(kLessons) + ".";
    count += static_cast<int>(std::count(para.begin(), para.end(), ' ')) + 1;
    if (!text.empty()) text += "\n\n";
    text += para;
  }
  return text;
}

}  // namespace strata
