// KvCacheConfig from YAML keys and --kv-* flags: values, binary sizes, errors
// that name the key or flag, and the "lower tier smaller" warning.

#include "kvcache/kv_config.h"

#include <gtest/gtest.h>

namespace strata::kvcache {
namespace {

TEST(KvConfigTest, YamlKeysFillTheConfig) {
  auto cfg = Config::Parse(R"(
kv:
  block_size: 32
  dtype: bf16
  device_bytes: 64M
  host_bytes: 1G
  disk_path: /tmp/kv
  disk_bytes: 4G
  disk_admit_after: 2
  load_policy: never
  host_pin: false
)",
                           "test.yaml");
  ASSERT_TRUE(cfg.ok());
  ASSERT_TRUE(cfg->CheckKnownKeys(KvConfigKeys()).ok());
  auto c = KvCacheConfigFromYaml(*cfg, {});
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_EQ(c->block_size, 32);
  EXPECT_EQ(c->dtype, "bf16");
  EXPECT_EQ(c->device_bytes, 64ull << 20);
  EXPECT_EQ(c->host_bytes, 1ull << 30);
  EXPECT_EQ(c->disk_path, "/tmp/kv");
  EXPECT_EQ(c->disk_bytes, 4ull << 30);
  EXPECT_EQ(c->disk_admit_after, 2u);
  EXPECT_EQ(c->load_policy, LoadPolicy::kNever);
  EXPECT_FALSE(c->host_pin);
  EXPECT_TRUE(KvCacheConfig{}.host_pin);  // pinned unless turned off
  EXPECT_TRUE(c->tiers_configured);
  EXPECT_TRUE(c->host_enabled());
  EXPECT_TRUE(c->disk_enabled());
}

TEST(KvConfigTest, DocumentedDefaultsDoNotTurnTheCacheOn) {
  auto cfg = Config::Parse(
      "kv:\n  host_bytes: 0\n  disk_path: \"\"\n  disk_bytes: 0\n  load_policy: auto\n");
  ASSERT_TRUE(cfg.ok());
  auto c = KvCacheConfigFromYaml(*cfg, {});
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->tiers_configured);
}

TEST(KvConfigTest, YamlErrorsNameTheKey) {
  for (const char* text :
       {"kv:\n  block_size: 0\n", "kv:\n  dtype: f8\n", "kv:\n  host_bytes: lots\n",
        "kv:\n  load_policy: sometimes\n", "kv:\n  disk_admit_after: -1\n", "kv:\n  host_pin: maybe\n"}) {
    auto cfg = Config::Parse(text, "bad.yaml");
    ASSERT_TRUE(cfg.ok()) << text;
    auto c = KvCacheConfigFromYaml(*cfg, {});
    ASSERT_FALSE(c.ok()) << text;
    const std::string key = cfg->LeafKeys().at(0);
    EXPECT_NE(c.error().message().find(key), std::string::npos) << c.error().message();
  }
}

TEST(KvConfigTest, FlagsParseSizesAndNameThemselvesInErrors) {
  KvCacheConfig c;
  ASSERT_TRUE(ApplyKvFlag("--kv-host-bytes", "512K", &c).ok());
  EXPECT_EQ(c.host_bytes, 512u << 10);
  ASSERT_TRUE(ApplyKvFlag("--kv-disk-bytes", "64M", &c).ok());
  ASSERT_TRUE(ApplyKvFlag("--kv-disk-path", "/x", &c).ok());
  ASSERT_TRUE(ApplyKvFlag("--kv-disk-admit-after", "3", &c).ok());
  ASSERT_TRUE(ApplyKvFlag("--kv-load-policy", "always", &c).ok());
  ASSERT_TRUE(ApplyKvFlag("--kv-block-size", "8", &c).ok());
  ASSERT_TRUE(ApplyKvFlag("--kv-dtype", "f32", &c).ok());
  EXPECT_EQ(c.disk_bytes, 64u << 20);
  EXPECT_EQ(c.disk_admit_after, 3u);
  EXPECT_EQ(c.load_policy, LoadPolicy::kAlways);
  EXPECT_EQ(c.block_size, 8);
  EXPECT_EQ(c.dtype, "f32");
  EXPECT_TRUE(c.tiers_configured);

  KvCacheConfig zero;
  ASSERT_TRUE(ApplyKvFlag("--kv-host-bytes", "0", &zero).ok());
  EXPECT_TRUE(zero.tiers_configured);  // an explicit flag asks for the cache path
  EXPECT_FALSE(zero.host_enabled());

  KvCacheConfig pin;
  ASSERT_TRUE(ApplyKvFlag("--kv-host-pin", "false", &pin).ok());
  EXPECT_FALSE(pin.host_pin);
  ASSERT_TRUE(ApplyKvFlag("--kv-host-pin", "true", &pin).ok());
  EXPECT_TRUE(pin.host_pin);

  for (auto [flag, value] :
       std::vector<std::pair<const char*, const char*>>{{"--kv-device-bytes", "12Q"},
                                                        {"--kv-disk-admit-after", "x"},
                                                        {"--kv-load-policy", "maybe"},
                                                        {"--kv-block-size", "0"},
                                                        {"--kv-dtype", "int4"},
                                                        {"--kv-host-pin", "yes"}}) {
    Status s = ApplyKvFlag(flag, value, &c);
    ASSERT_FALSE(s.ok()) << flag;
    EXPECT_NE(s.message().find(flag), std::string::npos) << s.message();
  }
}

TEST(KvConfigTest, ValidationChecksPairsAndWarnsAboutSmallLowerTiers) {
  KvCacheConfig c;
  c.disk_path = "/x";
  Status s = ValidateKvCacheConfig(c, 0, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("kv.disk_bytes"), std::string::npos);
  c.disk_path.clear();
  c.disk_bytes = 1 << 20;
  EXPECT_FALSE(ValidateKvCacheConfig(c, 0, nullptr).ok());

  KvCacheConfig w;
  w.device_bytes = 64 << 20;
  w.host_bytes = 16 << 20;
  w.disk_path = "/x";
  w.disk_bytes = 8 << 20;
  std::vector<std::string> warnings;
  ASSERT_TRUE(ValidateKvCacheConfig(w, 0, &warnings).ok());
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("kv.host_bytes"), std::string::npos);
  EXPECT_NE(warnings[1].find("kv.disk_bytes"), std::string::npos);

  KvCacheConfig ok;
  ok.host_bytes = 1 << 30;
  warnings.clear();
  ASSERT_TRUE(ValidateKvCacheConfig(ok, 64 << 20, &warnings).ok());  // device size from the context
  EXPECT_TRUE(warnings.empty());
}

TEST(KvConfigTest, LoadPolicyNamesRoundTrip) {
  for (LoadPolicy p : {LoadPolicy::kAuto, LoadPolicy::kAlways, LoadPolicy::kNever})
    EXPECT_EQ(*ParseLoadPolicy(LoadPolicyName(p)), p);
}

}  // namespace
}  // namespace strata::kvcache
