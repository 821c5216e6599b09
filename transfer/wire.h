#pragma once
// The transfer engine's wire format and socket helpers.
//
// Every message on a transfer connection is one frame: a fixed 48-byte
// little-endian header, then `payload_bytes` of payload. Control frames
// (handshake, open, revoke) carry a small JSON payload; data frames carry
// the block bytes themselves, straight from and into registered memory.
//
//   u32 magic 'STRX' | u8 type | u8 status | u16 reserved | u32 payload_bytes
//   u32 reserved | u64 request_id | u64 handle | u64 offset | u64 length
//
// `status` is a StatusCode on replies; `handle` names an exported segment or
// grant on the target; `offset`/`length` locate the bytes inside it.
//
// Authentication (HMAC-SHA256 over a nonce challenge, both directions):
//   target → peer   kHelloTarget {name, nonce, host, boot_id, pid}
//   peer   → target kHelloPeer   {name, nonce, host, boot_id, pid, mac}
//                    mac = HMAC(secret, "strata-transfer-1 peer" | target nonce | peer nonce | peer name | target name)
//   target → peer   kAuthOk {mac = HMAC(secret, "strata-transfer-1 target" | peer nonce | target nonce | target name)}
//                   or kAuthFail, then the target closes the connection.
// Without a secret the key is empty: the exchange still runs, and the
// listener binds loopback only.
//
// Thread-safety: free functions; a socket is used by one thread per
// direction at a time.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "common/sha256.h"
#include "common/status.h"

namespace strata::transfer {

inline constexpr uint32_t kFrameMagic = 0x58525453;  // "STRX" little-endian
inline constexpr size_t kHeaderBytes = 48;
// Control payloads (JSON) are small; anything larger is a protocol error.
inline constexpr uint32_t kMaxControlPayload = 64 * 1024;
// One data frame moves at most this many bytes (callers split larger regions).
inline constexpr uint64_t kMaxDataPayload = 64ull << 20;

enum class FrameType : uint8_t {
  kHelloTarget = 1,
  kHelloPeer = 2,
  kAuthOk = 3,
  kAuthFail = 4,
  kOpenSegment = 5,  // payload {"name"}: open a readable segment by name
  kOpenGrant = 6,    // handle = grant id
  kOpenReply = 7,    // status; payload {"handle","length","writable","base","expires_ns",...}
  kRead = 8,         // handle, offset, length
  kReadReply = 9,    // status; payload = the bytes when OK, else the error text
  kWrite = 10,       // handle, offset, length; payload = the bytes
  kWriteReply = 11,  // status; payload = error text when not OK
  kRevoke = 12,      // target → peer on the control connection: handle revoked
  kRevokeAck = 13,   // peer → target: no access to handle is in flight, none will start
};
std::string_view FrameTypeName(FrameType t);

struct FrameHeader {
  FrameType type = FrameType::kRead;
  StatusCode status = StatusCode::kOk;
  uint32_t payload_bytes = 0;
  uint64_t request_id = 0;
  uint64_t handle = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

void EncodeHeader(const FrameHeader& h, uint8_t out[kHeaderBytes]);
// Corrupt: wrong magic, unknown type or status, or a payload size its type
// does not allow (data frames: payload == length <= kMaxDataPayload; control
// frames: <= kMaxControlPayload).
Result<FrameHeader> DecodeHeader(std::span<const uint8_t> bytes);

// HMAC-SHA256 (OpenSSL).
Sha256Digest HmacSha256(std::string_view key, std::string_view data);
// Constant-time equality of two digests.
bool DigestEqual(const Sha256Digest& a, const Sha256Digest& b);
// `n` cryptographically random bytes (OpenSSL RAND_bytes), hex-encoded.
std::string RandomHex(size_t n);

// Blocking socket I/O. Unavailable on EOF or error ("<what>: ...").
Status SendAll(int fd, const void* data, size_t len, std::string_view what);
Status RecvAll(int fd, void* data, size_t len, std::string_view what);
// Sends a header and its payload (payload_bytes must equal payload.size()).
Status SendFrame(int fd, FrameHeader h, std::string_view payload);
// Reads one header; then the caller reads payload_bytes itself.
Result<FrameHeader> RecvHeader(int fd);
// Reads and discards `len` bytes.
Status Discard(int fd, uint64_t len);

// Sockets. `host` is a dotted IPv4 address or "localhost".
Result<int> ListenTcp(const std::string& host, int port, int* bound_port);
Result<int> ConnectTcp(const std::string& host, int port, double timeout_s);
// Splits "host:port".
Result<std::pair<std::string, int>> SplitHostPort(std::string_view s);
// Large socket buffers and TCP_NODELAY on a data socket.
void TuneSocket(int fd);
// Receive/send timeouts for the handshake (0 = none).
void SetSocketTimeouts(int fd, double seconds);
bool IsLoopbackAddress(const std::string& host);

}  // namespace strata::transfer

namespace strata::transfer {
// XXH3-64 of a payload: what callers compare to catch corrupted transfers.
uint64_t PayloadChecksum(const void* data, size_t len);
}  // namespace strata::transfer
