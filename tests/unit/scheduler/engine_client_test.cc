// The EngineClient contract (scheduler/engine_client.h), on the in-process
// Engine over the real stories260K model, used through the interface only:
// one final event per stream whether cancelled before its first token, while
// running, twice, or after it ended; events never inside Submit and, with
// the loop running, on the engine's thread; cache flush answered from there,
// cache lookup on the caller's thread at once, even in the middle of a
// forward pass; nothing accepted once stopping; every block back in the
// pool.

#include "scheduler/engine_client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "common/thread_pool.h"
#include "kvcache/kv_manager.h"
#include "model/forward.h"
#include "model/model_loader.h"
#include "scheduler/engine.h"
#include "tests/support/test_env.h"

namespace strata::scheduler {
namespace {

constexpr int kBlockSize = 4;

// The model's forward pass, which can be made to stop inside Forward until
// released (to show what answers while a step runs).
class GatedRunner final : public StepRunner {
 public:
  explicit GatedRunner(ForwardPass* fwd) : inner_(fwd) {}
  Status Forward(std::span<const ForwardSeq> batch, std::vector<float>* logits) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (closed_) {
        entered_ = true;
        cv_.notify_all();
        cv_.wait(lock, [&] { return !closed_; });
      }
    }
    return inner_.Forward(batch, logits);
  }
  int vocab_size() const override { return inner_.vocab_size(); }
  int context_length() const override { return inner_.context_length(); }

  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    entered_ = false;
  }
  // Waits until a forward pass is stopped at the gate.
  bool WaitEntered() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return entered_; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = false;
    cv_.notify_all();
  }

 private:
  ForwardEngineRunner inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false, entered_ = false;
};

struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  int events = 0;
  int finals = 0;
  FinishReason finish = FinishReason::kNone;
  Status status;
  std::thread::id thread;
};

class EngineClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = LoadModel(testing::Stories260KPath());
    ASSERT_TRUE(m.ok()) << m.error().ToString();
    model_ = std::move(m).value();
    threads_ = std::make_unique<ThreadPool>(1);
    KvOptions kv;
    kv.block_size = kBlockSize;
    kv.dtype = DType::kF32;
    kv.num_blocks = 64;
    fwd_ = std::move(ForwardEngine::Create(model_->weights, kv, threads_.get())).value();
    kvcache::KvManagerOptions o;
    o.block_size = kBlockSize;
    o.num_device_blocks = kv.num_blocks;
    o.block_bytes = fwd_->kv_layout().block_bytes();
    o.ns = kvcache::NamespaceDigest(model_->weights.digest, model_->weights.config.arch, "f32", kBlockSize);
    auto mem = [e = fwd_.get()](BlockId id) { return e->block_data(static_cast<int32_t>(id.value())); };
    kv_ = std::move(kvcache::KvManager::Create(o, mem, std::vector<kvcache::LowerTier>{}, &clock_)).value();
    runner_ = std::make_unique<GatedRunner>(fwd_.get());
    engine_ = std::move(Engine::Create({}, runner_.get(), kv_.get(), model_->tokenizer.get(), &clock_)).value();
    client_ = engine_.get();
    prompt_ = TokenizePrompt(*model_, "Once upon a time, there was a little girl named Lily");
  }

  void TearDown() override {
    if (runner_) runner_->Open();  // a test that failed at its gate
    if (engine_) engine_->Stop(0);
    EXPECT_EQ(kv_->stats().device_pool.in_use, 0);
  }

  EngineRequest Request(int max_tokens) const {
    EngineRequest r;
    r.prompt = prompt_;
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    return r;
  }

  RequestId Submit(EngineRequest r, Stream* s) {
    auto id = client_->Submit(std::move(r), [s](RequestOutput&& ev) {
      std::lock_guard<std::mutex> lock(s->mu);
      ++s->events;
      s->thread = std::this_thread::get_id();
      s->tokens.insert(s->tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
      if (ev.finished) {
        ++s->finals;
        s->finish = ev.finish_reason;
        s->status = ev.status;
      }
      s->cv.notify_all();
    });
    EXPECT_TRUE(id.ok()) << id.error().ToString();
    return id.ok() ? *id : RequestId(0);
  }

  void Drain() {
    for (int i = 0; i < 1000 && engine_->num_unfinished() > 0; ++i) ASSERT_TRUE(engine_->Step().ok());
    ASSERT_EQ(engine_->num_unfinished(), 0);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine_->Step().ok());  // late cancels are taken too
  }

  kvcache::ManualClock clock_;
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<ThreadPool> threads_;
  std::unique_ptr<ForwardEngine> fwd_;
  std::unique_ptr<kvcache::KvManager> kv_;
  std::unique_ptr<GatedRunner> runner_;
  std::unique_ptr<Engine> engine_;
  EngineClient* client_ = nullptr;
  std::vector<int32_t> prompt_;
};

