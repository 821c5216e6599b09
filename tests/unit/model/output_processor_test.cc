// model/output_processor.h on the real stories260K tokenizer, with logits
// that force each token: every finish reason it produces (EOS, stop id, stop
// string, max_tokens; ignore_eos), the hold-back of text that may start a
// stop string (split across tokens), and a continuation saved after any
// token giving exactly the uninterrupted output, also when a stop string
// spans the boundary and when sampling draws from a seeded RNG.

#include "model/output_processor.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "model/model_loader.h"
#include "tests/support/test_env.h"

namespace strata {
namespace {

class OutputProcessorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = LoadModel(testing::Stories260KPath());
    ASSERT_TRUE(m.ok()) << m.error().ToString();
    model_ = std::move(m).value();
    vocab_ = model_->tokenizer->vocab_size();
    prompt_ = TokenizePrompt(*model_, "Once upon a time");
  }

  // Logits that make greedy sampling pick `token`.
  std::vector<float> Force(int32_t token) const {
    std::vector<float> l(static_cast<size_t>(vocab_), 0.0f);
    l[static_cast<size_t>(token)] = 50.0f;
    return l;
  }

  // Generated ids whose text (decoded as a continuation) is `text`, which
  // starts with a space (the tokenizer's space prefix makes it).
  std::vector<int32_t> Ids(const std::string& text) const {
    std::vector<int32_t> ids = model_->tokenizer->Encode(text.substr(1), /*add_special=*/false, false);
    EXPECT_EQ(Text(ids), text);
    EXPECT_FALSE(ids.empty());
    return ids;
  }

  std::string Text(const std::vector<int32_t>& ids) const {
    return model_->tokenizer->Decode(ids, /*skip_special=*/true, DecodeStart::kContinuation);
  }

  SamplingParams Greedy() const {
    SamplingParams p;
    p.temperature = 0;
    return p;
  }

  struct Run {
    std::vector<int32_t> tokens;
    std::string text;
    FinishReason finish = FinishReason::kNone;
  };

  // Feeds `ids` (forced) until the processor finishes or they run out.
  static Run Feed(OutputProcessor& out, const std::vector<int32_t>& ids, const OutputProcessorTest& t,
                  size_t from = 0, size_t to = SIZE_MAX) {
    Run r;
    for (size_t i = from; i < ids.size() && i < to && !out.finished(); ++i) {
      TokenStep s = out.Next(t.Force(ids[i]).data());
      EXPECT_EQ(s.sample.token, ids[i]);
      r.tokens.push_back(s.sample.token);
      r.text += s.text;
      r.finish = s.finish;
    }
    return r;
  }

  std::unique_ptr<LoadedModel> model_;
  int vocab_ = 0;
  std::vector<int32_t> prompt_;
};

TEST_F(OutputProcessorTest, MaxTokensEndsWithLengthAndReleasesEverything) {
  const auto ids = Ids(" there was a little girl");
  StopConditions stop{static_cast<int>(ids.size()), {"zzzzzz"}, {}, false};
  OutputProcessor out(*model_->tokenizer, Greedy(), vocab_, stop, prompt_);
  Run r = Feed(out, ids, *this);
  EXPECT_EQ(r.finish, FinishReason::kLength);
  EXPECT_EQ(out.generated(), static_cast<int>(ids.size()));
  // The tail held back for the stop string is released at the end.
  EXPECT_EQ(r.text, Text(ids));
}

TEST_F(OutputProcessorTest, EndOfGenerationStopsWithoutItsTextUnlessIgnored) {
  auto ids = Ids(" the cat");
  ids.push_back(model_->tokenizer->eos_id());
  ids.push_back(Ids(" sat")[0]);
  StopConditions stop{100, {"zzzz"}, {}, false};
  OutputProcessor out(*model_->tokenizer, Greedy(), vocab_, stop, prompt_);
  Run r = Feed(out, ids, *this);
  EXPECT_EQ(r.finish, FinishReason::kStop);
  EXPECT_EQ(r.tokens.size(), ids.size() - 1);  // the EOS is the last token
  EXPECT_EQ(r.text, " the cat");                // held-back text released, no EOS text

  stop.ignore_eos = true;
  OutputProcessor past(*model_->tokenizer, Greedy(), vocab_, stop, prompt_);
  Run p = Feed(past, ids, *this);
  EXPECT_EQ(p.finish, FinishReason::kNone);
  EXPECT_EQ(p.tokens.size(), ids.size());
}

