#include "model/eval_kld.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/forward.h"

namespace strata {

double KlDivergence(const float* ref, const float* cand, int n) {
  double max_r = -INFINITY, max_c = -INFINITY;
  for (int i = 0; i < n; ++i) {
    if (std::isnan(ref[i]) || std::isnan(cand[i])) return NAN;
    max_r = std::max(max_r, static_cast<double>(ref[i]));
    max_c = std::max(max_c, static_cast<double>(cand[i]));
  }
  if (!std::isfinite(max_r) || !std::isfinite(max_c)) return NAN;  // +inf, or every logit -inf
  double sum_r = 0, sum_c = 0;
  for (int i = 0; i < n; ++i) {
    sum_r += std::exp(static_cast<double>(ref[i]) - max_r);
    sum_c += std::exp(static_cast<double>(cand[i]) - max_c);
  }
  const double log_zr = max_r + std::log(sum_r), log_zc = max_c + std::log(sum_c);
  double kl = 0;
  for (int i = 0; i < n; ++i) {
    const double lp = static_cast<double>(ref[i]) - log_zr;
    if (lp == -INFINITY) continue;  // p = 0 contributes nothing
    const double lq = static_cast<double>(cand[i]) - log_zc;
    kl += std::exp(lp) * (lp - lq);  // +inf where the model gives 0 to a token the reference does not
  }
  return std::max(0.0, kl);  // rounding can give -1e-17
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
    return Status::InvalidArgument("--context " + std::to_string(ctx) + " must be in [4, " +
                                   std::to_string(std::min(a.context_length, b.context_length)) +
                                   "] (the models' context length)");
  int chunks = static_cast<int>(tokens.size() / static_cast<size_t>(ctx));
  if (opt.max_chunks > 0) chunks = std::min(chunks, opt.max_chunks);
  if (chunks == 0)
    return Status::InvalidArgument("the text has " + std::to_string(tokens.size()) +
                                   " tokens, fewer than one chunk of " + std::to_string(ctx) +
                                   " (give a longer --text or a smaller --context)");
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
      const double kl = KlDivergence(r, m, vocab);
      if (std::isnan(kl))
        return Status::Internal("non-finite logits at position " + std::to_string(p) + " of chunk " +
                                std::to_string(c) + " (of the model or the reference)");
      klds.push_back(kl);
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

// Every draw is a named local, taken in order: the operands of one `+`
// chain are evaluated in an unspecified order, which would make the text
// depend on the compiler.
std::string Sentence(Rng& r, const std::string& hero, const std::string& friend_) {
  const uint64_t kind = r.Next() % 10;
  const std::string a = r.Pick(kAdjectives), o = r.Pick(kObjects), p = r.Pick(kPlaces);
  const std::string n = r.Pick(kAnimals), f = r.Pick(kFeelings), say = r.Pick(kSayings);
  switch (kind) {
    case 0: {
      const std::string t = r.Pick(kTimes);
      return t + ", " + hero + " went to the " + p + " with a " + a + " " + o + ".";
    }
    case 1:
      return hero + " saw a " + a + " " + n + " near the " + p + ".";
    case 2:
      return "\"" + say + "\" said " + hero + ".";
    case 3: {
      const std::string a2 = r.Pick(kAdjectives);
      return hero + " felt " + f + " because the " + o + " was " + a2 + ".";
    }
    case 4: {
      const std::string v = r.Pick(kVerbs);
      return hero + " wanted to " + v + " the " + o + ", but it was too " + a + ".";
    }
    case 5:
      return "So " + hero + " asked " + friend_ + " for help, and " + friend_ + " said yes.";
    case 6: {
      const std::string v1 = r.Pick(kPast), v2 = r.Pick(kPast), o2 = r.Pick(kObjects);
      return "Together they " + v1 + " the " + o + " and " + v2 + " the " + o2 + " too.";
    }
    case 7:
      return "The " + n + " was " + f + " and ran to the " + p + ".";
    case 8:
      return friend_ + " smiled and gave " + hero + " a " + a + " " + o + ".";
    default:
      return "\"" + say + "\" " + friend_ + " asked, and " + hero + " laughed.";
  }
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
    const std::string adjective = r.Pick(kAdjectives);
    const char* child = r.Next() % 2 ? "girl" : "boy";
    std::string para = "Once upon a time, there was a " + adjective + " " + child + " named " + hero + ".";
    const int sentences = 5 + static_cast<int>(r.Next() % 5);
    for (int i = 0; i < sentences; ++i) para += " " + Sentence(r, hero, friend_);
    const std::string lesson = r.Pick(kLessons);
    para += " In the end, " + hero + " learned that " + lesson + ".";
    count += static_cast<int>(std::count(para.begin(), para.end(), ' ')) + 1;
    if (!text.empty()) text += "\n\n";
    text += para;
  }
  return text;
}

}  // namespace strata
