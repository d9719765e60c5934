#include "core/safetensors.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_brief.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <system_error>
#include <tuple>

namespace mf {

// Records are copied to and from files byte for byte, which is only right where the host's byte
// order is the format's.
static_assert(std::endian::native == std::endian::little, "safetensors I/O supports little-endian hosts only");

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// The format's dtypes of whole-byte size, in the reference's enum order (increasing alignment, which
// the writer sorts by). `dtype` is empty where miniflow has no such type.
struct FormatDType {
  std::string_view name;
  uint64_t size;
  std::optional<DType> dtype;
};
constexpr FormatDType kFormatDTypes[] = {
    {"BOOL", 1, DType::Bool},  {"U8", 1, {}},  {"I8", 1, DType::Int8}, {"F8_E5M2", 1, {}},
    {"F8_E4M3", 1, {}},        {"F8_E8M0", 1, {}},              {"I16", 2, {}},
    {"U16", 2, {}},            {"F16", 2, {}}, {"BF16", 2, DType::BFloat16}, {"I32", 4, {}},
    {"U32", 4, {}},            {"F32", 4, DType::Float32},      {"F64", 8, DType::Float64},
    {"I64", 8, DType::Int64},  {"U64", 8, {}}, {"C64", 8, {}},
};

const FormatDType* find_format_dtype(std::string_view name) {
  for (const FormatDType& f : kFormatDTypes)
    if (f.name == name) return &f;
  return nullptr;
}

constexpr bool names_every_dtype() {
  for (int i = 0; i < kDTypeCount; ++i)
    if (std::none_of(std::begin(kFormatDTypes), std::end(kFormatDTypes),
                     [&](const FormatDType& f) { return f.dtype == static_cast<DType>(i); }))
      return false;
  return true;
}
static_assert(names_every_dtype(), "a miniflow dtype has no safetensors name in kFormatDTypes");

// Position of `dtype` in kFormatDTypes (its alignment rank); names_every_dtype() says it is there.
size_t format_rank(DType dtype) {
  size_t i = 0;
  while (kFormatDTypes[i].dtype != dtype) ++i;
  return i;
}

std::string shape_str(std::span<const int64_t> shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// numel * element_size for non-negative dims; empty when the element count does not fit int64 or
// the byte count uint64 (checked at each step, like the reference).
std::optional<uint64_t> byte_size(std::span<const int64_t> shape, uint64_t element_size) {
  constexpr uint64_t kMaxNumel = std::numeric_limits<int64_t>::max();
  uint64_t numel = 1;
  for (int64_t dim : shape) {
    if (dim != 0 && numel > kMaxNumel / static_cast<uint64_t>(dim)) return std::nullopt;
    numel *= static_cast<uint64_t>(dim);
  }
  if (numel != 0 && element_size > std::numeric_limits<uint64_t>::max() / numel) return std::nullopt;
  return numel * element_size;
}

// Index of the first byte of Bool data that is neither 0 nor 1.
std::optional<size_t> find_bad_bool(std::span<const std::byte> data) {
  auto it = std::find_if(data.begin(), data.end(), [](std::byte b) { return std::to_integer<uint8_t>(b) > 1; });
  if (it == data.end()) return std::nullopt;
  return static_cast<size_t>(it - data.begin());
}

bool is_utf8(const std::string& text) {
  try {
    (void)json(text).dump();  // dump validates UTF-8 (its strict error handler throws)
    return true;
  } catch (const json::type_error&) {
    return false;
  }
}

// ---- writing ----------------------------------------------------------------------------------

struct WritePlan {
  std::vector<std::byte> prefix;               // header size field + padded JSON header
  std::vector<const TensorRecordView*> order;  // the data buffer is their bytes in this order
};

template <typename... Args>
[[noreturn]] void bad_record(fmt::format_string<Args...> format, Args&&... args) {
  fail("cannot serialize safetensors: {}", fmt::format(format, std::forward<Args>(args)...));
}

// Validates everything before anything is written, so a bad record never costs a file.
WritePlan plan_write(std::span<const TensorRecordView> records, const SafetensorsMetadata& metadata) {
  WritePlan plan;
  for (const TensorRecordView& record : records) plan.order.push_back(&record);
  // The Python writer's order (decreasing alignment, then name) keeps every tensor aligned.
  std::sort(plan.order.begin(), plan.order.end(), [](const TensorRecordView* a, const TensorRecordView* b) {
    size_t ra = format_rank(a->dtype), rb = format_rank(b->dtype);
    return ra != rb ? ra > rb : a->name < b->name;
  });

  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json& entries = header["__metadata__"] = ordered_json::object();
    for (const auto& [key, value] : metadata) entries[key] = value;
  }
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const TensorRecordView* record : plan.order) {
    const std::string name(record->name);
    if (name == "__metadata__") bad_record("'__metadata__' is reserved and cannot name a tensor");
    if (!is_utf8(name)) bad_record("tensor name '{}' is not valid UTF-8", name);
    if (!names.insert(record->name).second) bad_record("two tensors are named '{}'", name);
    for (int64_t dim : record->shape)
      if (dim < 0) bad_record("tensor '{}' has negative dimension in shape {}", name, shape_str(record->shape));
    std::optional<uint64_t> nbytes = byte_size(record->shape, dtype_size(record->dtype));
    if (!nbytes) bad_record("tensor '{}': shape {} has too many elements", name, shape_str(record->shape));
    if (record->data.size() != *nbytes)
      bad_record("tensor '{}': data has {} bytes, but shape {} of {} needs {}", name, record->data.size(),
                 shape_str(record->shape), dtype_name(record->dtype), *nbytes);
    if (record->dtype == DType::Bool)
      if (std::optional<size_t> bad = find_bad_bool(record->data))
        bad_record("tensor '{}': bool element {} is byte {}, not 0 or 1", name, *bad,
                   std::to_integer<int>(record->data[*bad]));
    header[name] = ordered_json{{"dtype", kFormatDTypes[format_rank(record->dtype)].name},
                                {"shape", std::vector<int64_t>(record->shape.begin(), record->shape.end())},
                                {"data_offsets", {offset, offset + *nbytes}}};
    offset += *nbytes;
  }

  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad like the Python writer: data starts 8-aligned
  if (text.size() > kSafetensorsMaxHeaderSize)
    bad_record("the header would be {} bytes, over the {}-byte limit readers accept", text.size(),
               kSafetensorsMaxHeaderSize);
  const uint64_t size = text.size();
  plan.prefix.resize(8 + text.size());
  std::memcpy(plan.prefix.data(), &size, 8);
  std::memcpy(plan.prefix.data() + 8, text.data(), text.size());
  return plan;
}

