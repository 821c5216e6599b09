#include "kvcache/disk_index.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <cstring>

namespace strata::kvcache {
namespace {

constexpr uint8_t kRecordVersion = 1;
constexpr size_t kRecordBytes = 80;
constexpr std::string_view kGeometryKey = "strata.disk.geometry";
constexpr size_t kGeometryBytes = 24;

void PutU32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

rocksdb::Slice KeyOf(const BlockHash& h) {
  return rocksdb::Slice(reinterpret_cast<const char*>(h.digest.data()), h.digest.size());
}

// RocksDB reports errors as its own Status; translate at the boundary.
Status Translate(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return Status::Ok();
  std::string msg = "disk index ";
  msg += what;
  msg += ": ";
  msg += s.ToString();
  if (s.IsNotFound()) return Status::NotFound(std::move(msg));
  if (s.IsCorruption()) return Status::Corrupt(std::move(msg));
  if (s.IsNoSpace()) return Status::ResourceExhausted(std::move(msg));
  return Status(StatusCode::kIoError, std::move(msg));
}

}  // namespace

uint64_t DiskBlockChecksum(const BlockHash& h, const Sha256Digest& ns,
                           std::span<const uint8_t> data) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, h.digest.data(), h.digest.size());
  XXH3_64bits_update(&state, ns.data(), ns.size());
  XXH3_64bits_update(&state, data.data(), data.size());
  return XXH3_64bits_digest(&state);
}

std::string EncodeDiskIndexRecord(const DiskIndexRecord& rec) {
  std::string s;
  s.reserve(kRecordBytes);
  s.push_back(static_cast<char>(kRecordVersion));
  s.append(3, '\0');
  PutU32(&s, rec.slot);
  PutU32(&s, rec.length);
  PutU32(&s, 0);
  PutU64(&s, rec.checksum);
  s.append(reinterpret_cast<const char*>(rec.ns.data()), rec.ns.size());
  PutU64(&s, rec.last_use);
  s.append(16, '\0');
  return s;
}

Result<DiskIndexRecord> DecodeDiskIndexRecord(std::string_view v) {
  if (v.size() != kRecordBytes) {
    return Status::Corrupt("disk index record of " + std::to_string(v.size()) + " bytes, want " +
                           std::to_string(kRecordBytes));
  }
  if (static_cast<uint8_t>(v[0]) != kRecordVersion) {
    return Status::Corrupt("disk index record version " +
                           std::to_string(static_cast<uint8_t>(v[0])));
  }
  const char* p = v.data();
  DiskIndexRecord rec;
  rec.slot = GetU32(p + 4);
  rec.length = GetU32(p + 8);
  rec.checksum = GetU64(p + 16);
  std::memcpy(rec.ns.data(), p + 24, rec.ns.size());
  rec.last_use = GetU64(p + 56);
  return rec;
}

struct DiskIndex::Rep {
  // After a failed write, RocksDB must not be written again: Debian's build
  // asserts on a write to a WAL that saw an error. Later writes fail with this.
  Status broken;
  Status Write(const rocksdb::Status& s, std::string_view what) {
    Status st = Translate(s, what);
    if (!st.ok()) broken = st.WithContext("disk index unwritable after");
    return st;
  }
  std::unique_ptr<rocksdb::DB> db;
  rocksdb::WriteOptions write_options;
  rocksdb::ReadOptions read_options;
};

DiskIndex::DiskIndex(std::unique_ptr<Rep> rep) : rep_(std::move(rep)) {}

DiskIndex::~DiskIndex() {
  if (rep_ && rep_->db) {
    rocksdb::Status s = rep_->db->Close();
    s.PermitUncheckedError();
  }
}

Result<std::unique_ptr<DiskIndex>> DiskIndex::Open(const std::string& path) {
  rocksdb::Options options;
  options.create_if_missing = true;
  // The index is small (~100 bytes a block); keep its footprint small too, so
  // that a nearly full disk leaves room for it. No fallocate: preallocated WAL
  // and manifest space would be taken from the slabs.
  options.allow_fallocate = false;
  options.write_buffer_size = 4 << 20;
  options.max_log_file_size = 1 << 20;
  options.keep_log_file_num = 2;
  options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  options.max_open_files = 64;
  options.recycle_log_file_num = 0;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s;
  try {
    s = rocksdb::DB::Open(options, path, &raw);
  } catch (const std::exception& e) {
    return Status(StatusCode::kIoError, std::string("disk index open threw: ") + e.what());
  }
  if (!s.ok()) return Translate(s, "open '" + path + "'");
  auto rep = std::make_unique<Rep>();
  rep->db.reset(raw);
  rep->write_options.sync = false;  // see header: WAL without fsync
  return std::unique_ptr<DiskIndex>(new DiskIndex(std::move(rep)));
}

