#include "bench/load_driver.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <list>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "bench/grpc_client.h"
#include "common/http_client.h"

namespace strata::bench {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Sleeps until `t_s` seconds after t0 (returns at once when that has passed).
void SleepUntil(Clock::time_point t0, double t_s) {
  auto when = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(t_s));
  std::this_thread::sleep_until(when);
}

std::string ErrorMessage(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) return e["message"].get<std::string>();
    if (e.is_string()) return e.get<std::string>();
  }
  return body.substr(0, 300);
}

bool IsContextRefusal(int status, const std::string& message) {
  return status == 400 && (message.find("context") != std::string::npos);
}

void FillUsage(const json& u, RequestRecord* r) {
  if (!u.is_object()) return;
  r->prompt_tokens = u.value("prompt_tokens", int64_t{0});
  r->completion_tokens = u.value("completion_tokens", int64_t{0});
  auto d = u.find("prompt_tokens_details");
  if (d == u.end() || !d->is_object()) return;
  r->cached_tokens = d->value("cached_tokens", int64_t{0});
  auto t = d->find("cached_tokens_by_tier");
  if (t == d->end() || !t->is_object()) return;
  for (size_t i = 0; i < kTierNames.size(); ++i) r->cached_by_tier[i] = t->value(kTierNames[i], int64_t{0});
}

class Driver {
 public:
  Driver(const Workload& w, const LoadOptions& o, std::unique_ptr<GrpcClient> grpc)
      : w_(w), o_(o), grpc_(std::move(grpc)) {
    size_t n = 0;
    for (const auto& s : w_.sessions) {
      first_slot_.push_back(n);
      n += s.turns.size();
    }
    records_.resize(n);
    for (auto& r : records_) r.scheduled_s = -1;  // set by the open loop's dispatcher
    used_.assign(n, 0);
  }

  LoadResult Run();

 private:
  void RunSession(size_t s);
  // Sends one turn; fills *r; returns the assistant text (chat).
  std::string Send(const Turn& turn, const json* messages, RequestRecord* r);
  std::string SendGrpc(const Turn& turn, const json* messages, RequestRecord* r);
  void Monitor();
  MetricsSample Scrape();
  void DrawProgress(bool final);

  const Workload& w_;
  const LoadOptions& o_;
  const std::unique_ptr<GrpcClient> grpc_;  // set: the gRPC transport
  Clock::time_point t0_;
  std::vector<size_t> first_slot_;
  std::vector<RequestRecord> records_;  // slot i written by one session thread
  std::vector<char> used_;
  std::atomic<int64_t> done_{0};
  std::atomic<int64_t> not_sent_{0};
  std::atomic<bool> metrics_ok_{false};

  std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;  // guarded by mu_
  std::vector<MetricsSample> scrapes_;  // monitor thread only until joined
  // Unique per run (the server's cache outlives runs) and per request.
  const std::string salt_prefix_ =
      "strata-bench-" + std::to_string(std::chrono::system_clock::now().time_since_epoch().count()) + "-";
};

std::string Driver::SendGrpc(const Turn& turn, const json* messages, RequestRecord* r) {
  GrpcSend q;
  q.model = o_.model;
  q.max_tokens = turn.max_tokens;
  if (messages != nullptr) {
    q.chat = true;
    for (const json& m : *messages) q.messages.emplace_back(m.value("role", ""), m.value("content", ""));
  } else {
    q.prompt = turn.prompt;
  }
  if (o_.unique_cache_salt) q.cache_salt = salt_prefix_ + std::to_string(r->index);
  return grpc_->Send(q, t0_, o_.request_timeout_s, r);
}