std::vector<TensorRecordView> views_of(std::span<const TensorRecord> records) {
  std::vector<TensorRecordView> views;
  views.reserve(records.size());
  for (const TensorRecord& record : records) views.push_back(view_of(record));
  return views;
}

// ---- reading ----------------------------------------------------------------------------------

template <typename... Args>
[[noreturn]] void corrupt(std::string_view source, fmt::format_string<Args...> format, Args&&... args) {
  fail("safetensors file '{}': {}", source, fmt::format(format, std::forward<Args>(args)...));
}

// One tensor's header entry, validated on its own (dtype known, shape, offsets within the buffer
// and matching the shape).
struct Entry {
  std::string name;
  const FormatDType* format = nullptr;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct Header {
  std::vector<Entry> entries;  // by data offset
  SafetensorsMetadata metadata;
};

// The N of the size field, checked against the file size.
uint64_t header_size(std::span<const std::byte> size_field, uint64_t file_size, std::string_view source) {
  if (file_size < 8)
    corrupt(source, "file is {} bytes, shorter than the 8-byte header size field (truncated)", file_size);
  uint64_t n = 0;
  std::memcpy(&n, size_field.data(), 8);
  if (n > kSafetensorsMaxHeaderSize)
    corrupt(source, "header size {} exceeds the {}-byte limit (corrupt file?)", n, kSafetensorsMaxHeaderSize);
  if (n > file_size - 8)
    corrupt(source, "header size {} runs past the end of the {}-byte file (truncated)", n, file_size);
  return n;
}

// nlohmann keeps the last of duplicate keys silently; two entries of one name are ambiguous, so the
// parse callback rejects them.
json parse_json(std::string_view text, std::string_view source) {
  struct OpenObject {
    std::string name;
    std::set<std::string> keys;
  };
  std::vector<OpenObject> open;
  std::string last_key;
  auto callback = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open.push_back({last_key, {}});
    } else if (event == json::parse_event_t::object_end) {
      open.pop_back();
    } else if (event == json::parse_event_t::key) {
      last_key = parsed.get<std::string>();
      if (!open.back().keys.insert(last_key).second) {
        if (open.size() == 1) corrupt(source, "header has two entries named '{}'", last_key);
        corrupt(source, "header has key '{}' twice in '{}'", last_key, open.back().name);
      }
    }
    return true;
  };
  // nlohmann's lexer takes a NUL byte for the end of input and would ignore whatever follows.
  if (size_t nul = text.find('\0'); nul != std::string_view::npos)
    corrupt(source, "header is not valid JSON: NUL byte at offset {}", nul);
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    corrupt(source, "header is not valid JSON: {}", detail::clip_utf8(e.what(), 200));  // it quotes the bad token
  }
}