TEST_F(EngineClientTest, CancelBeforeTheFirstTokenEndsWithOneAbort) {
  Stream s;
  const RequestId id = Submit(Request(8), &s);
  EXPECT_EQ(s.events, 0);  // never inside Submit
  client_->Cancel(id);
  Drain();
  EXPECT_EQ(s.finals, 1);
  EXPECT_EQ(s.events, 1);
  EXPECT_EQ(s.finish, FinishReason::kAbort);
  EXPECT_EQ(s.status.code(), StatusCode::kCancelled);
  EXPECT_TRUE(s.tokens.empty());
}

TEST_F(EngineClientTest, CancelWhileRunningTwiceEndsWithOneAbort) {
  Stream s;
  const RequestId id = Submit(Request(30), &s);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(engine_->Step().ok());
  ASSERT_GT(s.tokens.size(), 0u);
  ASSERT_EQ(s.finals, 0);
  client_->Cancel(id);
  client_->Cancel(id);
  Drain();
  client_->Cancel(id);  // and once more after the end
  Drain();
  EXPECT_EQ(s.finals, 1);
  EXPECT_EQ(s.finish, FinishReason::kAbort);
  EXPECT_LT(s.tokens.size(), 30u);
}

TEST_F(EngineClientTest, CancelAfterTheLastEventDoesNothing) {
  Stream s;
  const RequestId id = Submit(Request(5), &s);
  Drain();
  ASSERT_EQ(s.finals, 1);
  ASSERT_EQ(s.finish, FinishReason::kLength);
  const int events = s.events;
  client_->Cancel(id);
  client_->Cancel(RequestId(987654));  // never submitted
  Drain();
  EXPECT_EQ(s.events, events);
  EXPECT_EQ(s.finals, 1);
  EXPECT_EQ(s.tokens.size(), 5u);
}

