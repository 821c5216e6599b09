// The tier registry: kv.tiers parsed from YAML (every kind of the table,
// every refusal by name), the flat keys and flags as shorthands equal to the
// list they stand for, the list and a shorthand together refused, and the
// factory opening real host and disk stores (and refusing a store maker
// that returns the wrong kind).

#include "kvcache/tier_registry.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "kvcache/kv_config.h"

namespace strata::kvcache {
namespace {

Result<std::vector<TierSpec>> FromYaml(const std::string& yaml) {
  auto cfg = Config::Parse(yaml, "t.yaml");
  if (!cfg) return cfg.error();
  STRATA_RETURN_IF_ERROR(cfg->CheckKnownKeys(KvConfigKeys()));
  STRATA_ASSIGN_OR_RETURN(KvCacheConfig c, KvCacheConfigFromYaml(*cfg, {}));
  return LowerTierSpecs(c);
}

// The error of `yaml`, which must fail.
std::string ErrorOf(const std::string& yaml) {
  auto r = FromYaml(yaml);
  EXPECT_FALSE(r.ok()) << yaml;
  return r.ok() ? std::string() : r.error().message();
}

bool SameSpec(const TierSpec& a, const TierSpec& b) {
  return a.kind == b.kind && a.name == b.name && a.bytes == b.bytes && a.path == b.path &&
         a.write_policy == b.write_policy && a.admit_after == b.admit_after && a.pin == b.pin;
}

TEST(TierKindTable, NamesRoundTripAndNothingElseParses) {
  for (TierKind k : kAllTierKinds) EXPECT_EQ(ParseTierKind(TierKindName(k)), k);
  EXPECT_EQ(kAllTierKinds.size(), kNumTierKinds);
  for (const char* bad : {"", "Host", "HOST", "peer", "ssd", "nvme", "dram"}) EXPECT_FALSE(ParseTierKind(bad)) << bad;
}

TEST(TierRegistry, ListParsesEveryKeyInOrder) {
  auto r = FromYaml(R"(
kv:
  tiers:
    - {kind: host, bytes: 8G, write_policy: write-back, pin: false}
    - kind: disk
      name: nvme
      path: /nvme/kv
      bytes: 1T
      admit_after: 2
)");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  ASSERT_EQ(r->size(), 2u);
  const TierSpec& h = (*r)[0];
  EXPECT_EQ(h.kind, TierKind::kHost);
  EXPECT_EQ(h.name, "host");  // defaults to the kind
  EXPECT_EQ(h.bytes, 8ull << 30);
  EXPECT_EQ(h.write_policy, WritePolicy::kWriteBack);
  EXPECT_FALSE(h.pin);
  EXPECT_EQ(h.source, "kv.tiers[0]");
  const TierSpec& d = (*r)[1];
  EXPECT_EQ(d.kind, TierKind::kDisk);
  EXPECT_EQ(d.name, "nvme");
  EXPECT_EQ(d.path, "/nvme/kv");
  EXPECT_EQ(d.bytes, 1ull << 40);
  EXPECT_EQ(d.admit_after, 2u);
  EXPECT_EQ(d.write_policy, WritePolicy::kWriteThrough);
  EXPECT_EQ(d.source, "kv.tiers[1]");
}

TEST(TierRegistry, ListedTiersTurnTheCacheOn) {
  auto cfg = Config::Parse("kv:\n  tiers:\n    - {kind: host, bytes: 1M}\n");
  ASSERT_TRUE(cfg.ok());
  auto c = KvCacheConfigFromYaml(*cfg, {});
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_TRUE(c->tiers_configured);
  auto empty = Config::Parse("kv:\n  tiers: []\n");
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(KvCacheConfigFromYaml(*empty, {})->tiers_configured);
}

TEST(TierRegistry, EveryRefusalNamesTheEntry) {
  struct Case {
    const char* yaml;
    std::vector<std::string> needles;
  };
  const Case cases[] = {
      {"kv:\n  tiers:\n    - {kind: tape, bytes: 1G}\n", {"kv.tiers[0]", "unknown tier kind 'tape'"}},
      {"kv:\n  tiers:\n    - {bytes: 1G}\n", {"kv.tiers[0]", "'kind' is required"}},
      {"kv:\n  tiers:\n    - {kind: host}\n", {"kv.tiers[0]", "'bytes' is required"}},
      {"kv:\n  tiers:\n    - {kind: host, bytes: 0}\n", {"kv.tiers[0]", "bytes is 0"}},
      {"kv:\n  tiers:\n    - {kind: host, bytes: lots}\n", {"kv.tiers[0]", "bytes"}},
      {"kv:\n  tiers:\n    - {kind: disk, bytes: 1G}\n", {"kv.tiers[0]", "needs a path"}},
      {"kv:\n  tiers:\n    - {kind: host, bytes: 1G, path: /x}\n", {"kv.tiers[0]", "path applies to disk tiers"}},
      {"kv:\n  tiers:\n    - {kind: disk, bytes: 1G, path: /x, pin: true}\n", {"kv.tiers[0]", "'pin'"}},
      {"kv:\n  tiers:\n    - {kind: host, bytes: 1G, size: 2G}\n", {"kv.tiers[0]", "unknown key 'size'"}},
      {"kv:\n  tiers:\n    - {kind: host, bytes: 1G, write_policy: lazy}\n", {"kv.tiers[0]", "write_policy"}},
      {"kv:\n  tiers:\n    - {kind: host, bytes: 1G, admit_after: -1}\n", {"kv.tiers[0]", "admit_after"}},
      {"kv:\n  tiers:\n    - {kind: host, bytes: 1G, name: \"\"}\n", {"kv.tiers[0]", "'name' is empty"}},
      {"kv:\n  tiers:\n    - {kind: device, bytes: 1G}\n", {"kv.tiers[0]", "kv.device_bytes"}},
      {"kv:\n  tiers:\n    - {kind: host, name: device, bytes: 1G}\n", {"kv.tiers[0]", "the device pool's"}},
      {"kv:\n  tiers:\n    - {kind: remote, bytes: 1G}\n", {"kv.tiers[0]", "'bytes' does not apply to a remote tier"}},
      {"kv:\n  tiers:\n    - {kind: remote}\n    - {kind: host, bytes: 1G}\n", {"kv.tiers[0]", "must be the last"}},
      {"kv:\n  tiers:\n    - {kind: host, bytes: 1G}\n    - {kind: host, bytes: 2G}\n",
       {"kv.tiers[1]", "'host'", "kv.tiers[0]"}},
      {"kv:\n  tiers:\n    - {kind: host, name: a, bytes: 1G}\n    - {kind: disk, name: a, path: /x, bytes: 2G}\n",
       {"kv.tiers[1]", "'a'"}},
      {"kv:\n  tiers:\n    - {kind: disk, name: a, path: /kv/x, bytes: 1G}\n"
       "    - {kind: disk, name: b, path: /kv/./x/, bytes: 2G}\n",
       {"kv.tiers[1]", "'a' and 'b' share the directory"}},
      {"kv:\n  tiers: {kind: host, bytes: 1G}\n", {"kv.tiers"}},
      {"kv:\n  tiers:\n    - host\n", {"kv.tiers[0]", "mapping"}},
  };
  for (const Case& c : cases) {
    const std::string e = ErrorOf(c.yaml);
    for (const auto& n : c.needles) EXPECT_NE(e.find(n), std::string::npos) << c.yaml << "\n→ " << e;
  }
}

TEST(TierRegistry, ARemoteTierIsListedLastOrAddedByTheFlag) {
  auto cfg = Config::Parse("kv:\n  tiers:\n    - {kind: host, bytes: 1G}\n    - {kind: remote}\n");
  ASSERT_TRUE(cfg.ok());
  auto kv = KvCacheConfigFromYaml(*cfg, {});
  ASSERT_TRUE(kv.ok()) << kv.error().ToString();
  auto listed = LowerTierSpecs(*kv);
  ASSERT_TRUE(listed.ok()) << listed.error().ToString();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[1].kind, TierKind::kRemote);
  EXPECT_EQ((*listed)[1].write_policy, WritePolicy::kNone);