bool is_count(const json& value, uint64_t max) { return value.is_number_unsigned() && value.get<uint64_t>() <= max; }

SafetensorsMetadata parse_metadata(const json& value, std::string_view source) {
  if (!value.is_object()) corrupt(source, "__metadata__ is a JSON {}, not an object", value.type_name());
  SafetensorsMetadata metadata;
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string())
      corrupt(source, "__metadata__ value of key '{}' is a JSON {}, not a string", key, item.type_name());
    metadata.set(key, item.get<std::string>());
  }
  return metadata;
}

Entry parse_entry(const std::string& name, const json& value, uint64_t buffer_size, std::string_view source) {
  if (!value.is_object()) corrupt(source, "entry of tensor '{}' is a JSON {}, not an object", name, value.type_name());
  for (const auto& [key, item] : value.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      corrupt(source, "tensor '{}' has unexpected key '{}' (expected dtype, shape, data_offsets)", name, key);
  auto field = [&](const char* key) -> const json& {
    auto it = value.find(key);
    if (it == value.end()) corrupt(source, "tensor '{}' has no {}", name, key);
    return *it;
  };

  Entry entry;
  entry.name = name;
  const json& dtype = field("dtype");
  if (!dtype.is_string()) corrupt(source, "tensor '{}': dtype is a JSON {}, not a string", name, dtype.type_name());
  entry.format = find_format_dtype(dtype.get_ref<const std::string&>());
  if (!entry.format) corrupt(source, "tensor '{}' has unknown dtype {}", name, detail::brief_json(dtype));

  const json& shape = field("shape");
  if (!shape.is_array()) corrupt(source, "tensor '{}': shape is a JSON {}, not an array", name, shape.type_name());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (!is_count(shape[i], std::numeric_limits<int64_t>::max()))
      corrupt(source, "tensor '{}': shape entry {} is {}, not a non-negative integer", name, i,
              detail::brief_json(shape[i]));
    entry.shape.push_back(shape[i].get<int64_t>());
  }
  std::optional<uint64_t> nbytes = byte_size(entry.shape, entry.format->size);
  if (!nbytes) corrupt(source, "tensor '{}': shape {} has too many elements (overflow)", name, shape_str(entry.shape));

  const json& offsets = field("data_offsets");
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  if (!offsets.is_array() || offsets.size() != 2 || !is_count(offsets[0], kMax) || !is_count(offsets[1], kMax))
    corrupt(source, "tensor '{}': data_offsets {} is not [begin, end] of non-negative integers", name,
            detail::brief_json(offsets));
  entry.begin = offsets[0].get<uint64_t>();
  entry.end = offsets[1].get<uint64_t>();
  if (entry.begin > entry.end)
    corrupt(source, "tensor '{}': data_offsets [{}, {}] begin after they end", name, entry.begin, entry.end);
  if (entry.end > buffer_size)
    corrupt(source, "tensor '{}': data_offsets [{}, {}] end past the {}-byte data buffer (truncated file?)", name,
            entry.begin, entry.end, buffer_size);
  if (entry.end - entry.begin != *nbytes)
    corrupt(source, "tensor '{}': data_offsets [{}, {}] hold {} bytes, but shape {} of {} needs {}", name,
            entry.begin, entry.end, entry.end - entry.begin, shape_str(entry.shape), entry.format->name, *nbytes);
  return entry;
}