TEST_F(EngineClientTest, EventsArriveOnTheEngineThreadAndLookupsAtOnce) {
  engine_->Start();
  Stream s;
  Submit(Request(6), &s);
  {
    std::unique_lock<std::mutex> lock(s.mu);
    ASSERT_TRUE(s.cv.wait_for(lock, std::chrono::seconds(30), [&] { return s.finals == 1; }));
  }
  EXPECT_NE(s.thread, std::this_thread::get_id());
  EXPECT_EQ(s.finish, FinishReason::kLength);

  // The prompt's full blocks are now cached on the device tier.
  std::mutex mu;
  std::condition_variable cv;
  std::optional<CacheMatch> match;
  std::thread::id where;
  auto lookup = [&] {
    match.reset();
    ASSERT_TRUE(client_->LookupCache(prompt_, "", [&](const CacheMatch& m) {
      std::lock_guard<std::mutex> lock(mu);
      match = m;
      where = std::this_thread::get_id();
      cv.notify_all();
    }));
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return match.has_value(); }));
  };
  lookup();
  const int32_t whole_blocks = static_cast<int32_t>((prompt_.size() - 1) / kBlockSize * kBlockSize);
  EXPECT_EQ(match->prompt_tokens, static_cast<int32_t>(prompt_.size()));
  EXPECT_EQ(match->cached_tokens, whole_blocks);
  EXPECT_EQ(match->block_size, kBlockSize);
  ASSERT_EQ(match->tokens_by_tier.size(), client_->tier_names().size());
  EXPECT_EQ(match->tokens_by_tier[0], whole_blocks);
  EXPECT_EQ(client_->tier_names()[0], "device");
  EXPECT_EQ(where, std::this_thread::get_id());  // answered inside the call: no step to wait for

  std::optional<Result<kvcache::FlushResult>> flushed;
  ASSERT_TRUE(client_->FlushCache(CacheFlush{}, [&](Result<kvcache::FlushResult> r) {
    std::lock_guard<std::mutex> lock(mu);
    flushed = std::move(r);
    cv.notify_all();
  }));
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return flushed.has_value(); }));
  }
  ASSERT_TRUE(flushed->ok());
  EXPECT_GE((*flushed)->device_blocks, static_cast<uint64_t>(whole_blocks / kBlockSize));
  lookup();
  EXPECT_EQ(match->cached_tokens, 0);

  const EngineStats st = client_->Stats();
  ASSERT_FALSE(st.tiers.empty());
  EXPECT_EQ(st.tiers[0].name, "device");
  EXPECT_EQ(st.finished_by_reason.at("length"), 1u);

  engine_->Stop(0);
  EXPECT_FALSE(client_->LookupCache(prompt_, "", [](const CacheMatch&) { ADD_FAILURE() << "called after stop"; }));
  EXPECT_FALSE(client_->FlushCache(CacheFlush{}, [](Result<kvcache::FlushResult>) { ADD_FAILURE(); }));
  Stream late;
  auto refused = client_->Submit(Request(2), [&late](RequestOutput&&) { ++late.events; });
  EXPECT_EQ(refused.error().code(), StatusCode::kUnavailable);
  EXPECT_EQ(late.events, 0);
}

// A router asks every candidate before it picks one: an instance in the
// middle of a long forward pass still answers at once, with what its cache
// holds, rather than when the step ends.
TEST_F(EngineClientTest, ACacheLookupIsAnsweredInTheMiddleOfAForwardPass) {
  engine_->Start();
  Stream first;
  Submit(Request(3), &first);
  {
    std::unique_lock<std::mutex> lock(first.mu);
    ASSERT_TRUE(first.cv.wait_for(lock, std::chrono::seconds(30), [&] { return first.finals == 1; }));
  }
  runner_->Close();
  Stream other;
  EngineRequest r = Request(3);
  r.prompt = TokenizePrompt(*model_, "The sun was hot and the sky was blue");
  Submit(std::move(r), &other);
  ASSERT_TRUE(runner_->WaitEntered());  // the loop is inside Forward, and stays there

  std::optional<CacheMatch> match;
  std::thread::id where;
  const bool asked = client_->LookupCache(prompt_, "", [&](const CacheMatch& m) {
    match = m;
    where = std::this_thread::get_id();
  });
  const bool answered = match.has_value();
  runner_->Open();
  {
    std::unique_lock<std::mutex> lock(other.mu);
    ASSERT_TRUE(other.cv.wait_for(lock, std::chrono::seconds(30), [&] { return other.finals == 1; }));
  }
  EXPECT_EQ(other.finish, FinishReason::kLength);
  EXPECT_EQ(other.tokens.size(), 3u);
  ASSERT_TRUE(asked);
  ASSERT_TRUE(answered) << "the lookup waited for the step to end";
  EXPECT_EQ(where, std::this_thread::get_id());
  const int32_t whole_blocks = static_cast<int32_t>((prompt_.size() - 1) / kBlockSize * kBlockSize);
  EXPECT_EQ(match->cached_tokens, whole_blocks);
  EXPECT_EQ(match->tokens_by_tier[0], whole_blocks);
}