  KvCacheConfig flat;
  ASSERT_TRUE(ApplyKvFlag("--kv-host-bytes", "64M", &flat).ok());
  ASSERT_TRUE(ApplyKvFlag("--kv-remote", "true", &flat).ok());
  auto from_flag = LowerTierSpecs(flat);
  ASSERT_TRUE(from_flag.ok());
  ASSERT_EQ(from_flag->size(), 2u);
  EXPECT_EQ((*from_flag)[1].kind, TierKind::kRemote);
  EXPECT_EQ((*from_flag)[1].name, "remote");
  // Outside a cluster no store can serve it.
  auto opened = OpenTiers(*from_flag, 4096);
  ASSERT_FALSE(opened.ok());
  EXPECT_NE(opened.error().message().find("--metadata"), std::string::npos) << opened.error().message();
}

TEST(TierRegistry, ShorthandsEqualTheListTheyStandFor) {
  KvCacheConfig flat;
  ASSERT_TRUE(ApplyKvFlag("--kv-host-bytes", "64M", &flat).ok());
  ASSERT_TRUE(ApplyKvFlag("--kv-host-write-policy", "write-back", &flat).ok());
  ASSERT_TRUE(ApplyKvFlag("--kv-host-pin", "false", &flat).ok());
  ASSERT_TRUE(ApplyKvFlag("--kv-disk-path", "/var/tmp/kv", &flat).ok());
  ASSERT_TRUE(ApplyKvFlag("--kv-disk-bytes", "4G", &flat).ok());
  ASSERT_TRUE(ApplyKvFlag("--kv-disk-admit-after", "3", &flat).ok());
  auto from_flags = LowerTierSpecs(flat);
  ASSERT_TRUE(from_flags.ok()) << from_flags.error().ToString();

  auto from_keys = FromYaml(
      "kv:\n  host_bytes: 64M\n  host_write_policy: write-back\n  host_pin: false\n"
      "  disk_path: /var/tmp/kv\n  disk_bytes: 4G\n  disk_admit_after: 3\n");
  ASSERT_TRUE(from_keys.ok()) << from_keys.error().ToString();

  auto listed = FromYaml(R"(
kv:
  tiers:
    - {kind: host, name: host, bytes: 64M, write_policy: write-back, pin: false}
    - {kind: disk, name: disk, path: /var/tmp/kv, bytes: 4G, admit_after: 3}
)");
  ASSERT_TRUE(listed.ok()) << listed.error().ToString();
  ASSERT_EQ(from_flags->size(), 2u);
  ASSERT_EQ(from_keys->size(), 2u);
  ASSERT_EQ(listed->size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(SameSpec((*from_flags)[i], (*listed)[i])) << i;
    EXPECT_TRUE(SameSpec((*from_keys)[i], (*listed)[i])) << i;
  }
  // One tier each way, and none.
  KvCacheConfig host_only;
  host_only.host_bytes = 1 << 20;
  EXPECT_EQ(LowerTierSpecs(host_only)->size(), 1u);
  EXPECT_EQ(LowerTierSpecs(KvCacheConfig{})->size(), 0u);
}

TEST(TierRegistry, ListAndShorthandTogetherAreRefusedByName) {
  auto cfg = Config::Parse("kv:\n  tiers:\n    - {kind: host, bytes: 1G}\n");
  ASSERT_TRUE(cfg.ok());
  auto c = KvCacheConfigFromYaml(*cfg, {});
  ASSERT_TRUE(c.ok());
  KvCacheConfig both = *c;
  ASSERT_TRUE(ApplyKvFlag("--kv-disk-path", "/x", &both).ok());
  auto r = LowerTierSpecs(both);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("kv.tiers"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("--kv-disk-path"), std::string::npos) << r.error().message();
  // A shorthand left at its documented default is not a second definition.
  KvCacheConfig defaults = *c;
  ASSERT_TRUE(ApplyKvFlag("--kv-host-bytes", "0", &defaults).ok());
  EXPECT_TRUE(LowerTierSpecs(defaults).ok());
}

TEST(TierRegistry, ChurnWarningNamesListedTiers) {
  auto cfg = Config::Parse(
      "kv:\n  device_bytes: 64M\n  tiers:\n    - {kind: host, name: ram, bytes: 32M}\n"
      "    - {kind: disk, name: ssd, path: /x, bytes: 1G}\n");
  ASSERT_TRUE(cfg.ok());
  auto c = KvCacheConfigFromYaml(*cfg, {});
  ASSERT_TRUE(c.ok());
  std::vector<std::string> warnings;
  ASSERT_TRUE(ValidateKvCacheConfig(*c, 0, &warnings).ok());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("kv.tiers[0].bytes"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("the ram tier will churn"), std::string::npos) << warnings[0];
}

class TierFactoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/tier_registry_" + std::to_string(::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::vector<TierSpec> Specs() {
    TierSpec h;
    h.kind = TierKind::kHost;
    h.name = "ram";
    h.bytes = 1 << 20;
    h.write_policy = WritePolicy::kWriteBack;
    h.pin = false;
    h.source = "kv.tiers[0]";
    TierSpec d;
    d.kind = TierKind::kDisk;
    d.name = "ssd";
    d.bytes = 8 << 20;
    d.path = dir_ + "/ssd";
    d.admit_after = 2;
    d.source = "kv.tiers[1]";
    return {h, d};
  }
  std::string dir_;
};

