// The remote tier with real processes (issue 18): `strata serve` instances
// on 127.0.0.1 registered in `strata meta` or a real etcd; one computes a
// prompt, the others load its blocks from that instance's host tier through
// the transfer engine (tcp forced on one, shm on the other) and answer
// exactly as it did. Faults (a corrupted or stalled transfer, a holder
// killed mid-read, a holder restarted under the same name, the metadata
// store stopped) each end in an exact answer by recomputation, counted,
// with every device pool back to empty.
#include <gtest/gtest.h>
#include <signal.h>

#include <future>
#include <thread>

#include "tests/e2e/server/serve_test_util.h"
#include "tests/support/metadata_store.h"
#include "tests/support/run_command.h"

namespace strata::testing {
namespace {

using namespace std::chrono_literals;

// A prompt of `n` token ids (the tiny model's vocabulary), different per seed.
json Prompt(int seed, int n = 300) {
  json p = json::array();
  for (int i = 0; i < n; ++i) p.push_back(5 + (i * 37 + seed * 101) % 200);
  return p;
}

struct Answer {
  std::string text;
  int cached = -1;
  int remote = -1;
};

Answer Complete(int port, const json& prompt, double temperature = 0, int seed = 0) {
  json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 8}, {"temperature", temperature}};
  if (seed != 0) body["seed"] = seed;
  auto r = PostJson(port, "/v1/completions", body);
  EXPECT_EQ(r.status, 200) << r.raw;
  Answer a;
  if (r.status != 200 || !r.body.is_object()) return a;
  a.text = r.body["choices"][0]["text"].get<std::string>();
  const json& d = r.body["usage"]["prompt_tokens_details"];
  a.cached = d["cached_tokens"].get<int>();
  a.remote = d["cached_tokens_by_tier"]["remote"].get<int>();
  return a;
}

double Metric(int port, const std::string& name) {
  return Gauge(WaitForMetrics(port, [](const std::string&) { return true; }), name);
}

// Waits until `port`'s cluster index knows `peer` to hold at least `blocks` blocks.
bool WaitIndexed(int port, const std::string& peer, double blocks) {
  const std::string labels = "instance=\"" + peer + "\"";
  auto text = WaitForMetrics(
      port, [&](const std::string& t) { return Gauge(t, "strata_cluster_index_blocks", labels) >= blocks; });
  return Gauge(text, "strata_cluster_index_blocks", labels) >= blocks;
}

bool WaitIndexedExactly(int port, const std::string& peer, double blocks) {
  const std::string labels = "instance=\"" + peer + "\"";
  auto text = WaitForMetrics(
      port, [&](const std::string& t) { return Gauge(t, "strata_cluster_index_blocks", labels) == blocks; });
  return Gauge(text, "strata_cluster_index_blocks", labels) == blocks;
}

double Labelled(int port, const std::string& name, const std::string& labels) {
  return Gauge(WaitForMetrics(port, [](const std::string&) { return true; }), name, labels);
}

// The reader releases its pin lease after its reads, asynchronously (the
// answer does not wait for the release): wait for it, well within the
// lease (30 s), and check no lease had to expire instead.
void ExpectLeasesReleased(int port) {
  const std::string m = WaitForMetrics(
      port, [](const std::string& t) { return Gauge(t, "strata_kv_holder_leases_active") == 0; }, 10);
  EXPECT_EQ(Gauge(m, "strata_kv_holder_leases_active"), 0) << "every pin lease was released";
  EXPECT_EQ(Gauge(m, "strata_kv_holder_leases_expired_total"), 0) << "released by the reader, not expired";
}

void ExpectPoolEmpty(int port) {
  std::string m = WaitForMetrics(port, [](const std::string& t) { return Gauge(t, "strata_kv_device_blocks_in_use") == 0; });
  EXPECT_EQ(Gauge(m, "strata_kv_device_blocks_in_use"), 0) << "port " << port << ": the device pool is back to empty";
}