// The tensors must tile the data buffer exactly, as the reference requires: any overlap or unused
// byte means the header and the data disagree.
void check_tiling(std::vector<Entry>& entries, uint64_t buffer_size, std::string_view source) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < pos)
      corrupt(source, "tensor '{}' (data_offsets [{}, {}]) overlaps tensor '{}' ([{}, {}])", e.name, e.begin, e.end,
              prev->name, prev->begin, prev->end);
    if (e.begin > pos)
      corrupt(source, "data buffer bytes [{}, {}) before tensor '{}' belong to no tensor (gap)", pos, e.begin, e.name);
    pos = e.end;
    prev = &e;
  }
  if (pos != buffer_size)
    corrupt(source, "data buffer bytes [{}, {}) after the last tensor belong to no tensor (unused bytes)", pos,
            buffer_size);
}

Header parse_header(std::string_view text, uint64_t buffer_size, std::string_view source) {
  json root = parse_json(text, source);
  if (!root.is_object()) corrupt(source, "header is a JSON {}, not an object", root.type_name());
  Header header;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__")
      header.metadata = parse_metadata(value, source);
    else
      header.entries.push_back(parse_entry(key, value, buffer_size, source));
  }
  check_tiling(header.entries, buffer_size, source);
  return header;
}

// Turns a validated header into records; `read(begin, out)` fills `out` from data buffer offset `begin`.
template <typename Read>
SafetensorsContents build_contents(Header header, const SafetensorsReadOptions& options, std::string_view source,
                                   Read&& read) {
  if (!options.skip_unsupported_dtypes)
    for (const Entry& e : header.entries)
      if (!e.format->dtype)
        corrupt(source,
                "unsupported dtype {} for tensor '{}' (miniflow reads F32, F64, BF16, I64 and BOOL; "
                "SafetensorsReadOptions::skip_unsupported_dtypes skips such tensors)",
                e.format->name, e.name);
  SafetensorsContents contents;
  contents.metadata = std::move(header.metadata);
  for (Entry& e : header.entries) {
    if (!e.format->dtype) {
      contents.skipped.push_back({std::move(e.name), std::string(e.format->name), std::move(e.shape)});
      continue;
    }
    TensorRecord record{std::move(e.name), *e.format->dtype, std::move(e.shape),
                        std::vector<std::byte>(e.end - e.begin)};
    read(e.begin, std::span<std::byte>(record.data));
    if (record.dtype == DType::Bool)
      if (std::optional<size_t> bad = find_bad_bool(record.data))
        corrupt(source, "tensor '{}': BOOL element {} is byte {}, not 0 or 1", record.name, *bad,
                std::to_integer<int>(record.data[*bad]));
    contents.records.push_back(std::move(record));
  }
  return contents;
}

// pread until `out` is full.
void read_exact(int fd, uint64_t offset, std::span<std::byte> out, std::string_view path) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot read safetensors file '{}': {}", path, errno_text(errno));
    if (n == 0) fail("cannot read safetensors file '{}': it ended early (truncated while being read?)", path);
    done += static_cast<size_t>(n);
  }
}

}  // namespace