TEST_F(TierFactoryTest, OpensRealStoresWithEachTiersPolicies) {
  auto t = OpenTiers(Specs(), 4096);
  ASSERT_TRUE(t.ok()) << t.error().ToString();
  ASSERT_EQ(t->stores.size(), 2u);
  ASSERT_EQ(t->lowers.size(), 2u);
  EXPECT_EQ(t->stores[0]->kind(), TierKind::kHost);
  EXPECT_EQ(t->stores[1]->kind(), TierKind::kDisk);
  EXPECT_EQ(t->stores[0]->stats().capacity_bytes, 1u << 20);
  EXPECT_EQ(t->lowers[0].store, t->stores[0].get());
  EXPECT_EQ(t->lowers[0].name, "ram");
  EXPECT_EQ(t->lowers[0].write_policy, WritePolicy::kWriteBack);
  EXPECT_EQ(t->lowers[1].name, "ssd");
  EXPECT_EQ(t->lowers[1].admit_after, 2u);
  EXPECT_TRUE(std::filesystem::is_directory(dir_ + "/ssd"));

  // The manager reports the configured names and the stores' kinds.
  ManualClock clock;
  KvManagerOptions o;
  o.block_size = 4;
  o.num_device_blocks = 4;
  auto mgr = KvManager::Create(o, nullptr, std::move(t->lowers), &clock);
  ASSERT_TRUE(mgr.ok()) << mgr.error().ToString();
  EXPECT_EQ((*mgr)->tier_name(kDeviceTier), "device");
  EXPECT_EQ((*mgr)->tier_kind(kDeviceTier), TierKind::kDevice);
  EXPECT_EQ((*mgr)->tier_name(1), "ram");
  EXPECT_EQ((*mgr)->tier_kind(1), TierKind::kHost);
  EXPECT_EQ((*mgr)->tier_name(2), "ssd");
  EXPECT_EQ((*mgr)->tier_kind(2), TierKind::kDisk);
  EXPECT_EQ((*mgr)->stats().tiers[1].name, "ssd");
  EXPECT_EQ((*mgr)->stats().tiers[1].kind, TierKind::kDisk);
}