TEST_F(OutputProcessorTest, StopTokenIdStops) {
  const auto ids = Ids(" one two three");
  StopConditions stop{100, {}, {ids[1]}, false};
  OutputProcessor out(*model_->tokenizer, Greedy(), vocab_, stop, prompt_);
  Run r = Feed(out, ids, *this);
  EXPECT_EQ(r.finish, FinishReason::kStop);
  EXPECT_EQ(r.tokens.size(), 2u);
  EXPECT_EQ(r.text, Text({ids[0]}));
}

TEST_F(OutputProcessorTest, StopStringSplitAcrossTokensIsCutAndNeverShown) {
  const std::string text = " she saw a big dog in the park";
  const auto ids = Ids(text);
  ASSERT_GE(ids.size(), 6u);
  // A stop string that starts inside one token and ends inside a later one.
  const std::string stop_string = "w a big d";
  StopConditions stop{100, {stop_string}, {}, false};
  OutputProcessor out(*model_->tokenizer, Greedy(), vocab_, stop, prompt_);
  Run r = Feed(out, ids, *this);
  EXPECT_EQ(r.finish, FinishReason::kStop);
  EXPECT_EQ(r.text, " she sa");
  EXPECT_LT(r.tokens.size(), ids.size());
  // Nothing that could start the stop string was released early: before the
  // stop, the text shown never ends with a prefix of it.
  OutputProcessor partial(*model_->tokenizer, Greedy(), vocab_, stop, prompt_);
  std::string shown;
  for (size_t i = 0; i + 1 < r.tokens.size(); ++i) {
    shown += partial.Next(Force(ids[i]).data()).text;
    EXPECT_EQ(text.compare(0, shown.size(), shown), 0);
    EXPECT_LE(shown.size(), std::string(" she sa").size());
  }
}

// Stops after k tokens, saves, continues in a fresh processor: the same
// tokens, text and finish as one uninterrupted run, for every k.
TEST_F(OutputProcessorTest, ContinuationAfterAnyTokenGivesTheUninterruptedOutput) {
  const auto ids = Ids(" she saw a big dog in the park and ran home");
  for (const std::vector<std::string>& stops :
       {std::vector<std::string>{}, std::vector<std::string>{"g in the"}, std::vector<std::string>{"nothing here"}}) {
    StopConditions stop{static_cast<int>(ids.size()), stops, {}, false};
    OutputProcessor whole(*model_->tokenizer, Greedy(), vocab_, stop, prompt_);
    const Run ref = Feed(whole, ids, *this);
    ASSERT_NE(ref.finish, FinishReason::kNone);
    for (size_t k = 1; k < ref.tokens.size(); ++k) {
      SCOPED_TRACE("stops " + std::to_string(stops.size()) + ", k " + std::to_string(k));
      OutputProcessor first(*model_->tokenizer, Greedy(), vocab_, stop, prompt_);
      Run a = Feed(first, ids, *this, 0, k);
      ASSERT_FALSE(first.finished());
      const Continuation c = first.Save(a.tokens);
      EXPECT_EQ(c.generated, a.tokens);
      OutputProcessor second(*model_->tokenizer, Greedy(), vocab_, stop, prompt_, &c);
      EXPECT_EQ(second.generated(), static_cast<int>(k));
      Run b = Feed(second, ids, *this, k);
      EXPECT_EQ(a.text + b.text, ref.text);
      EXPECT_EQ(b.finish, ref.finish);
      a.tokens.insert(a.tokens.end(), b.tokens.begin(), b.tokens.end());
      EXPECT_EQ(a.tokens, ref.tokens);
    }
  }
}