std::string Driver::Send(const Turn& turn, const json* messages, RequestRecord* r) {
  if (grpc_) return SendGrpc(turn, messages, r);
  json body = {{"model", o_.model},
               {"max_tokens", turn.max_tokens},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"ignore_eos", true},
               {"temperature", 0}};
  std::string path;
  if (messages != nullptr) {
    body["messages"] = *messages;
    path = "/v1/chat/completions";
  } else {
    body["prompt"] = turn.prompt;
    path = "/v1/completions";
    r->sent_prompt_tokens = static_cast<int64_t>(turn.prompt.size());
  }
  r->max_tokens = turn.max_tokens;
  if (o_.unique_cache_salt) body["cache_salt"] = salt_prefix_ + std::to_string(r->index);

  strata::SseParser sse;
  std::string head;  // the first bytes, for error bodies
  std::string text;
  std::string stream_error;
  bool done = false;
  auto on_data = [&](std::string_view data) {
    if (head.size() < 4096) head.append(data.substr(0, 4096 - head.size()));
    sse.Feed(data);
    std::string ev;
    while (sse.Next(&ev)) {
      if (ev == "[DONE]") {
        done = true;
        continue;
      }
      json j = json::parse(ev, nullptr, false);
      if (!j.is_object()) continue;
      if (j.contains("error")) {
        stream_error = ErrorMessage(ev);
        continue;
      }
      auto ch = j.find("choices");
      if (ch != j.end() && ch->is_array() && !ch->empty()) {
        const json& c = (*ch)[0];
        std::string piece;
        if (auto t = c.find("text"); t != c.end() && t->is_string()) piece = t->get<std::string>();
        if (auto d = c.find("delta"); d != c.end() && d->is_object()) {
          if (auto t = d->find("content"); t != d->end() && t->is_string()) piece = t->get<std::string>();
        }
        if (!piece.empty()) {
          const double now = Since(t0_);
          if (r->first_token_s < 0) r->first_token_s = now;
          r->token_s.push_back(now);
          text += piece;
        }
      }
      if (auto u = j.find("usage"); u != j.end() && u->is_object()) FillUsage(*u, r);
    }
    return true;
  };
  r->start_s = Since(t0_);
  auto resp = strata::HttpStream(o_.host, o_.port, "POST", path, body.dump(),
                                 {{"Content-Type", "application/json"}}, on_data, o_.request_timeout_s);
  r->end_s = Since(t0_);
  if (!resp) {
    r->error = "transport";
    r->error_message = resp.error().ToString();
    return text;
  }
  r->http_status = resp->status;
  if (resp->status != 200) {
    r->error_message = ErrorMessage(head);
    r->error = IsContextRefusal(resp->status, r->error_message) ? "context" : "http_" + std::to_string(resp->status);
    return text;
  }
  if (!stream_error.empty()) {
    r->error = "stream";
    r->error_message = stream_error;
  } else if (!done) {
    r->error = "stream";
    r->error_message = "the stream ended without [DONE]";
  }
  return text;
}

void Driver::RunSession(size_t s) {
  const Session& session = w_.sessions[s];
  json messages = json::array();
  if (w_.chat) messages.push_back({{"role", "system"}, {"content", w_.system_prompt}});
  for (size_t t = 0; t < session.turns.size(); ++t) {
    const Turn& turn = session.turns[t];
    const size_t slot = first_slot_[s] + t;
    RequestRecord& r = records_[slot];
    if (t > 0 && turn.think_time_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(turn.think_time_s));
    r.index = static_cast<int64_t>(slot);
    r.session = session.id;
    r.turn = static_cast<int>(t);
    std::string reply;
    if (w_.chat) {
      messages.push_back({{"role", "user"}, {"content", turn.user_message}});
      reply = Send(turn, &messages, &r);
    } else {
      reply = Send(turn, nullptr, &r);
    }
    if (r.scheduled_s < 0 || t > 0) r.scheduled_s = r.start_s;
    used_[slot] = 1;
    done_.fetch_add(1);
    if (!r.ok()) {
      // A conversation cannot go on without the reply it builds on.
      const int64_t rest = static_cast<int64_t>(session.turns.size() - t - 1);
      not_sent_.fetch_add(rest);
      done_.fetch_add(rest);
      return;
    }
    if (w_.chat) messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
}

MetricsSample Driver::Scrape() {
  if (grpc_) {
    MetricsSample m;
    if (grpc_->Scrape(&m)) metrics_ok_ = true;
    m.t_s = Since(t0_);
    return m;
  }
  auto resp = strata::HttpCall(o_.host, o_.port, "GET", "/metrics", "", {}, 10);
  MetricsSample m;
  if (resp && resp->status == 200) {
    m = ParseMetricsSample(resp->body);
    metrics_ok_ = true;
  }
  m.t_s = Since(t0_);
  return m;
}

void Driver::DrawProgress(bool final) {
  const int64_t total = static_cast<int64_t>(records_.size());
  const int64_t done = std::min<int64_t>(done_.load(), total);
  const double t = Since(t0_);
  const double frac = total == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, ' ');
  char eta[32] = "--";
  if (done > 0 && done < total) {
    const double left = t / frac - t;
    std::snprintf(eta, sizeof eta, "%dm%02ds", static_cast<int>(left) / 60, static_cast<int>(left) % 60);
  } else if (done >= total) {
    std::snprintf(eta, sizeof eta, "0s");
  }
  std::fprintf(stderr, "\r[%s] %lld/%lld %3.0f%%  %.0fs elapsed  ETA %s   %s", bar.c_str(), static_cast<long long>(done),
               static_cast<long long>(total), frac * 100, t, eta, final ? "\n" : "");
  std::fflush(stderr);
}

