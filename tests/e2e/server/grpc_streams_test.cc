// gRPC streams cost no thread (`strata serve` on the tiny model, real
// sockets): 2,000 Generate streams open at once all complete, and the
// server's thread count (from /proc) grows by fewer than 32 over its idle
// count meanwhile. The synchronous gRPC server it replaced held a thread per
// open stream. And gRPC clients that stop reading are cancelled after the
// write timeout, their blocks released.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "proto/strata.grpc.pb.h"
#include "tests/e2e/server/serve_test_util.h"

namespace strata::testing {
namespace {

namespace pb = ::strata::v1;

int Threads(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  return -1;
}

pb::GenerateRequest Request(int i) {
  pb::GenerateRequest r;
  r.set_model("tiny");
  r.set_text("Once upon a time " + std::to_string(i));
  r.mutable_sampling()->set_max_tokens(4);
  r.mutable_sampling()->set_ignore_eos(true);
  return r;
}

struct Open {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<pb::GenerateResponse>> reader;
};

TEST(GrpcStreamsTest, TwoThousandOpenStreamsCompleteWithoutAThreadEach) {
  auto server = StartTinyServer({"--max-waiting", "4096", "--max-num-seqs", "64"});
  ASSERT_NE(server, nullptr);
  const std::string target = "127.0.0.1:" + std::to_string(server->port("grpc"));
  // A few connections, as a client pool would use.
  std::vector<std::unique_ptr<pb::Strata::Stub>> stubs;
  for (int c = 0; c < 8; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", c);  // distinct channels, not one shared subchannel
    stubs.push_back(pb::Strata::NewStub(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args)));
  }
  // Warm up: the server's gRPC pools start on first use.
  for (auto& stub : stubs) {
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, Request(-1));
    pb::GenerateResponse msg;
    while (reader->Read(&msg)) {
    }
    ASSERT_TRUE(reader->Finish().ok());
  }
  const int idle = Threads(server->pid());
  ASSERT_GT(idle, 0);

  constexpr int kStreams = 2000;
  std::vector<std::unique_ptr<Open>> open;
  int peak = idle;
  for (int i = 0; i < kStreams; ++i) {
    auto o = std::make_unique<Open>();
    o->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
    o->reader = stubs[static_cast<size_t>(i) % stubs.size()]->Generate(&o->ctx, Request(i));
    open.push_back(std::move(o));
    if (i % 100 == 0) peak = std::max(peak, Threads(server->pid()));
  }
  int completed = 0;
  for (size_t i = 0; i < open.size(); ++i) {
    pb::GenerateResponse msg;
    int tokens = 0;
    bool usage = false;
    while (open[i]->reader->Read(&msg)) {
      if (msg.has_delta()) tokens += msg.delta().token_ids_size();
      usage |= msg.has_usage();
    }
    const grpc::Status st = open[i]->reader->Finish();
    EXPECT_TRUE(st.ok()) << "stream " << i << ": " << st.error_message();
    if (st.ok() && tokens == 4 && usage) ++completed;
    if (i % 100 == 0) peak = std::max(peak, Threads(server->pid()));
  }
  EXPECT_EQ(completed, kStreams);
  EXPECT_LT(peak - idle, 32) << "idle " << idle << " threads, peak " << peak;
  const std::string m = Metrics(server->port("http"));
  EXPECT_EQ(Gauge(m, "strata_kv_device_blocks_in_use"), 0);
  StopCleanly(server.get());
}

TEST(GrpcStreamsTest, StreamsWhoseClientNeverReadsAreCancelledAfterTheWriteTimeout) {
  auto server = StartTinyServer({"--write-timeout-seconds", "2"});
  ASSERT_NE(server, nullptr);
  const std::string target = "127.0.0.1:" + std::to_string(server->port("grpc"));
  // A small receive window, so the server's writes stall once it is full.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 4096);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto stub = pb::Strata::NewStub(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
  pb::GenerateRequest req;
  req.set_model("tiny");
  req.set_text("Once upon a time");
  req.mutable_sampling()->set_max_tokens(480);
  req.mutable_sampling()->set_ignore_eos(true);
  req.mutable_sampling()->set_logprobs(true);
  req.mutable_sampling()->set_top_logprobs(20);
  std::vector<std::unique_ptr<Open>> open;
  for (int i = 0; i < 8; ++i) {
    auto o = std::make_unique<Open>();
    o->reader = stub->Generate(&o->ctx, req);  // and never Read
    open.push_back(std::move(o));
  }
  const std::string m = WaitForMetrics(
      server->port("http"),
      [](const std::string& t) {
        return Gauge(t, "strata_stream_write_timeouts_total") >= 8 && Gauge(t, "strata_kv_device_blocks_in_use") == 0 &&
               Gauge(t, "strata_num_requests_running") == 0;
      },
      60);
  EXPECT_EQ(Gauge(m, "strata_stream_write_timeouts_total"), 8) << m;
  EXPECT_EQ(Gauge(m, "strata_requests_total", "finish_reason=\"abort\""), 8);
  EXPECT_EQ(Gauge(m, "strata_kv_device_blocks_in_use"), 0);
  for (auto& o : open) {
    o->ctx.TryCancel();
    pb::GenerateResponse msg;
    while (o->reader->Read(&msg)) {
    }
    EXPECT_FALSE(o->reader->Finish().ok());
  }
  StopCleanly(server.get());
}

}  // namespace
}  // namespace strata::testing