std::vector<std::string> Member(const MetadataStoreProcess& store, const std::string& name,
                                std::vector<std::string> extra) {
  std::vector<std::string> args = {"--metadata", store.url(), "--instance-name", name, "--metadata-lease-seconds", "2",
                                   "--kv-host-bytes", "16M"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// Readers load with --kv-load-policy always: the tiny model recomputes 288
// tokens faster than a resolve round trip, so `auto` may rightly recompute.
// 300 tokens: 18 whole blocks of 16 come from cache (the last token is computed).
constexpr int kCachedTokens = 288;

class RemoteTierTest : public ::testing::TestWithParam<bool> {};

TEST_P(RemoteTierTest, PeersLoadABlocksOverTcpAndShmAndAnswerAlike) {
  MetadataStoreProcess store(GetParam());
  auto a = StartTinyServer(Member(store, "inst-a", {}));
  auto b = StartTinyServer(Member(store, "inst-b", {"--kv-remote", "--kv-load-policy", "always", "--transfer-transports", "tcp"}));
  auto c = StartTinyServer(Member(store, "inst-c", {"--kv-remote", "--kv-load-policy", "always"}));
  ASSERT_TRUE(a && b && c);
  const int pa = a->port("http"), pb = b->port("http"), pc = c->port("http");

  // Greedy: A computes, B (tcp) and C (shm) load every whole block from A.
  const Answer ref = Complete(pa, Prompt(1));
  EXPECT_EQ(ref.cached, 0);
  ASSERT_TRUE(WaitIndexed(pb, "inst-a", 18) && WaitIndexed(pc, "inst-a", 18));
  const Answer ab = Complete(pb, Prompt(1));
  EXPECT_EQ(ab.remote, kCachedTokens);
  EXPECT_EQ(ab.text, ref.text);
  const Answer ac = Complete(pc, Prompt(1));
  EXPECT_EQ(ac.remote, kCachedTokens);
  EXPECT_EQ(ac.text, ref.text);
  EXPECT_GT(Labelled(pb, "strata_transfer_bytes_total", R"(transport="tcp",direction="read")"), 0);
  EXPECT_EQ(Labelled(pb, "strata_transfer_bytes_total", R"(transport="shm",direction="read")"), 0);
  EXPECT_GT(Labelled(pc, "strata_transfer_bytes_total", R"(transport="shm",direction="read")"), 0);

  // strata cache lookup names the instances holding the prefix, by tier.
  {
    std::string tokens;
    for (const auto& t : Prompt(5)) tokens += (tokens.empty() ? "" : ",") + std::to_string(t.get<int>());
    Complete(pa, Prompt(5));
    ASSERT_TRUE(WaitIndexed(pb, "inst-a", 38));
    auto r = RunCommand(StrataCli() + " cache lookup --url http://127.0.0.1:" + std::to_string(pb) +
                        " --json --tokens " + tokens);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    json j = json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.out;
    ASSERT_TRUE(j["cluster"].is_array()) << r.out;
    ASSERT_EQ(j["cluster"].size(), 1u) << r.out;  // only A computed this prompt
    EXPECT_EQ(j["cluster"][0]["instance"], "inst-a");
    EXPECT_EQ(j["cluster"][0]["blocks"], 18);
    EXPECT_EQ(j["cluster"][0]["blocks_by_tier"]["host"], 18);
    auto text = RunCommand(StrataCli() + " cache lookup --url http://127.0.0.1:" + std::to_string(pb) +
                           " --tokens " + tokens);
    EXPECT_NE(text.out.find("inst-a"), std::string::npos) << text.out;
  }

  // Seeded sampling: the same text from loaded blocks.
  const Answer sref = Complete(pa, Prompt(2), 1.0, 7);
  ASSERT_TRUE(WaitIndexed(pb, "inst-a", 57));
  const Answer sb = Complete(pb, Prompt(2), 1.0, 7);
  EXPECT_EQ(sb.remote, kCachedTokens);
  EXPECT_EQ(sb.text, sref.text);

  if (GetParam()) {
    // etcd stopped: serving goes on with what the index knows.
    store.Stop();
    std::string m = WaitForMetrics(
        pc, [](const std::string& t) { return Gauge(t, "strata_cluster_membership_failures_total") > 0; });
    EXPECT_GT(Gauge(m, "strata_cluster_membership_failures_total"), 0) << "C noticed that etcd is gone";
    const Answer r3 = Complete(pa, Prompt(3));
    ASSERT_TRUE(WaitIndexed(pc, "inst-a", 76));
    const Answer c3 = Complete(pc, Prompt(3));
    EXPECT_EQ(c3.text, r3.text);
    EXPECT_EQ(c3.remote, kCachedTokens) << "the index keeps the known peers while etcd is down";
    // etcd back (empty): the instances register again, the pool keeps working.
    store.Start();
    EXPECT_EQ(store.WaitFor({"inst-a", "inst-b", "inst-c"}, 10s),
              (std::vector<std::string>{"inst-a", "inst-b", "inst-c"}));
    const Answer r4 = Complete(pa, Prompt(4));
    ASSERT_TRUE(WaitIndexed(pb, "inst-a", 95));
    const Answer b4 = Complete(pb, Prompt(4));
    EXPECT_EQ(b4.text, r4.text);
    EXPECT_EQ(b4.remote, kCachedTokens);
  }

  ExpectLeasesReleased(pa);
  EXPECT_GE(Metric(pa, "strata_kv_holder_releases_total"), 3);
  for (int p : {pa, pb, pc}) ExpectPoolEmpty(p);
}

INSTANTIATE_TEST_SUITE_P(Stores, RemoteTierTest, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "etcd" : "meta"); });