void Driver::Monitor() {
  auto next_scrape = o_.scrape_interval_s;
  std::unique_lock lock(mu_);
  while (!finished_) {
    cv_.wait_for(lock, std::chrono::milliseconds(250));
    if (finished_) break;
    lock.unlock();
    if (o_.progress) DrawProgress(false);
    if (o_.scrape_interval_s > 0 && Since(t0_) >= next_scrape) {
      scrapes_.push_back(Scrape());
      next_scrape += o_.scrape_interval_s;
    }
    lock.lock();
  }
}

LoadResult Driver::Run() {
  t0_ = Clock::now();
  scrapes_.push_back(Scrape());
  std::thread monitor([this] { Monitor(); });

  const size_t n = w_.sessions.size();
  if (o_.concurrency > 0) {
    std::atomic<size_t> next{0};
    std::vector<std::thread> users;
    const size_t k = std::min(n, static_cast<size_t>(o_.concurrency));
    for (size_t u = 0; u < k; ++u) {
      users.emplace_back([&] {
        for (size_t s; (s = next.fetch_add(1)) < n;) RunSession(s);
      });
    }
    for (auto& t : users) t.join();
  } else {
    // Open loop: start times first, then one thread per session at its time.
    std::vector<double> start(n, 0);
    if (o_.rate > 0) {
      std::mt19937_64 rng(o_.seed ^ 0x9e3779b97f4a7c15ull);
      std::exponential_distribution<double> gap(o_.rate);
      double t = 0;
      for (size_t s = 0; s < n; ++s) {
        start[s] = t;
        t += gap(rng);
      }
    } else {
      const double base = n > 0 ? std::max(0.0, w_.sessions[0].turns[0].arrival_s) : 0;
      for (size_t s = 0; s < n; ++s) start[s] = (std::max(0.0, w_.sessions[s].turns[0].arrival_s) - base) * o_.time_scale;
    }
    struct Worker {
      std::thread thread;
      std::atomic<bool> done{false};
    };
    std::list<Worker> workers;
    auto reap = [&](bool all) {
      for (auto it = workers.begin(); it != workers.end();) {
        if (all || it->done.load()) {
          it->thread.join();
          it = workers.erase(it);
        } else {
          ++it;
        }
      }
    };
    for (size_t s = 0; s < n; ++s) {
      SleepUntil(t0_, start[s]);
      reap(false);
      Worker& wk = workers.emplace_back();
      const size_t slot = first_slot_[s];
      records_[slot].scheduled_s = start[s];
      wk.thread = std::thread([this, s, &wk] {
        RunSession(s);
        wk.done = true;
      });
    }
    reap(true);
  }

  {
    std::lock_guard lock(mu_);
    finished_ = true;
  }
  cv_.notify_all();
  monitor.join();
  if (o_.progress) DrawProgress(true);
  scrapes_.push_back(Scrape());

  LoadResult out;
  for (size_t i = 0; i < records_.size(); ++i) {
    if (!used_[i]) continue;
    RequestRecord& r = records_[i];
    if (r.error == "context") ++out.skipped_over_context;
    out.duration_s = std::max(out.duration_s, r.end_s);
    out.records.push_back(std::move(r));
  }
  out.skipped_over_context += w_.skipped_over_context;
  out.not_sent = not_sent_.load();
  out.scrapes = std::move(scrapes_);
  out.metrics_available = metrics_ok_.load();
  return out;
}

// "name{a="b",c="d"} 1.5" → name, labels text, value.
bool SplitSample(std::string_view line, std::string_view* name, std::string_view* labels, double* value) {
  if (line.empty() || line[0] == '#') return false;
  size_t name_end = line.find_first_of("{ ");
  if (name_end == std::string_view::npos) return false;
  *name = line.substr(0, name_end);
  size_t rest = name_end;
  *labels = {};
  if (line[name_end] == '{') {
    size_t close = line.find('}', name_end);
    if (close == std::string_view::npos) return false;
    *labels = line.substr(name_end + 1, close - name_end - 1);
    rest = close + 1;
  }
  std::string v(line.substr(rest));
  char* end = nullptr;
  *value = std::strtod(v.c_str(), &end);
  return end != v.c_str();
}

}  // namespace

