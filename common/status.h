#pragma once
// Status and Result<T>: Strata's error values. No exceptions cross module
// boundaries; every fallible call returns one of these.
//
// Result<T> follows std::expected's interface (has_value, value, error,
// operator*, operator->). It is our own type because clang 14 (used for the
// libFuzzer and sanitizer builds) cannot compile libstdc++ 12's <expected>.

#include <cassert>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace strata {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // caller passed something malformed or out of range
  kNotFound,          // a named thing (file, tensor, key) does not exist
  kCorrupt,           // a file or stored object violates its format
  kUnsupported,       // valid input that Strata does not implement (yet)
  kIoError,           // the OS refused a read/write/open/mmap
  kResourceExhausted, // out of blocks, memory, disk, queue slots
  kOutOfRange,        // an index or length past the end of something
  kInternal,          // a broken invariant inside Strata
  kUnavailable,       // a peer or device that is not there
  kCancelled,         // the caller (a client) gave up on the operation
  kDeadlineExceeded,  // the operation's deadline passed
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status Corrupt(std::string msg) { return {StatusCode::kCorrupt, std::move(msg)}; }
  static Status Unsupported(std::string msg) { return {StatusCode::kUnsupported, std::move(msg)}; }
  static Status ResourceExhausted(std::string msg) { return {StatusCode::kResourceExhausted, std::move(msg)}; }
  static Status OutOfRange(std::string msg) { return {StatusCode::kOutOfRange, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  static Status Cancelled(std::string msg) { return {StatusCode::kCancelled, std::move(msg)}; }
  static Status DeadlineExceeded(std::string msg) { return {StatusCode::kDeadlineExceeded, std::move(msg)}; }
  // An OS error: "<what> '<path>': <strerror(errno)>".
  static Status IoError(std::string_view what, std::string_view path, int err);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: message", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is "<prefix>: <message>" (keeps the code).
  Status WithContext(std::string_view prefix) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Holds a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  using value_type = T;
  Result(const T& v) : v_(std::in_place_index<0>, v) {}
  Result(T&& v) : v_(std::in_place_index<0>, std::move(v)) {}
  template <typename U, typename = std::enable_if_t<std::is_constructible_v<T, U&&> &&
                                                    !std::is_same_v<std::decay_t<U>, Status> &&
                                                    !std::is_same_v<std::decay_t<U>, Result>>>
  Result(U&& u) : v_(std::in_place_index<0>, T(std::forward<U>(u))) {}
  Result(Status s) : v_(std::in_place_index<1>, std::move(s)) {
    if (std::get<1>(v_).ok()) v_.template emplace<1>(Status::Internal("Result built from an OK Status"));
  }

  bool has_value() const { return v_.index() == 0; }
  bool ok() const { return has_value(); }
  explicit operator bool() const { return has_value(); }

  T& value() & { Check(); return std::get<0>(v_); }
  const T& value() const& { Check(); return std::get<0>(v_); }
  T&& value() && { Check(); return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  // The error; OK when a value is held.
  const Status& error() const {
    static const Status kOk;
    return has_value() ? kOk : std::get<1>(v_);
  }
  const Status& status() const { return error(); }

 private:
  void Check() const {
    if (!has_value()) {
      // Reaching here is a bug in the caller: it must test has_value() first.
      std::abort();
    }
  }
  std::variant<T, Status> v_;
};

}  // namespace strata

#define STRATA_CONCAT_INNER_(a, b) a##b
#define STRATA_CONCAT_(a, b) STRATA_CONCAT_INNER_(a, b)

#define STRATA_RETURN_IF_ERROR(expr)            \
  do {                                          \
    ::strata::Status strata_status_ = (expr);   \
    if (!strata_status_.ok()) return strata_status_; \
  } while (0)

#define STRATA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.has_value()) return tmp.error();           \
  lhs = std::move(tmp).value()

// STRATA_ASSIGN_OR_RETURN(auto x, MakeX()); returns the Status on failure.
#define STRATA_ASSIGN_OR_RETURN(lhs, expr) \
  STRATA_ASSIGN_OR_RETURN_IMPL_(STRATA_CONCAT_(strata_result_, __LINE__), lhs, expr)