TEST_F(OutputProcessorTest, StopStringAcrossTheContinuationBoundaryIsHeldAndCut) {
  const auto ids = Ids(" she saw a big dog in the park");
  // Find a boundary inside "big dog": save after the token that ends "bi"
  // or "big" etc., whatever the tokenizer makes of it.
  StopConditions stop{100, {"big dog"}, {}, false};
  OutputProcessor whole(*model_->tokenizer, Greedy(), vocab_, stop, prompt_);
  const Run ref = Feed(whole, ids, *this);
  ASSERT_EQ(ref.finish, FinishReason::kStop);
  ASSERT_EQ(ref.text, " she saw a ");
  bool held_across = false;
  for (size_t k = 1; k < ref.tokens.size(); ++k) {
    OutputProcessor first(*model_->tokenizer, Greedy(), vocab_, stop, prompt_);
    Run a = Feed(first, ids, *this, 0, k);
    const Continuation c = first.Save(a.tokens);
    held_across |= !c.held_text.empty() && c.held_text.back() != ' ';
    OutputProcessor second(*model_->tokenizer, Greedy(), vocab_, stop, prompt_, &c);
    Run b = Feed(second, ids, *this, k);
    EXPECT_EQ(a.text + b.text, ref.text) << "k " << k;
    EXPECT_EQ(b.finish, FinishReason::kStop) << "k " << k;
  }
  // Some boundary fell inside a possible start of the stop string.
  EXPECT_TRUE(held_across);
}

TEST_F(OutputProcessorTest, SeededSamplingWithPenaltiesContinuesExactly) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.95f;
  p.seed = 1234;
  p.presence_penalty = 0.7f;
  p.frequency_penalty = 0.4f;
  p.repetition_penalty = 1.2f;
  p.logprobs = true;
  p.top_logprobs = 3;
  // Smooth logits so the draws and penalties matter.
  std::vector<std::vector<float>> logits(40, std::vector<float>(static_cast<size_t>(vocab_)));
  for (size_t s = 0; s < logits.size(); ++s)
    for (int v = 0; v < vocab_; ++v)
      logits[s][static_cast<size_t>(v)] = static_cast<float>(((v * 7919 + static_cast<int>(s) * 104729) % 997)) / 300.0f;
  StopConditions stop{40, {}, {}, true};
  auto run = [&](OutputProcessor& out, size_t from, size_t to, std::vector<SampleResult>* samples) {
    for (size_t s = from; s < to && !out.finished(); ++s) samples->push_back(out.Next(logits[s].data()).sample);
  };
  OutputProcessor whole(*model_->tokenizer, p, vocab_, stop, prompt_);
  std::vector<SampleResult> ref;
  run(whole, 0, 40, &ref);
  ASSERT_EQ(ref.size(), 40u);
  for (size_t k : {1u, 7u, 31u}) {
    OutputProcessor first(*model_->tokenizer, p, vocab_, stop, prompt_);
    std::vector<SampleResult> got;
    run(first, 0, k, &got);
    std::vector<int32_t> toks;
    for (const auto& s : got) toks.push_back(s.token);
    const Continuation c = first.Save(toks);
    EXPECT_EQ(c.sampler.seed, 1234u);
    EXPECT_EQ(c.sampler.draws, k);
    OutputProcessor second(*model_->tokenizer, p, vocab_, stop, prompt_, &c);
    run(second, k, 40, &got);
    ASSERT_EQ(got.size(), ref.size()) << "k " << k;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].token, ref[i].token) << "k " << k << " token " << i;
      EXPECT_EQ(got[i].logprob, ref[i].logprob);
      ASSERT_EQ(got[i].top.size(), ref[i].top.size());
      for (size_t j = 0; j < got[i].top.size(); ++j) EXPECT_EQ(got[i].top[j].id, ref[i].top[j].id);
    }
  }
  // Without a seed the saved state carries the random one it drew with.
  p.seed.reset();
  OutputProcessor unseeded(*model_->tokenizer, p, vocab_, stop, prompt_);
  std::vector<SampleResult> a;
  run(unseeded, 0, 5, &a);
  std::vector<int32_t> toks;
  for (const auto& s : a) toks.push_back(s.token);
  const Continuation c = unseeded.Save(toks);
  OutputProcessor resumed(*model_->tokenizer, p, vocab_, stop, prompt_, &c);
  OutputProcessor again(*model_->tokenizer, p, vocab_, stop, prompt_, &c);
  std::vector<SampleResult> x, y;
  run(resumed, 5, 20, &x);
  run(again, 5, 20, &y);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i].token, y[i].token);
}

}  // namespace
}  // namespace strata