// Lookups from another thread while requests run (their forward passes
// and their blocks' commits and evictions): every lookup is answered, and
// the requests generate what they generate alone. (Run under TSan too.)
TEST_F(EngineClientTest, LookupsWhileRequestsRunChangeNothing) {
  engine_->Start();
  auto run = [&](bool with_lookups) {
    std::vector<Stream> streams(4);
    std::atomic<bool> done{false};
    std::atomic<int> answered{0}, asked{0};
    std::thread looker([&] {
      while (with_lookups && !done.load()) {
        if (client_->LookupCache(prompt_, "", [&](const CacheMatch& m) {
              EXPECT_LE(m.cached_tokens, static_cast<int32_t>(prompt_.size()));
              ++answered;
            }))
          ++asked;
      }
    });
    // The requests start once the lookups are under way.
    while (with_lookups && asked.load() == 0) std::this_thread::yield();
    for (Stream& s : streams) Submit(Request(12), &s);
    for (Stream& s : streams) {
      std::unique_lock<std::mutex> lock(s.mu);
      EXPECT_TRUE(s.cv.wait_for(lock, std::chrono::seconds(60), [&] { return s.finals == 1; }));
    }
    done = true;
    looker.join();
    if (with_lookups) {
      EXPECT_GT(asked.load(), 0);
      EXPECT_EQ(answered.load(), asked.load());  // answered inside the call
    }
    std::vector<std::vector<int32_t>> out;
    for (Stream& s : streams) out.push_back(s.tokens);
    return out;
  };
  const auto alone = run(false);
  const auto looked = run(true);
  EXPECT_EQ(alone, looked);
  for (const auto& t : alone) EXPECT_EQ(t.size(), 12u);
}

TEST_F(EngineClientTest, AHeldRequestGeneratesNothingUntilReleased) {
  Stream s, other;
  const RequestId id = Submit(Request(20), &s);
  Submit(Request(20), &other);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine_->Step().ok());
  ASSERT_GT(s.tokens.size(), 0u);
  client_->SetHeld(id, true);
  ASSERT_TRUE(engine_->Step().ok());  // takes the hold
  const size_t at_hold = s.tokens.size();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(engine_->Step().ok());
  EXPECT_EQ(s.tokens.size(), at_hold);    // held: nothing more
  EXPECT_GT(other.tokens.size(), at_hold);  // the other request went on
  EXPECT_EQ(client_->Stats().num_running, 1 + (other.finals == 0 ? 1 : 0));  // keeps its place
  client_->SetHeld(id, false);
  Drain();
  EXPECT_EQ(s.finals, 1);
  EXPECT_EQ(s.finish, FinishReason::kLength);
  EXPECT_EQ(s.tokens.size(), 20u);

  // Cancelled while held: one final abort, blocks back.
  Stream h;
  const RequestId hid = Submit(Request(20), &h);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine_->Step().ok());
  client_->SetHeld(hid, true);
  ASSERT_TRUE(engine_->Step().ok());
  client_->Cancel(hid);
  Drain();
  EXPECT_EQ(h.finals, 1);
  EXPECT_EQ(h.finish, FinishReason::kAbort);
}

TEST_F(EngineClientTest, StoppingEndsEveryOpenStreamWithOneFinalEvent) {
  Stream a, b;
  Submit(Request(30), &a);
  Submit(Request(30), &b);
  ASSERT_TRUE(engine_->Step().ok());
  engine_->Stop(0);
  for (Stream* s : {&a, &b}) {
    EXPECT_EQ(s->finals, 1);
    EXPECT_EQ(s->finish, FinishReason::kAbort);
    EXPECT_EQ(s->status.code(), StatusCode::kUnavailable);
  }
}

}  // namespace
}  // namespace strata::scheduler