Status DiskIndex::Put(const BlockHash& h, const DiskIndexRecord& rec) {
  if (!rep_->broken.ok()) return rep_->broken;
  return rep_->Write(rep_->db->Put(rep_->write_options, KeyOf(h), EncodeDiskIndexRecord(rec)),
                     "put");
}

Status DiskIndex::PutRaw(const BlockHash& h, const std::string& value) {
  if (!rep_->broken.ok()) return rep_->broken;
  return rep_->Write(rep_->db->Put(rep_->write_options, KeyOf(h), value), "put");
}

Status DiskIndex::Delete(const BlockHash& h) {
  if (!rep_->broken.ok()) return rep_->broken;
  return rep_->Write(rep_->db->Delete(rep_->write_options, KeyOf(h)), "delete");
}

Status DiskIndex::DeleteRaw(const std::string& key) {
  if (!rep_->broken.ok()) return rep_->broken;
  return rep_->Write(rep_->db->Delete(rep_->write_options, key), "delete");
}

Status DiskIndex::Apply(std::span<const std::pair<BlockHash, DiskIndexRecord>> puts,
                        std::span<const BlockHash> deletes) {
  if (puts.empty() && deletes.empty()) return Status::Ok();
  if (!rep_->broken.ok()) return rep_->broken;
  rocksdb::WriteBatch batch;
  for (const auto& [h, rec] : puts) {
    rocksdb::Status s = batch.Put(KeyOf(h), EncodeDiskIndexRecord(rec));
    if (!s.ok()) return Translate(s, "batch put");
  }
  for (const auto& h : deletes) {
    rocksdb::Status s = batch.Delete(KeyOf(h));
    if (!s.ok()) return Translate(s, "batch delete");
  }
  return rep_->Write(rep_->db->Write(rep_->write_options, &batch), "write batch");
}

Result<DiskIndexRecord> DiskIndex::Get(const BlockHash& h) const {
  std::string value;
  rocksdb::Status s = rep_->db->Get(rep_->read_options, KeyOf(h), &value);
  if (!s.ok()) return Translate(s, "get");
  return DecodeDiskIndexRecord(value);
}

Status DiskIndex::ForEach(
    const std::function<void(const BlockHash&, const DiskIndexRecord&)>& fn,
    const std::function<void(const std::string&, const std::string&)>& bad) const {
  std::unique_ptr<rocksdb::Iterator> it(rep_->db->NewIterator(rep_->read_options));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    rocksdb::Slice key = it->key();
    if (key.ToStringView() == kGeometryKey) continue;
    if (key.size() != sizeof(BlockHash::digest)) {
      bad(key.ToString(), "key of " + std::to_string(key.size()) + " bytes");
      continue;
    }
    Result<DiskIndexRecord> rec = DecodeDiskIndexRecord(it->value().ToStringView());
    if (!rec) {
      bad(key.ToString(), rec.error().message());
      continue;
    }
    BlockHash h;
    std::memcpy(h.digest.data(), key.data(), h.digest.size());
    fn(h, *rec);
  }
  return Translate(it->status(), "scan");
}

Result<std::optional<DiskGeometry>> DiskIndex::GetGeometry() const {
  std::string value;
  rocksdb::Status s = rep_->db->Get(rep_->read_options, kGeometryKey, &value);
  if (s.IsNotFound()) return std::optional<DiskGeometry>();
  if (!s.ok()) return Translate(s, "get geometry");
  if (value.size() != kGeometryBytes) return Status::Corrupt("disk index geometry record");
  DiskGeometry g;
  g.slot_bytes = GetU64(value.data());
  g.slots_per_slab = GetU64(value.data() + 8);
  g.block_bytes = GetU64(value.data() + 16);
  return std::optional<DiskGeometry>(g);
}

Status DiskIndex::PutGeometry(const DiskGeometry& g) {
  if (!rep_->broken.ok()) return rep_->broken;
  std::string value;
  PutU64(&value, g.slot_bytes);
  PutU64(&value, g.slots_per_slab);
  PutU64(&value, g.block_bytes);
  return rep_->Write(rep_->db->Put(rep_->write_options, kGeometryKey, value), "put geometry");
}

}  // namespace strata::kvcache