TEST_F(TierFactoryTest, StoreErrorsNameTheTier) {
  auto small = OpenTiers(Specs(), 2048);  // below the disk tier's 4096-byte O_DIRECT unit
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.error().message().find("kv.tiers[1] (tier 'ssd')"), std::string::npos) << small.error().message();
  EXPECT_NE(small.error().message().find("4096"), std::string::npos) << small.error().message();

  auto specs = Specs();
  specs[0].bytes = 1000;  // under one block
  auto tiny = OpenTiers(specs, 4096);
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.error().message().find("tier 'ram'"), std::string::npos) << tiny.error().message();
  EXPECT_NE(tiny.error().message().find("smaller than one KV block"), std::string::npos) << tiny.error().message();
}

TEST_F(TierFactoryTest, AMakerMustReturnAStoreOfTheListedKind) {
  StoreMaker wrong = [](const TierSpec& s, uint64_t block_bytes) -> Result<std::unique_ptr<BlockStore>> {
    TierSpec host = s;
    host.kind = TierKind::kHost;
    host.path.clear();
    return OpenStore(host, block_bytes);
  };
  auto r = OpenTiers(Specs(), 4096, wrong);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("returned a host store"), std::string::npos) << r.error().message();
  // The list is checked before any store opens.
  auto specs = Specs();
  specs[1].name = "ram";
  auto dup = OpenTiers(specs, 4096);
  ASSERT_FALSE(dup.ok());
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/ssd"));
}

}  // namespace
}  // namespace strata::kvcache