TEST(RemoteTierFaults, CorruptStalledAndDeadTransfersAreRecomputed) {
  MetadataStoreProcess store(false);
  auto a = StartTinyServer(Member(store, "holder", {}));
  // The first block read is corrupted in flight / held past the 2 s deadline.
  auto corrupt = StartTinyServer(Member(store, "r-corrupt", {"--kv-remote", "--kv-load-policy", "always", "--transfer-faults", "corrupt:0:1"}));
  auto stall = StartTinyServer(Member(store, "r-stall", {"--kv-remote", "--kv-load-policy", "always", "--transfer-faults", "delay:0:1:5"}));
  ASSERT_TRUE(a && corrupt && stall);
  const int pa = a->port("http");
  const Answer r1 = Complete(pa, Prompt(11));
  const Answer r2 = Complete(pa, Prompt(12));
  for (auto* p : {corrupt.get(), stall.get()}) {
    const int port = p->port("http");
    ASSERT_TRUE(WaitIndexed(port, "holder", 38));
    const Answer x = Complete(port, Prompt(11));
    EXPECT_EQ(x.text, r1.text) << "recomputed, exact";
    EXPECT_EQ(x.remote, 0) << "the chain breaks at the failed first block";
    const Answer y = Complete(port, Prompt(12));  // still serving, and the pool works again
    EXPECT_EQ(y.text, r2.text);
    EXPECT_EQ(y.remote, kCachedTokens);
  }
  EXPECT_EQ(Metric(corrupt->port("http"), "strata_kv_remote_checksum_mismatches_total"), 1);
  EXPECT_GE(Metric(stall->port("http"), "strata_kv_remote_transfer_failures_total"), 1);
  for (int p : {pa, corrupt->port("http"), stall->port("http")}) ExpectPoolEmpty(p);
}

TEST(RemoteTierFaults, AHolderKilledMidReadOrRestartedIsNeverTrusted) {
  MetadataStoreProcess store(false);
  auto holder = StartTinyServer(Member(store, "holder", {}));
  // The first prompt's 18 block reads are held 1.5 s (under the 2 s
  // deadline): time to kill the holder. Later reads are not held, so they
  // keep their whole deadline on a loaded machine.
  auto reader = StartTinyServer(Member(store, "reader", {"--kv-remote", "--kv-load-policy", "always", "--transfer-faults", "delay:0:18:1.5"}));
  ASSERT_TRUE(holder && reader);
  const int pr = reader->port("http");
  const Answer r1 = Complete(holder->port("http"), Prompt(21));
  const Answer r2 = Complete(holder->port("http"), Prompt(22));
  ASSERT_TRUE(WaitIndexed(pr, "holder", 38));

  auto pending = std::async(std::launch::async, [&] { return Complete(pr, Prompt(21)); });
  std::this_thread::sleep_for(700ms);  // the reads are in flight (held)
  holder->Signal(SIGKILL);
  (void)holder->Wait(10);
  const Answer x = pending.get();
  EXPECT_EQ(x.text, r1.text) << "recomputed, exact";
  EXPECT_EQ(x.remote, 0);
  EXPECT_GE(Metric(pr, "strata_kv_remote_transfer_failures_total") + Metric(pr, "strata_kv_remote_holder_failures_total"),
            1)
      << "the failed reads are counted";

  // The holder comes back under the same name, without those blocks: the
  // reader must not serve them (recomputes), and answers exactly.
  auto again = StartTinyServer(Member(store, "holder", {}));
  ASSERT_TRUE(again);
  EXPECT_EQ(store.WaitFor({"holder", "reader"}, 10s), (std::vector<std::string>{"holder", "reader"}));
  std::this_thread::sleep_for(1s);
  const Answer y = Complete(pr, Prompt(22));
  EXPECT_EQ(y.text, r2.text);
  EXPECT_EQ(y.remote, 0) << "the new incarnation lacks the old one's blocks";
  // And it reads from the new incarnation once that one holds something.
  const Answer r3 = Complete(again->port("http"), Prompt(23));
  // Exactly its 19 blocks: the old incarnation's 38 may still be listed
  // until the reader's poll (backing off from the failures while the
  // holder was down, up to 5 s) reaches the new one and takes its snapshot.
  ASSERT_TRUE(WaitIndexedExactly(pr, "holder", 19));
  const Answer z = Complete(pr, Prompt(23));
  EXPECT_EQ(z.text, r3.text);
  EXPECT_EQ(z.remote, kCachedTokens);
  for (int p : {pr, again->port("http")}) ExpectPoolEmpty(p);
}

