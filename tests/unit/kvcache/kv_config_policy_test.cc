// The write-policy and prefetch keys of KvCacheConfig (kv.host_write_policy,
// kv.disk_write_policy, kv.prefetch_max_requests and their --kv-* flags),
// with precise errors, and the churn warning for a lower tier that is not
// larger than the tier above it (equal sizes included).

#include <gtest/gtest.h>

#include "kvcache/kv_config.h"

namespace strata::kvcache {
namespace {

TEST(KvConfigPolicyTest, YamlKeysSetWritePoliciesAndPrefetch) {
  auto cfg = Config::Parse(R"(
kv:
  host_write_policy: write-back
  disk_write_policy: write-through
  prefetch_max_requests: 0
)",
                           "test.yaml");
  ASSERT_TRUE(cfg.ok());
  ASSERT_TRUE(cfg->CheckKnownKeys(KvConfigKeys()).ok());
  auto c = KvCacheConfigFromYaml(*cfg, {});
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_EQ(c->host_write_policy, WritePolicy::kWriteBack);
  EXPECT_EQ(c->disk_write_policy, WritePolicy::kWriteThrough);
  EXPECT_EQ(c->prefetch_max_requests, 0);
  KvCacheConfig defaults;
  EXPECT_FALSE(defaults.host_write_policy_set);
  EXPECT_EQ(defaults.disk_write_policy, WritePolicy::kWriteThrough);
  EXPECT_EQ(defaults.prefetch_max_requests, 4);
}

// kv.eviction_policy is the default of the host and the disk tier (the
// shorthands and kv.tiers entries); a kv.tiers entry's own eviction_policy
// overrides it, a disk tier's too; the remote tier takes none.
TEST(KvConfigPolicyTest, EvictionPolicyIsTheDefaultOfHostAndDiskTiers) {
  KvCacheConfig c;
  c.host_bytes = 64 << 20;
  c.disk_path = "/tmp/unused";
  c.disk_bytes = 128 << 20;
  ASSERT_TRUE(ApplyKvFlag("--kv-eviction-policy", "s3fifo", &c).ok());
  auto specs = LowerTierSpecs(c);
  ASSERT_TRUE(specs.ok()) << specs.error().ToString();
  ASSERT_EQ(specs->size(), 2u);
  EXPECT_EQ((*specs)[0].eviction_policy, "s3fifo");
  EXPECT_EQ((*specs)[1].kind, TierKind::kDisk);
  EXPECT_EQ((*specs)[1].eviction_policy, "s3fifo");

  auto cfg = Config::Parse(
      "kv:\n  eviction_policy: freq\n  tiers:\n    - {kind: host, bytes: 64M}\n"
      "    - {kind: disk, path: /tmp/unused-a, bytes: 1G, eviction_policy: s3fifo}\n"
      "    - {kind: disk, name: d2, path: /tmp/unused-b, bytes: 2G}\n",
      "test.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.error().ToString();
  auto listed = KvCacheConfigFromYaml(*cfg, {});
  ASSERT_TRUE(listed.ok()) << listed.error().ToString();
  specs = LowerTierSpecs(*listed);
  ASSERT_TRUE(specs.ok()) << specs.error().ToString();
  ASSERT_EQ(specs->size(), 3u);
  EXPECT_EQ((*specs)[0].eviction_policy, "freq");
  EXPECT_EQ((*specs)[1].eviction_policy, "s3fifo");
  EXPECT_EQ((*specs)[2].eviction_policy, "freq");

  cfg = Config::Parse("kv:\n  tiers:\n    - {kind: disk, path: /tmp/unused-a, bytes: 1G, eviction_policy: mru}\n",
                      "test.yaml");
  ASSERT_TRUE(cfg.ok());
  listed = KvCacheConfigFromYaml(*cfg, {});
  ASSERT_FALSE(listed.ok());
  EXPECT_NE(listed.error().message().find("mru"), std::string::npos) << listed.error().ToString();
}

// A host tier whose write policy is not given: exclusive alone (the
// hierarchy then serves as one cache of its total size), write-through in
// a cluster (peers read the host tier); given, it is kept either way. The
// disk tier stays write-through.
TEST(KvConfigPolicyTest, HostTierDefaultsToExclusiveAloneAndWriteThroughInACluster) {
  for (bool cluster : {false, true}) {
    KvCacheConfig c;
    c.host_bytes = 64 << 20;
    c.disk_path = "/tmp/unused";
    c.disk_bytes = 128 << 20;
    c.cluster = cluster;
    auto specs = LowerTierSpecs(c);
    ASSERT_TRUE(specs.ok()) << specs.error().ToString();
    ASSERT_EQ(specs->size(), 2u);
    EXPECT_EQ((*specs)[0].write_policy,
              cluster ? WritePolicy::kWriteThrough : WritePolicy::kExclusive);
    EXPECT_EQ((*specs)[1].write_policy, WritePolicy::kWriteThrough);
    ASSERT_TRUE(ApplyKvFlag("--kv-host-write-policy", "write-back", &c).ok());
    specs = LowerTierSpecs(c);
    ASSERT_TRUE(specs.ok());
    EXPECT_EQ((*specs)[0].write_policy, WritePolicy::kWriteBack);

    // The same rule for a kv.tiers entry without write_policy.
    auto cfg = Config::Parse(
        "kv:\n  tiers:\n    - {kind: host, bytes: 64M}\n    - {kind: host, name: h2, bytes: 256M, "
        "write_policy: write-through}\n",
        "test.yaml");
    ASSERT_TRUE(cfg.ok());
    auto listed = KvCacheConfigFromYaml(*cfg, {});
    ASSERT_TRUE(listed.ok()) << listed.error().ToString();
    listed->cluster = cluster;
    specs = LowerTierSpecs(*listed);
    ASSERT_TRUE(specs.ok()) << specs.error().ToString();
    ASSERT_EQ(specs->size(), 2u);
    EXPECT_EQ((*specs)[0].write_policy,
              cluster ? WritePolicy::kWriteThrough : WritePolicy::kExclusive);
    EXPECT_EQ((*specs)[1].write_policy, WritePolicy::kWriteThrough);
  }
}

TEST(KvConfigPolicyTest, UnknownWritePolicyIsRejectedNamingKeyAndValue) {
  auto cfg = Config::Parse("kv:\n  disk_write_policy: lazy\n", "test.yaml");
  ASSERT_TRUE(cfg.ok());
  auto c = KvCacheConfigFromYaml(*cfg, {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message().find("kv.disk_write_policy"), std::string::npos)
      << c.error().message();
  EXPECT_NE(c.error().message().find("must be write-through, write-back or exclusive, not 'lazy'"),
            std::string::npos)
      << c.error().message();
  auto neg = Config::Parse("kv:\n  prefetch_max_requests: -1\n", "test.yaml");
  ASSERT_TRUE(neg.ok());
  auto n = KvCacheConfigFromYaml(*neg, {});
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.error().message().find("kv.prefetch_max_requests"), std::string::npos)
      << n.error().message();
}

TEST(KvConfigPolicyTest, FlagsSetPoliciesAndRejectBadValues) {
  KvCacheConfig c;
  ASSERT_TRUE(ApplyKvFlag("--kv-host-write-policy", "write-back", &c).ok());
  ASSERT_TRUE(ApplyKvFlag("--kv-disk-write-policy", "write-back", &c).ok());
  ASSERT_TRUE(ApplyKvFlag("--kv-prefetch-max-requests", "7", &c).ok());
  EXPECT_EQ(c.host_write_policy, WritePolicy::kWriteBack);
  EXPECT_EQ(c.disk_write_policy, WritePolicy::kWriteBack);
  EXPECT_EQ(c.prefetch_max_requests, 7);
  for (auto [flag, value] :
       std::vector<std::pair<const char*, const char*>>{{"--kv-host-write-policy", "writeback"},
                                                        {"--kv-disk-write-policy", ""},
                                                        {"--kv-prefetch-max-requests", "x"},
                                                        {"--kv-prefetch-max-requests", "5000"}}) {
    Status s = ApplyKvFlag(flag, value, &c);
    ASSERT_FALSE(s.ok()) << flag << " " << value;
    EXPECT_NE(s.message().find(flag), std::string::npos) << s.message();
  }
  EXPECT_EQ(ParseWritePolicy(WritePolicyName(WritePolicy::kWriteBack)).value(),
            WritePolicy::kWriteBack);
  EXPECT_EQ(ParseWritePolicy(WritePolicyName(WritePolicy::kWriteThrough)).value(),
            WritePolicy::kWriteThrough);
}

TEST(KvConfigPolicyTest, LowerTierOfEqualSizeWarnsToo) {
  KvCacheConfig c;
  c.device_bytes = 64 << 20;
  c.host_bytes = 64 << 20;  // equal: holds nothing the device does not
  c.disk_path = "/x";
  c.disk_bytes = 64 << 20;  // equal to host
  std::vector<std::string> warnings;
  ASSERT_TRUE(ValidateKvCacheConfig(c, 0, &warnings).ok());
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find(
                "kv.host_bytes (--kv-host-bytes) 67108864 is the same size as the device tier's"),
            std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[1].find(
                "kv.disk_bytes (--kv-disk-bytes) 67108864 is the same size as the host tier's"),
            std::string::npos)
      << warnings[1];
  EXPECT_NE(warnings[1].find("will churn"), std::string::npos);

  c.host_bytes = 32 << 20;
  warnings.clear();
  ASSERT_TRUE(ValidateKvCacheConfig(c, 0, &warnings).ok());
  ASSERT_EQ(warnings.size(), 1u);  // disk (64M) is larger than host (32M)
  EXPECT_NE(warnings[0].find("is smaller than the device tier's"), std::string::npos)
      << warnings[0];

  c.host_bytes = (64 << 20) + 1;
  c.disk_bytes = 1 << 30;
  warnings.clear();
  ASSERT_TRUE(ValidateKvCacheConfig(c, 0, &warnings).ok());
  EXPECT_TRUE(warnings.empty());
}

}  // namespace
}  // namespace strata::kvcache

