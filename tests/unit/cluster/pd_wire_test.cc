// The prefill/decode messages (cluster/pd_wire.h): every field of an engine
// request and of an output survives the round trip (a continuation's
// non-UTF-8 held bytes, a -inf logprob, a status), and bad messages are
// refused naming the field.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "cluster/pd_wire.h"

namespace strata::cluster {
namespace {

scheduler::EngineRequest FullRequest() {
  scheduler::EngineRequest r;
  r.prompt = {1, 2, 3, 400};
  r.max_tokens = 33;
  r.sampling.temperature = 0.7f;
  r.sampling.top_p = 0.9f;
  r.sampling.top_k = 40;
  r.sampling.min_p = 0.05f;
  r.sampling.seed = 18446744073709551557ULL;
  r.sampling.presence_penalty = 0.5f;
  r.sampling.frequency_penalty = -0.25f;
  r.sampling.repetition_penalty = 1.2f;
  r.sampling.logit_bias = {{5, -100.0f}, {7, 2.5f}};
  r.sampling.top_logprobs = 3;
  r.sampling.logprobs = true;
  r.stop = {"\n\n", "END"};
  r.stop_token_ids = {9, 10};
  r.ignore_eos = true;
  r.cache_salt = "tenant-a";
  r.cache_ttl_seconds = 60;
  r.priority = -2;
  r.pause_after = 1;
  r.continuation.generated = {11, 12};
  r.continuation.sampler.seed = 99;
  r.continuation.sampler.draws = 2;
  r.continuation.sampler.num_generated = 2;
  r.continuation.sampler.generated_counts = {{11, 1}, {12, 1}};
  r.continuation.held_bytes = std::string("\xe2\x82", 2);  // half of a UTF-8 character
  r.continuation.held_text = "EN";
  return r;
}

TEST(PdWire, AnEngineRequestCrossesWhole) {
  const scheduler::EngineRequest r = FullRequest();
  auto back = EngineRequestFromJson(EngineRequestToJson(r));
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_EQ(back->prompt, r.prompt);
  EXPECT_EQ(back->max_tokens, 33);
  EXPECT_EQ(back->sampling.temperature, 0.7f);
  EXPECT_EQ(back->sampling.top_p, 0.9f);
  EXPECT_EQ(back->sampling.top_k, 40);
  EXPECT_EQ(back->sampling.min_p, 0.05f);
  EXPECT_EQ(back->sampling.seed, r.sampling.seed);
  EXPECT_EQ(back->sampling.presence_penalty, 0.5f);
  EXPECT_EQ(back->sampling.frequency_penalty, -0.25f);
  EXPECT_EQ(back->sampling.repetition_penalty, 1.2f);
  EXPECT_EQ(back->sampling.logit_bias, r.sampling.logit_bias);
  EXPECT_EQ(back->sampling.top_logprobs, 3);
  EXPECT_TRUE(back->sampling.logprobs);
  EXPECT_EQ(back->stop, r.stop);
  EXPECT_EQ(back->stop_token_ids, r.stop_token_ids);
  EXPECT_TRUE(back->ignore_eos);
  EXPECT_EQ(back->cache_salt, "tenant-a");
  EXPECT_EQ(back->cache_ttl_seconds, 60);
  EXPECT_EQ(back->priority, -2);
  EXPECT_EQ(back->pause_after, 1);
  EXPECT_EQ(back->continuation.generated, r.continuation.generated);
  EXPECT_EQ(back->continuation.sampler.seed, 99u);
  EXPECT_EQ(back->continuation.sampler.draws, 2u);
  EXPECT_EQ(back->continuation.sampler.num_generated, 2);
  EXPECT_EQ(back->continuation.sampler.generated_counts, r.continuation.sampler.generated_counts);
  EXPECT_EQ(back->continuation.held_bytes, r.continuation.held_bytes);
  EXPECT_EQ(back->continuation.held_text, "EN");

  scheduler::EngineRequest plain;
  plain.prompt = {1};
  auto p = EngineRequestFromJson(EngineRequestToJson(plain));
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->sampling.seed.has_value());
  EXPECT_TRUE(p->continuation.empty());
}

TEST(PdWire, AnOutputCrossesWhole) {
  scheduler::RequestOutput o;
  o.token_ids = {5, 6};
  o.text = "h\xc3\xa9";
  SampleResult s;
  s.token = 5;
  s.logprob = -std::numeric_limits<float>::infinity();
  s.top = {{5, -0.5f}, {6, -std::numeric_limits<float>::infinity()}};
  o.logprobs = {s, s};
  o.finished = true;
  o.finish_reason = FinishReason::kPaused;
  o.status = Status::Unavailable("peer gone");
  o.prompt_tokens = 12;
  o.completion_tokens = 2;
  o.cached_tokens = 8;
  o.cached_tokens_by_tier = {8, 0};
  o.preemptions = 1;
  o.continuation = FullRequest().continuation;
  auto back = RequestOutputFromJson(RequestOutputToJson(o));
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_EQ(back->token_ids, o.token_ids);
  EXPECT_EQ(back->text, o.text);
  ASSERT_EQ(back->logprobs.size(), 2u);
  EXPECT_TRUE(std::isinf(back->logprobs[0].logprob));
  ASSERT_EQ(back->logprobs[0].top.size(), 2u);
  EXPECT_EQ(back->logprobs[0].top[0].logprob, -0.5f);
  EXPECT_TRUE(std::isinf(back->logprobs[0].top[1].logprob));
  EXPECT_TRUE(back->finished);
  EXPECT_EQ(back->finish_reason, FinishReason::kPaused);
  EXPECT_EQ(back->status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(back->status.message(), "peer gone");
  EXPECT_EQ(back->cached_tokens_by_tier, o.cached_tokens_by_tier);
  EXPECT_EQ(back->preemptions, 1);
  ASSERT_TRUE(back->continuation.has_value());
  EXPECT_EQ(back->continuation->held_bytes, o.continuation->held_bytes);
}

TEST(PdWire, TheHandoffMessagesCrossWhole) {
  ReserveRequest q{7, {1, 2, 3}, "salt", 5000, "prefill-a"};
  auto q2 = ReserveRequestFromJson(ReserveRequestToJson(q));
  ASSERT_TRUE(q2.ok()) << q2.error().ToString();
  EXPECT_EQ(q2->id, 7u);
  EXPECT_EQ(q2->prompt, q.prompt);
  EXPECT_EQ(q2->grantee, "prefill-a");

  ReserveReply a{7, 2, 5, 4096, {31, 32, 33}, "127.0.0.1:9000"};
  PrefillRequest p{FullRequest(), a};
  auto p2 = PrefillRequestFromJson(PrefillRequestToJson(p));
  ASSERT_TRUE(p2.ok()) << p2.error().ToString();
  EXPECT_EQ(p2->decode.grants, a.grants);
  EXPECT_EQ(p2->decode.held_blocks, 2);
  EXPECT_EQ(p2->decode.transfer, a.transfer);
  EXPECT_EQ(p2->request.prompt, p.request.prompt);
  EXPECT_EQ(p2->grants_key, 0u);
  // The grants following the prefill request: with a reservation, and without.
  PrefillRequest keyed{FullRequest(), {}, 18446744073709551615ULL};
  auto k2 = PrefillRequestFromJson(PrefillRequestToJson(keyed));
  ASSERT_TRUE(k2.ok()) << k2.error().ToString();
  EXPECT_EQ(k2->grants_key, keyed.grants_key);
  EXPECT_TRUE(k2->decode.grants.empty());
  auto g = GrantsMessageFromJson(GrantsMessageToJson({9, a}));
  ASSERT_TRUE(g.ok()) << g.error().ToString();
  EXPECT_EQ(g->key, 9u);
  ASSERT_TRUE(g->decode.has_value());
  EXPECT_EQ(g->decode->grants, a.grants);
  auto none = GrantsMessageFromJson(GrantsMessageToJson({9, std::nullopt}));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->decode.has_value());

  DecodeRequest d{7, 3, {1, 18446744073709551615ULL, 3}, FullRequest()};
  auto d2 = DecodeRequestFromJson(DecodeRequestToJson(d));
  ASSERT_TRUE(d2.ok()) << d2.error().ToString();
  EXPECT_EQ(d2->filled, 3);
  EXPECT_EQ(d2->checksums, d.checksums) << "64-bit checksums survive";
  EXPECT_EQ(d2->request.continuation.generated, d.request.continuation.generated);

  PrefillReply r;
  r.output.finish_reason = FinishReason::kPaused;
  r.blocks_written = 3;
  r.checksums = {9, 8, 7};
  auto r2 = PrefillReplyFromJson(PrefillReplyToJson(r));
  ASSERT_TRUE(r2.ok()) << r2.error().ToString();
  EXPECT_EQ(r2->blocks_written, 3);
  EXPECT_EQ(r2->checksums, r.checksums);
}

TEST(PdWire, BadMessagesAreRefusedNamingTheField) {
  auto msg = [](const Result<ReserveRequest>& r) { return r.ok() ? std::string("ok") : r.error().message(); };
  EXPECT_NE(msg(ReserveRequestFromJson("[1]")).find("not a JSON object"), std::string::npos);
  EXPECT_NE(msg(ReserveRequestFromJson(R"({"id":1,"prompt":[],"lease_ms":5,"grantee":"a"})")).find("'prompt'"),
            std::string::npos);
  EXPECT_NE(msg(ReserveRequestFromJson(R"({"id":-1,"prompt":[1],"lease_ms":5,"grantee":"a"})")).find("'id'"),
            std::string::npos);
  EXPECT_NE(msg(ReserveRequestFromJson(R"({"id":1,"prompt":[1],"lease_ms":0,"grantee":"a"})")).find("'lease_ms'"),
            std::string::npos);
  auto e = EngineRequestFromJson(R"({"prompt":[1],"sampling":{"top_k":"x"}})");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message().find("'sampling.top_k'"), std::string::npos) << e.error().message();
  auto c = EngineRequestFromJson(R"({"prompt":[1],"continuation":{"generated":[1],"held_bytes":"zz"}})");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message().find("'continuation.held_bytes'"), std::string::npos) << c.error().message();
  auto g = ReserveReplyFromJson(R"({"id":1,"held_blocks":1,"blocks":3,"grants":[5]})");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message().find("'grants'"), std::string::npos);
  auto f = RequestOutputFromJson(R"({"finish_reason":"done"})");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message().find("'finish_reason'"), std::string::npos);
}

}  // namespace
}  // namespace strata::cluster