MetricsSample ParseMetricsSample(const std::string& text) {
  MetricsSample m;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    std::string_view name, labels;
    double v = 0;
    if (!SplitSample(line, &name, &labels, &v)) continue;
    if (name == "strata_prefix_cache_queries_total") {
      m.queries += v;
    } else if (name == "strata_prefix_cache_hits_total") {
      for (size_t i = 0; i < kTierNames.size(); ++i) {
        if (labels.find("tier=\"" + std::string(kTierNames[i]) + "\"") != std::string_view::npos) m.hits[i] += v;
      }
    } else if (name == "strata_num_requests_running") {
      m.running += v;
    } else if (name == "strata_num_requests_waiting") {
      m.waiting += v;
    } else if (name == "strata_requests_rejected_total") {
      m.rejected += v;
    }
  }
  return m;
}

Result<ServedModel> QueryModel(const std::string& host, int port) {
  STRATA_ASSIGN_OR_RETURN(strata::HttpResponse resp, strata::HttpCall(host, port, "GET", "/v1/models", "", {}, 30));
  if (resp.status != 200)
    return Status::Unavailable("GET /v1/models answered " + std::to_string(resp.status) + ": " + resp.body.substr(0, 200));
  json j = json::parse(resp.body, nullptr, false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].is_object() || !j["data"][0].contains("id"))
    return Status::Corrupt("GET /v1/models: no model in " + resp.body.substr(0, 200));
  const json& card = j["data"][0];
  ServedModel m;
  m.id = card["id"].is_string() ? card["id"].get<std::string>() : "";
  if (card.contains("max_model_len") && card["max_model_len"].is_number_integer())
    m.max_model_len = card["max_model_len"].get<int>();
  return m;
}

int ProbeVocabSize(const std::string& host, int port, const std::string& model) {
  json body = {{"model", model}, {"prompt", json::array({1 << 30})}, {"max_tokens", 1}};
  auto resp = strata::HttpCall(host, port, "POST", "/v1/completions", body.dump(),
                               {{"Content-Type", "application/json"}}, 30);
  if (!resp || resp->status != 400) return 0;
  const std::string msg = ErrorMessage(resp->body);
  const std::string key = "vocabulary [0, ";
  size_t at = msg.find(key);
  if (at == std::string::npos) return 0;
  return std::atoi(msg.c_str() + at + key.size());
}

Result<ServerUrl> ParseServerUrl(std::string_view url) {
  ServerUrl u;
  if (IsGrpcUrl(url)) {
    STRATA_ASSIGN_OR_RETURN(auto hp, ParseGrpcUrl(url));
    u.host = std::move(hp.first);
    u.port = hp.second;
    u.grpc = true;
    return u;
  }
  STRATA_ASSIGN_OR_RETURN(strata::HttpUrl h, strata::ParseHttpUrl(url));
  u.host = h.host;
  u.port = h.port;
  return u;
}

Result<ServedModel> QueryModel(const ServerUrl& url) {
  if (!url.grpc) return QueryModel(url.host, url.port);
  STRATA_ASSIGN_OR_RETURN(auto client, GrpcClient::Connect(url.host, url.port));
  return client->QueryModel();
}

int ProbeVocabSize(const ServerUrl& url, const std::string& model) {
  if (!url.grpc) return ProbeVocabSize(url.host, url.port, model);
  auto client = GrpcClient::Connect(url.host, url.port);
  return client.ok() ? (*client)->ProbeVocabSize(model) : 0;
}

Result<LoadResult> RunLoad(const Workload& workload, const LoadOptions& options) {
  if (options.rate > 0 && options.concurrency > 0)
    return Status::InvalidArgument("give --rate or --concurrency, not both");
  if (options.rate < 0 || options.concurrency < 0 || options.time_scale < 0)
    return Status::InvalidArgument("--rate, --concurrency and --time-scale must not be negative");
  if (options.rate == 0 && options.concurrency == 0) {
    for (const auto& s : workload.sessions) {
      if (s.turns.empty() || s.turns[0].arrival_s < 0)
        return Status::InvalidArgument("this workload has no timestamps: give --rate R or --concurrency N");
    }
  }
  std::unique_ptr<GrpcClient> grpc;
  if (options.grpc) {
    STRATA_ASSIGN_OR_RETURN(grpc, GrpcClient::Connect(options.host, options.port));
  }
  Driver d(workload, options, std::move(grpc));
  return d.Run();
}

}  // namespace strata::bench