TEST(RemoteTier, BlocksOnlyOnTheHoldersDiskAreStagedThenRead) {
  MetadataStoreProcess store(false);
  const std::string disk = MakeTempDir("remote-disk");
  // A host tier of 32 blocks: three 19-block prompts push the first out to disk.
  auto a = StartTinyServer({"--metadata", store.url(), "--instance-name", "holder", "--metadata-lease-seconds", "2",
                            "--kv-host-bytes", "128K", "--kv-disk-path", disk, "--kv-disk-bytes", "64M"});
  auto b = StartTinyServer(Member(store, "reader", {"--kv-remote", "--kv-load-policy", "always"}));
  ASSERT_TRUE(a && b);
  const int pa = a->port("http"), pb = b->port("http");
  const Answer r1 = Complete(pa, Prompt(31));
  Complete(pa, Prompt(32));
  Complete(pa, Prompt(33));
  ASSERT_TRUE(WaitIndexed(pb, "holder", 57));
  const Answer x = Complete(pb, Prompt(31));
  EXPECT_EQ(x.text, r1.text);
  EXPECT_EQ(x.remote, kCachedTokens);
  EXPECT_EQ(Metric(pa, "strata_kv_holder_blocks_staged_total"), 18) << "every block came from the holder's disk";
  ExpectLeasesReleased(pa);
  for (int p : {pa, pb}) ExpectPoolEmpty(p);
}

TEST(RemoteTier, PeerRoutesNeedTheAdminTokenThePeersShare) {
  MetadataStoreProcess store(false);
  auto a = StartTinyServer(Member(store, "holder", {"--admin-token", "s3cret"}));
  auto b = StartTinyServer(Member(store, "reader", {"--admin-token", "s3cret", "--kv-remote", "--kv-load-policy", "always"}));
  ASSERT_TRUE(a && b);
  const int pa = a->port("http");
  EXPECT_EQ(SimpleHttp(pa, "GET", "/internal/kv/snapshot").status, 401);
  EXPECT_EQ(SimpleHttp(pa, "GET", "/internal/kv/snapshot", "", {"Authorization: Bearer wrong"}).status, 401);
  EXPECT_EQ(SimpleHttp(pa, "GET", "/internal/kv/snapshot", "", {"Authorization: Bearer s3cret"}).status, 200);
  EXPECT_EQ(SimpleHttp(pa, "POST", "/internal/kv/resolve", "{}", {"Authorization: Bearer s3cret"}).status, 400);
  const Answer r = Complete(pa, Prompt(41));
  ASSERT_TRUE(WaitIndexed(b->port("http"), "holder", 19));
  const Answer x = Complete(b->port("http"), Prompt(41));
  EXPECT_EQ(x.text, r.text);
  EXPECT_EQ(x.remote, kCachedTokens);
  for (int p : {pa, b->port("http")}) ExpectPoolEmpty(p);
}

TEST(RemoteTier, ARemoteTierOutsideAClusterIsRefusedAtStart) {
  auto model = TinyModelPath();
  ASSERT_TRUE(model.has_value());
  auto s = ServerProcess::Start({"--model", *model, "--kv-remote"});
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().ToString().find("--metadata"), std::string::npos) << s.error().ToString();
}

}  // namespace
}  // namespace strata::testing
