// Cluster metadata: the gateway client's encodings and the embedded store's
// lease semantics (etcd's, as the client relies on them).
#include "transfer/metadata.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace strata::transfer {
namespace {

using nlohmann::json;

TEST(Metadata, Base64MatchesRfc4648) {
  const std::pair<const char*, const char*> cases[] = {{"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},
                                                       {"foo", "Zm9v"},   {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="},
                                                       {"foobar", "Zm9vYmFy"}};
  for (auto [plain, enc] : cases) {
    EXPECT_EQ(Base64Encode(plain), enc);
    EXPECT_EQ(*Base64Decode(enc), plain);
  }
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes += static_cast<char>(i);
  EXPECT_EQ(*Base64Decode(Base64Encode(bytes)), bytes);
  EXPECT_FALSE(Base64Decode("Zm9v!").has_value());
}

TEST(Metadata, ParsesUrlsAndInstances) {
  auto e = ParseMetadataUrl("etcd://127.0.0.1:2379");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind, MetadataUrl::Kind::kEtcd);
  EXPECT_EQ(e->port, 2379);
  auto s = ParseMetadataUrl("strata://10.0.0.1:2389/");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->kind, MetadataUrl::Kind::kStrata);
  EXPECT_EQ(s->host, "10.0.0.1");
  EXPECT_FALSE(ParseMetadataUrl("http://x:1").has_value());
  EXPECT_FALSE(ParseMetadataUrl("etcd://x").has_value());

  InstanceInfo i;
  i.name = "prefill-0";
  i.role = "prefill";
  i.incarnation = "abcd";
  i.transfer_address = "127.0.0.1:5000";
  i.transports = {"shm", "tcp"};
  auto back = InstanceFromJson(InstanceToJson(i));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->name, "prefill-0");
  EXPECT_EQ(back->role, "prefill");
  EXPECT_EQ(back->transports, (std::vector<std::string>{"shm", "tcp"}));
  EXPECT_FALSE(InstanceFromJson("{}").has_value());
  EXPECT_FALSE(InstanceFromJson("not json").has_value());
}

struct Gateway {
  MetaStore store;
  int64_t now = 1000;
  json Call(const std::string& path, const json& body, int* status = nullptr) {
    int st = 0;
    json j = json::parse(store.Handle(path, body.dump(), now, &st));
    if (status) *status = st;
    return j;
  }
};

TEST(MetaStore, LeasesExpireUnlessKeptAlive) {
  Gateway g;
  json grant = g.Call("/v3/lease/grant", {{"TTL", 3}});
  std::string id = grant["ID"];
  EXPECT_EQ(grant["TTL"], "3");
  int st = 0;
  g.Call("/v3/kv/put", {{"key", Base64Encode("/strata/instances/a")}, {"value", Base64Encode("A")}, {"lease", id}}, &st);
  EXPECT_EQ(st, 200);
  g.Call("/v3/kv/put", {{"key", Base64Encode("/strata/instances/b")}, {"value", Base64Encode("B")}}, &st);
  g.Call("/v3/kv/put", {{"key", Base64Encode("/other")}, {"value", Base64Encode("X")}}, &st);
  json range = g.Call("/v3/kv/range", {{"key", Base64Encode("/strata/instances/")},
                                       {"range_end", Base64Encode("/strata/instances0")}});
  EXPECT_EQ(range["count"], "2");
  // Kept alive at 2.5 s, the lease lives to 5.5 s.
  g.now += 2500;
  json ka = g.Call("/v3/lease/keepalive", {{"ID", id}});
  EXPECT_EQ(ka["result"]["TTL"], "3");
  g.now += 2900;
  EXPECT_EQ(g.store.size(g.now), 3u);
  g.now += 200;
  EXPECT_EQ(g.store.size(g.now), 2u) << "a's key went with its lease";
  ka = g.Call("/v3/lease/keepalive", {{"ID", id}});
  EXPECT_FALSE(ka["result"].contains("TTL")) << "an expired lease keeps nothing alive";
  g.Call("/v3/kv/put", {{"key", Base64Encode("k")}, {"value", Base64Encode("v")}, {"lease", id}}, &st);
  EXPECT_EQ(st, 404);
}

TEST(MetaStore, RevokeDeleteAndMinimumTtl) {
  Gateway g;
  json grant = g.Call("/v3/lease/grant", {{"TTL", 1}});
  EXPECT_EQ(grant["TTL"], "2") << "at least 2 s, as etcd";
  std::string id = grant["ID"];
  int st = 0;
  g.Call("/v3/kv/put", {{"key", Base64Encode("a")}, {"value", Base64Encode("1")}, {"lease", id}}, &st);
  g.Call("/v3/lease/revoke", {{"ID", id}}, &st);
  EXPECT_EQ(st, 200);
  EXPECT_EQ(g.store.size(g.now), 0u);
  g.Call("/v3/lease/revoke", {{"ID", id}}, &st);
  EXPECT_EQ(st, 404);
  g.Call("/v3/kv/put", {{"key", Base64Encode("b")}, {"value", Base64Encode("2")}}, &st);
  json del = g.Call("/v3/kv/deleterange", {{"key", Base64Encode("b")}, {"range_end", ""}});
  EXPECT_EQ(del["deleted"], "1");
  g.Call("/v3/kv/put", {{"key", Base64Encode("c")}, {"value", Base64Encode("3")}}, &st);
  json all = g.Call("/v3/kv/range", {{"key", Base64Encode("a")}, {"range_end", Base64Encode(std::string(1, '\0'))}});
  EXPECT_EQ(all["count"], "1") << "range_end \"\\0\" means every key from `key` on";
  g.Call("/v3/nope", json::object(), &st);
  EXPECT_EQ(st, 404);
  EXPECT_EQ(g.store.Handle("/v3/kv/put", "garbage", g.now, &st).find("error") != std::string::npos, true);
  EXPECT_EQ(st, 400);
}

}  // namespace
}  // namespace strata::transfer
