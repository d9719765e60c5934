// The safetensors file format (https://github.com/huggingface/safetensors) at the byte level.
//
// A file is: an 8-byte little-endian uint64 N, N bytes of UTF-8 JSON (the header, possibly padded
// with trailing spaces), then the data buffer. The header maps each tensor name to
// {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, offsets relative to the start of
// the data buffer, plus an optional "__metadata__" object of string -> string.
//
// This module knows nothing of the tensor class: it moves plain records (bytes + dtype + shape), and
// the layer above converts tensors to and from them. Only little-endian hosts are supported (the
// format is little-endian and records are copied byte for byte); the implementation static_asserts it.
//
// Reading is strict, like the reference implementation: every header field, the byte length of each
// tensor, and that the tensors tile the data buffer exactly (no overlap, no gap, no trailing bytes)
// are checked, and each failure throws mf::Error naming the file, the tensor and what was wrong.
// Beyond the reference, it also rejects unknown keys inside a tensor entry, duplicate JSON keys
// (which a JSON parser would otherwise resolve silently), and BOOL bytes other than 0 and 1 (which
// would be undefined behaviour as C++ bool).
#pragma once

#include "core/dtype.h"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mf {

/// The largest JSON header accepted (the reference implementation's limit). A bigger size field
/// means a corrupt or hostile file; writing refuses to produce one.
inline constexpr uint64_t kSafetensorsMaxHeaderSize = 100'000'000;

/// One tensor as stored in a file. `data` holds numel * dtype_size(dtype) bytes, little-endian,
/// row-major (C order); a scalar has shape {} and one element, an empty tensor has a 0 in its shape
/// and no bytes. Bool elements are single bytes, 0 or 1.
struct TensorRecord {
  std::string name;
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
};

/// A borrowed tensor to write, so callers can serialize their own buffers without copying them into
/// a TensorRecord. Same layout rules as TensorRecord; everything it points at must stay alive for
/// the duration of the write or serialize call.
struct TensorRecordView {
  std::string_view name;
  DType dtype = DType::Float32;
  std::span<const int64_t> shape;
  std::span<const std::byte> data;
};

/// The view of a record (borrows from it).
TensorRecordView view_of(const TensorRecord& record);

/// Free-form string annotations stored under "__metadata__" (e.g. a JSON config): a map of strings
/// whose keys and values are checked as they are set. The format's header is JSON, so both must be
/// valid UTF-8; a bad one throws where the program sets it, not when a checkpoint is saved after
/// training. Reads work as on a std::map.
class SafetensorsMetadata {
 public:
  using Map = std::map<std::string, std::string>;
  using const_iterator = Map::const_iterator;

  /// What `metadata[key] = value` assigns through: set() with the key.
  class Entry {
   public:
    Entry(SafetensorsMetadata& owner, std::string key) : owner_(owner), key_(std::move(key)) {}
    Entry& operator=(std::string value) {
      owner_.set(key_, std::move(value));
      return *this;
    }
    operator const std::string&() const { return owner_.at(key_); }

   private:
    SafetensorsMetadata& owner_;
    std::string key_;
  };

  SafetensorsMetadata() = default;
  /// {{"config", json}, {"note", text}}, each entry checked.
  SafetensorsMetadata(std::initializer_list<std::pair<const std::string, std::string>> entries);

  /// Sets `key` to `value`; throws mf::Error naming the key when either is not valid UTF-8.
  void set(const std::string& key, std::string value);
  Entry operator[](const std::string& key) { return Entry(*this, key); }
  /// The value of `key`; throws mf::Error naming the key when there is none.
  const std::string& at(const std::string& key) const;
  const_iterator find(const std::string& key) const { return entries_.find(key); }
  bool contains(const std::string& key) const { return entries_.contains(key); }
  bool erase(const std::string& key) { return entries_.erase(key) > 0; }
  const_iterator begin() const { return entries_.begin(); }
  const_iterator end() const { return entries_.end(); }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  bool operator==(const SafetensorsMetadata& other) const = default;

 private:
  Map entries_;
};

/// A tensor left out by SafetensorsReadOptions::skip_unsupported_dtypes.
struct SkippedTensor {
  std::string name;
  std::string dtype;  // as spelt in the file: "F16", "BF16", ...
  std::vector<int64_t> shape;
};

/// What a safetensors file holds.
struct SafetensorsContents {
  /// In file order: ascending data offset (for files miniflow writes, that is by dtype alignment,
  /// then name, like the Python writer).
  std::vector<TensorRecord> records;
  SafetensorsMetadata metadata;
  /// Tensors with a valid safetensors dtype that miniflow does not have, when skipping was asked for.
  std::vector<SkippedTensor> skipped;
};

/// How to read a file.
struct SafetensorsReadOptions {
  /// A tensor whose dtype is valid safetensors but not a miniflow dtype (F16, BF16, I32, U8, ...) is
  /// an error by default; with this set it is validated like the others, then listed in
  /// SafetensorsContents::skipped instead of being returned. Unknown dtype strings are always errors.
  bool skip_unsupported_dtypes = false;
};

/// The bytes of a safetensors file holding `records` and `metadata` (no "__metadata__" entry when
/// empty). Tensors are laid out as the Python writer does (by decreasing dtype alignment, then by
/// name) and the header is padded with spaces to a multiple of 8 bytes, so for the same tensors
/// and at most one metadata entry the bytes match Python's safetensors exactly.
/// Throws mf::Error on a duplicate or reserved ("__metadata__") name, a negative dimension, a data
/// size that does not match shape and dtype, a Bool byte other than 0/1, or text that is not UTF-8.
std::vector<std::byte> serialize_safetensors(std::span<const TensorRecordView> records,
                                             const SafetensorsMetadata& metadata = {});
/// serialize_safetensors for owned records.
std::vector<std::byte> serialize_safetensors(std::span<const TensorRecord> records,
                                             const SafetensorsMetadata& metadata = {});

/// Parses the bytes of a whole safetensors file, validating everything (see the file comment);
/// `source` names the bytes in error messages. Throws mf::Error.
SafetensorsContents parse_safetensors(std::span<const std::byte> bytes, std::string_view source = "<memory>",
                                      const SafetensorsReadOptions& options = {});

/// Writes a safetensors file atomically (core/atomic_file.h): the bytes of serialize_safetensors go to
/// a temporary file beside `path`, fsync'ed and renamed over it; on any failure whatever was at `path`
/// is left untouched. Throws mf::Error naming the path and the system's reason.
void write_safetensors(const std::filesystem::path& path, std::span<const TensorRecordView> records,
                       const SafetensorsMetadata& metadata = {});
/// write_safetensors for owned records.
void write_safetensors(const std::filesystem::path& path, std::span<const TensorRecord> records,
                       const SafetensorsMetadata& metadata = {});

/// Reads and validates a safetensors file, like parse_safetensors. The header is read and checked
/// first, then each tensor's bytes straight into its record, so peak memory is about the file size.
/// Throws mf::Error naming the path.
SafetensorsContents read_safetensors(const std::filesystem::path& path, const SafetensorsReadOptions& options = {});

}  // namespace mf