SafetensorsMetadata::SafetensorsMetadata(std::initializer_list<std::pair<const std::string, std::string>> entries) {
  for (const auto& [key, value] : entries) set(key, value);
}

void SafetensorsMetadata::set(const std::string& key, std::string value) {
  MF_CHECK(is_utf8(key), "safetensors metadata: key '{}' is not valid UTF-8", detail::clip_utf8(key, 80));
  MF_CHECK(is_utf8(value), "safetensors metadata: the value for key '{}' is not valid UTF-8", key);
  entries_[key] = std::move(value);
}

const std::string& SafetensorsMetadata::at(const std::string& key) const {
  auto it = entries_.find(key);
  MF_CHECK(it != entries_.end(), "safetensors metadata: there is no key '{}'", key);
  return it->second;
}

TensorRecordView view_of(const TensorRecord& record) {
  return {.name = record.name, .dtype = record.dtype, .shape = record.shape, .data = record.data};
}

std::vector<std::byte> serialize_safetensors(std::span<const TensorRecordView> records,
                                             const SafetensorsMetadata& metadata) {
  WritePlan plan = plan_write(records, metadata);
  std::vector<std::byte> bytes = std::move(plan.prefix);
  for (const TensorRecordView* record : plan.order) bytes.insert(bytes.end(), record->data.begin(), record->data.end());
  return bytes;
}

std::vector<std::byte> serialize_safetensors(std::span<const TensorRecord> records,
                                             const SafetensorsMetadata& metadata) {
  return serialize_safetensors(views_of(records), metadata);
}

SafetensorsContents parse_safetensors(std::span<const std::byte> bytes, std::string_view source,
                                      const SafetensorsReadOptions& options) {
  const uint64_t n = header_size(bytes, bytes.size(), source);
  std::span<const std::byte> header = bytes.subspan(8, n);
  std::span<const std::byte> buffer = bytes.subspan(8 + n);
  Header parsed = parse_header(std::string_view(reinterpret_cast<const char*>(header.data()), header.size()),
                               buffer.size(), source);
  return build_contents(std::move(parsed), options, source, [&](uint64_t begin, std::span<std::byte> out) {
    std::copy_n(buffer.begin() + static_cast<ptrdiff_t>(begin), out.size(), out.begin());
  });
}

void write_safetensors(const std::filesystem::path& path, std::span<const TensorRecordView> records,
                       const SafetensorsMetadata& metadata) {
  WritePlan plan;
  try {
    plan = plan_write(records, metadata);
  } catch (const Error& e) {  // the file the caller asked for, which is left as it was
    fail("{} (writing '{}')", e.what(), path.string());
  }
  AtomicFile file(path, "safetensors file");
  file.write(plan.prefix);
  for (const TensorRecordView* record : plan.order) file.write(record->data);
  file.commit();
}

void write_safetensors(const std::filesystem::path& path, std::span<const TensorRecord> records,
                       const SafetensorsMetadata& metadata) {
  write_safetensors(path, views_of(records), metadata);
}

SafetensorsContents read_safetensors(const std::filesystem::path& path, const SafetensorsReadOptions& options) {
  const std::string source = path.string();
  const int fd = ::open(source.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open safetensors file '{}': {}", source, errno_text(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};

  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("cannot stat safetensors file '{}': {}", source, errno_text(errno));
  if (!S_ISREG(st.st_mode)) fail("cannot read safetensors file '{}': not a regular file", source);
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);

  std::array<std::byte, 8> size_field{};
  if (file_size >= 8) read_exact(fd, 0, size_field, source);
  const uint64_t n = header_size(size_field, file_size, source);
  std::string text(n, '\0');
  read_exact(fd, 8, std::as_writable_bytes(std::span<char>(text)), source);
  Header parsed = parse_header(text, file_size - 8 - n, source);
  return build_contents(std::move(parsed), options, source, [&](uint64_t begin, std::span<std::byte> out) {
    read_exact(fd, 8 + n + begin, out, source);
  });
}

}  // namespace mf
