// The real stories260K model against reference outputs of an independent
// engine (llama.cpp): tokenization, greedy continuations token for token,
// last-position logits and per-step top-5 log-probabilities.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/thread_pool.h"
#include "model/forward.h"
#include "model/model_loader.h"
#include "tests/support/test_env.h"

namespace strata {
namespace {

nlohmann::json Golden() {
  std::ifstream in(testing::SharedDir() + "/golden/stories260K_greedy.json");
  EXPECT_TRUE(in.good()) << "missing golden file under " << testing::SharedDir();
  return nlohmann::json::parse(in);
}

class GoldenStories : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    auto m = LoadModel(testing::Stories260KPath());
    ASSERT_TRUE(m) << m.error().ToString();
    model_ = std::move(*m);
  }
  std::unique_ptr<LoadedModel> model_;
};

TEST(GoldenStoriesLoad, ModelMetadata) {
  auto m = LoadModel(testing::Stories260KPath());
  ASSERT_TRUE(m) << m.error().ToString();
  const ModelConfig& c = (*m)->weights.config;
  EXPECT_EQ((*m)->id, "stories260K");
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.ffn_dim, 172);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.context_length, 512);
  EXPECT_EQ((*m)->tokenizer->bos_id(), 1);
  EXPECT_EQ((*m)->tokenizer->eos_id(), 2);
  EXPECT_FALSE((*m)->synthetic);
}

TEST(GoldenStoriesLoad, TokenizationMatchesEveryPrompt) {
  auto m = LoadModel(testing::Stories260KPath());
  ASSERT_TRUE(m) << m.error().ToString();
  const nlohmann::json golden = Golden();
  ASSERT_EQ(golden["cases"].size(), 7u);
  for (const auto& c : golden["cases"]) {
    std::vector<int32_t> want = c["prompt_token_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(TokenizePrompt(**m, c["prompt"].get<std::string>()), want) << c["prompt"];
  }
}

// Greedy generation with the engine, checked step by step.
TEST_P(GoldenStories, GreedyContinuationsAndLogits) {
  const DType kv_type = GetParam();
  ThreadPool pool(2);
  KvOptions kv;
  kv.block_size = 16;
  kv.dtype = kv_type;
  kv.num_blocks = 512 / 16;
  auto eng = ForwardEngine::Create(model_->weights, kv, &pool);
  ASSERT_TRUE(eng) << eng.error().ToString();
  const int V = 512;
  double worst_logit_err = 0, worst_logprob_err = 0, worst_margin_err = 0, min_margin = 1e9, f32ref_err = 0, f32ref_margin_err = 0;
  const nlohmann::json golden = Golden();
  ASSERT_EQ(golden["cases"].size(), 7u);
  for (const auto& c : golden["cases"]) {
    std::vector<int32_t> seq = c["prompt_token_ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> want = c["generated_token_ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> table(32);
    for (int i = 0; i < 32; ++i) table[i] = i;
    std::vector<float> logits;
    ForwardSeq prefill{seq, 0, table};
    ASSERT_TRUE((*eng)->Forward({&prefill, 1}, &logits).ok());
    if (c.contains("last_prompt_logits")) {
      std::vector<float> ref = c["last_prompt_logits"].get<std::vector<float>>();
      for (int i = 0; i < V; ++i) worst_logit_err = std::max(worst_logit_err, std::abs(double(logits[i]) - ref[i]));
    }
    std::vector<int32_t> got;
    const auto& steps = c["top5_logprobs_per_step"];
    for (size_t step = 0; step < want.size(); ++step) {
      int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      // Log-softmax of our logits vs the reference's top-5.
      double mx = *std::max_element(logits.begin(), logits.end()), z = 0;
      for (float l : logits) z += std::exp(l - mx);
      for (const auto& pair : steps[step]["top5"]) {
        int id = pair[0].get<int>();
        double lp = logits[id] - mx - std::log(z);
        worst_logprob_err = std::max(worst_logprob_err, std::abs(lp - pair[1].get<double>()));
        if (!c.contains("last_prompt_logits")) f32ref_err = std::max(f32ref_err, std::abs(lp - pair[1].get<double>()));
      }
      // The top-1/top-2 margin, ours vs the reference's.
      std::vector<float> sorted(logits);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      double ref_margin = steps[step]["margin_top1_top2"].get<double>();
      worst_margin_err = std::max(worst_margin_err, std::abs((sorted[0] - sorted[1]) - ref_margin));
      if (!c.contains("last_prompt_logits"))
        f32ref_margin_err = std::max(f32ref_margin_err, std::abs((sorted[0] - sorted[1]) - ref_margin));
      min_margin = std::min(min_margin, ref_margin);
      if (next != want[step]) {
        ADD_FAILURE() << "prompt '" << c["prompt"].get<std::string>() << "' step " << step << ": got " << next
                      << ", reference " << want[step] << " (reference top1-top2 margin "
                      << steps[step]["margin_top1_top2"].get<double>() << ")";
        break;
      }
      got.push_back(next);
      seq.push_back(next);
      if (step + 1 == want.size()) break;
      ForwardSeq d{std::span<const int32_t>(&seq.back(), 1), static_cast<int32_t>(seq.size() - 1), table};
      ASSERT_TRUE((*eng)->Forward({&d, 1}, &logits).ok());
    }
    EXPECT_EQ(got, want) << c["prompt"];
    // The detokenized continuation is the reference text.
    std::vector<int32_t> prompt_ids = c["prompt_token_ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> all = prompt_ids;
    all.insert(all.end(), got.begin(), got.end());
    EXPECT_EQ(model_->tokenizer->Decode(all, true),
              model_->tokenizer->Decode(prompt_ids, true) + c["generated_text"].get<std::string>())
        << c["prompt"];
  }
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "vs f16-KV reference: logits %.3e, top-5 logprobs %.3e, margin %.3e; vs f32-KV reference: top-5 "
                "logprobs %.3e, margin %.3e; smallest margin %.3e",
                worst_logit_err, worst_logprob_err, worst_margin_err, f32ref_err, f32ref_margin_err, min_margin);
  RecordProperty("worst_abs_errors", buf);
  std::printf("%s\n", buf);
  // The first five reference cases were computed with an f16 KV cache (and
  // f16 Q and attention weights, as that engine's CPU path does), so they carry
  // ~1e-2 of rounding noise; the last two used an f32 KV cache. With f32 KV we
  // must match those to far below the smallest top-1/top-2 margin (~0.015).
  EXPECT_LT(worst_logit_err, 2.5e-2) << buf;
  EXPECT_LT(worst_logprob_err, 3e-2) << buf;
  if (kv_type == DType::kF32) {
    EXPECT_LT(f32ref_err, 1e-4) << buf;
    EXPECT_LT(f32ref_margin_err, 1e-4) << buf;
  }
}

INSTANTIATE_TEST_SUITE_P(KvTypes, GoldenStories, ::testing::Values(DType::kF32, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace strata
