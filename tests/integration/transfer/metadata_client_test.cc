// MetadataClient against the embedded store behind a real HTTP server on
// 127.0.0.1: registration, renewal, recovery after the store lost
// everything, deregistration.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <thread>

#include "server/http_server.h"
#include "transfer/metadata.h"

namespace strata::transfer {
namespace {

using namespace std::chrono_literals;

class StoreServer {
 public:
  StoreServer() {
    server::HttpServerOptions o;
    o.port = 0;
    auto s = server::HttpServer::Create(o, [this](server::HttpRequest&& req,
                                                  std::shared_ptr<server::ResponseWriter> w) {
      int status = 200;
      std::string body;
      {
        std::lock_guard lock(mu_);
        body = store_->Handle(req.path, req.body, NowMs(), &status);
      }
      w->Send(status, "application/json", std::move(body));
    });
    EXPECT_TRUE(s.has_value());
    http_ = std::move(*s);
    http_->Start();
  }
  ~StoreServer() { http_->Stop(); }
  MetadataUrl url() const { return MetadataUrl{MetadataUrl::Kind::kStrata, "127.0.0.1", http_->port()}; }
  // The store restarts empty.
  void Lose() {
    std::lock_guard lock(mu_);
    store_ = std::make_unique<MetaStore>();
  }
  size_t size() {
    std::lock_guard lock(mu_);
    return store_->size(NowMs());
  }

 private:
  static int64_t NowMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  std::mutex mu_;
  std::unique_ptr<MetaStore> store_ = std::make_unique<MetaStore>();
  std::unique_ptr<server::HttpServer> http_;
};

bool WaitUntil(const std::function<bool()>& f, std::chrono::milliseconds limit) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (f()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return f();
}

TEST(MetadataClient, RegistersRenewsRecoversAndLeaves) {
  StoreServer store;
  auto client = MetadataClient::Create(store.url());
  ASSERT_TRUE(client.has_value());
  InstanceInfo self;
  self.name = "i-1";
  self.transfer_address = "127.0.0.1:7000";
  ASSERT_TRUE((*client)->Register(self, 2).ok());
  auto list = (*client)->List();
  ASSERT_TRUE(list.has_value());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].transfer_address, "127.0.0.1:7000");
  // Renewed: still there after three lease lengths.
  std::this_thread::sleep_for(6s);
  EXPECT_EQ(store.size(), 1u);
  // The store loses everything: the keeper registers again.
  store.Lose();
  EXPECT_TRUE(WaitUntil([&] { return store.size() == 1; }, 5s));
  EXPECT_GE((*client)->status().registrations, 2u);
  // Leaving removes it at once; registering again needs a new client.
  ASSERT_TRUE((*client)->Deregister().ok());
  EXPECT_EQ(store.size(), 0u);
  EXPECT_FALSE((*client)->Register(self, 2).ok());
  EXPECT_TRUE((*client)->Deregister().ok()) << "a second Deregister has nothing to revoke";
}

TEST(MetadataClient, AnUnreachableStoreIsRetried) {
  auto client = MetadataClient::Create(MetadataUrl{MetadataUrl::Kind::kStrata, "127.0.0.1", 1}, 0.5);
  InstanceInfo self;
  self.name = "i-2";
  ASSERT_TRUE((*client)->Register(self, 2).ok()) << "not fatal: retried in the background";
  EXPECT_FALSE((*client)->status().registered);
  EXPECT_GE((*client)->status().failures, 1u);
  EXPECT_FALSE((*client)->List().has_value());
}

}  // namespace
}  // namespace strata::transfer