namespace strata::kvcache {
namespace {

TEST(KvConfigPolicyTest, LookupTimeoutFromYamlAndFlagWithRangeErrors) {
  EXPECT_EQ(KvCacheConfig{}.lookup_timeout_ms, 50);
  auto cfg = Config::Parse("kv:\n  lookup_timeout_ms: 250\n", "test.yaml");
  ASSERT_TRUE(cfg.ok());
  ASSERT_TRUE(cfg->CheckKnownKeys(KvConfigKeys()).ok());
  auto c = KvCacheConfigFromYaml(*cfg, {});
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_EQ(c->lookup_timeout_ms, 250);
  KvCacheConfig f = *c;
  ASSERT_TRUE(ApplyKvFlag("--kv-lookup-timeout-ms", "7", &f).ok());
  EXPECT_EQ(f.lookup_timeout_ms, 7);
  for (const char* bad : {"0", "60001", "-5", "fast"}) {
    Status s = ApplyKvFlag("--kv-lookup-timeout-ms", bad, &f);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("--kv-lookup-timeout-ms"), std::string::npos) << s.message();
  }
  auto zero = Config::Parse("kv:\n  lookup_timeout_ms: 0\n", "test.yaml");
  ASSERT_TRUE(zero.ok());
  auto z = KvCacheConfigFromYaml(*zero, {});
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.error().message().find("kv.lookup_timeout_ms"), std::string::npos)
      << z.error().message();
}

TEST(KvConfigPolicyTest, StopWriteDownSecondsFromYamlAndFlagWithRangeErrors) {
  EXPECT_EQ(KvCacheConfig{}.stop_write_down_seconds, 30);
  auto cfg = Config::Parse("kv:\n  stop_write_down_seconds: 0\n", "test.yaml");
  ASSERT_TRUE(cfg.ok());
  ASSERT_TRUE(cfg->CheckKnownKeys(KvConfigKeys()).ok());
  auto c = KvCacheConfigFromYaml(*cfg, {});
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_EQ(c->stop_write_down_seconds, 0);
  KvCacheConfig f = *c;
  ASSERT_TRUE(ApplyKvFlag("--kv-stop-write-down-seconds", "120", &f).ok());
  EXPECT_EQ(f.stop_write_down_seconds, 120);
  for (const char* bad : {"3601", "-1", "soon"}) {
    Status s = ApplyKvFlag("--kv-stop-write-down-seconds", bad, &f);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("--kv-stop-write-down-seconds"), std::string::npos) << s.message();
  }
  auto big = Config::Parse("kv:\n  stop_write_down_seconds: 7200\n", "test.yaml");
  ASSERT_TRUE(big.ok());
  auto b = KvCacheConfigFromYaml(*big, {});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message().find("kv.stop_write_down_seconds"), std::string::npos) << b.error().message();
}

}  // namespace
}  // namespace strata::kvcache
