// The safetensors format at the byte level: round trips, a file Python's safetensors writes, every
// way a file can be corrupt, and atomic writes.
#include <doctest/doctest.h>

#include "miniflow.h"

#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <unistd.h>

namespace {

using mf::DType;
using mf::TensorRecord;

template <typename T>
std::vector<std::byte> bytes_of(std::initializer_list<T> values) {
  std::vector<std::byte> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), std::data(values), out.size());
  return out;
}

std::vector<std::byte> bytes_of(std::string_view text) {
  std::vector<std::byte> out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

std::vector<std::byte> le64(uint64_t value) {
  std::vector<std::byte> out(8);
  std::memcpy(out.data(), &value, 8);
  return out;
}

std::vector<std::byte> concat(std::initializer_list<std::vector<std::byte>> parts) {
  std::vector<std::byte> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

// A file whose size field is exactly the header text's length.
std::vector<std::byte> make_file(std::string_view header, std::vector<std::byte> data) {
  return concat({le64(header.size()), bytes_of(header), std::move(data)});
}

std::vector<std::byte> zeros(size_t n) { return std::vector<std::byte>(n); }

std::vector<std::byte> read_file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return bytes_of(std::string_view(chars.data(), chars.size()));
}

void write_file_bytes(const std::filesystem::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A fresh directory for one test, removed with everything in it.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("miniflow_test_safetensors_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(path)) names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }
};

const TensorRecord& record_named(const std::vector<TensorRecord>& records, std::string_view name) {
  auto it = std::find_if(records.begin(), records.end(), [&](const TensorRecord& r) { return r.name == name; });
  REQUIRE_MESSAGE(it != records.end(), "no tensor named " << std::string(name));
  return *it;
}

std::vector<std::string> names_of(const std::vector<TensorRecord>& records) {
  std::vector<std::string> names;
  for (const TensorRecord& r : records) names.push_back(r.name);
  return names;
}

void check_same(const TensorRecord& got, const TensorRecord& want) {
  CAPTURE(want.name);
  CHECK(got.name == want.name);
  CHECK(got.dtype == want.dtype);
  CHECK(got.shape == want.shape);
  CHECK(got.data == want.data);  // bytes, so NaN payloads and -0.0 count
}

std::vector<TensorRecord> sample_records() {
  const float nan_with_payload = std::bit_cast<float>(uint32_t{0x7fc12345});
  return {
      {"w", DType::Float32, {2, 3}, bytes_of<float>({1.5f, -0.0f, nan_with_payload, 1e-45f, -3.25f, INFINITY})},
      {"loss", DType::Float64, {}, bytes_of<double>({3.6541007764741784})},
      {"ids", DType::Int64, {4}, bytes_of<int64_t>({0, -1, INT64_MAX, INT64_MIN})},
      {"mask", DType::Bool, {2, 2}, bytes_of<uint8_t>({1, 0, 0, 1})},
      {"empty", DType::Float32, {0, 3}, {}},
      {"none", DType::Int64, {0}, {}},
  };
}

}  // namespace

TEST_CASE("records and metadata round-trip bit for bit") {
  const std::vector<TensorRecord> records = sample_records();
  const mf::SafetensorsMetadata metadata = {{"config", R"({"d_model": 16})"}, {"note", "ünïcode ✓"}, {"", "empty key"}};
  const std::vector<std::byte> bytes = mf::serialize_safetensors(records, metadata);

  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  CHECK(header_size % 8 == 0);  // data starts 8-aligned
  CHECK(bytes.size() == 8 + header_size + (6 * 4 + 8 + 4 * 8 + 4));

  const mf::SafetensorsContents contents = mf::parse_safetensors(bytes);
  // File order: decreasing alignment (I64, F64, F32, BOOL), then name.
  CHECK(names_of(contents.records) == std::vector<std::string>{"ids", "none", "loss", "empty", "w", "mask"});
  for (const TensorRecord& want : records) check_same(record_named(contents.records, want.name), want);
  CHECK(contents.metadata == metadata);
  CHECK(contents.skipped.empty());
  CHECK(mf::serialize_safetensors(contents.records, contents.metadata) == bytes);

  SUBCASE("no metadata writes no __metadata__ entry") {
    const std::vector<std::byte> plain = mf::serialize_safetensors(records);
    const std::string text(reinterpret_cast<const char*>(plain.data()), plain.size());
    CHECK(text.find("__metadata__") == std::string::npos);
    CHECK(mf::parse_safetensors(plain).metadata.empty());
  }
  SUBCASE("views serialize like the records they borrow from") {
    std::vector<mf::TensorRecordView> views;
    for (const TensorRecord& r : records) views.push_back(mf::view_of(r));
    CHECK(mf::serialize_safetensors(views, metadata) == bytes);
  }
  SUBCASE("an empty file set is just {} padded") {
    CHECK(mf::serialize_safetensors(std::vector<TensorRecord>{}) == concat({le64(8), bytes_of("{}      ")}));
  }
}

TEST_CASE("files round-trip through write_safetensors and read_safetensors") {
  TempDir dir;
  const std::filesystem::path path = dir.path / "model.safetensors";
  const std::vector<TensorRecord> records = sample_records();
  const mf::SafetensorsMetadata metadata = {{"format", "pt"}};
  mf::write_safetensors(path, records, metadata);
  CHECK(read_file_bytes(path) == mf::serialize_safetensors(records, metadata));
  CHECK(dir.entries() == std::vector<std::string>{"model.safetensors"});  // no temporary file left

  const mf::SafetensorsContents contents = mf::read_safetensors(path);
  for (const TensorRecord& want : records) check_same(record_named(contents.records, want.name), want);
  CHECK(contents.metadata == metadata);

  // Overwriting replaces the whole file.
  const std::vector<TensorRecord> smaller = {{"x", DType::Float64, {1}, bytes_of<double>({2.0})}};
  mf::write_safetensors(path, smaller);
  CHECK(read_file_bytes(path) == mf::serialize_safetensors(smaller));
}

TEST_CASE("a write deletes the temporary files of killed writers on this host, and no others") {
  TempDir dir;
  const std::filesystem::path path = dir.path / "model.safetensors";
  std::array<char, 256> host{};
  REQUIRE(::gethostname(host.data(), host.size() - 1) == 0);
  // A process id that surely runs no process: a child that has exited and been reaped.
  const pid_t dead = ::fork();
  REQUIRE(dead >= 0);
  if (dead == 0) ::_exit(0);
  REQUIRE(::waitpid(dead, nullptr, 0) == dead);
  const std::string ours = "model.safetensors.tmp." + std::string(host.data()) + ".";
  const std::vector<std::string> kept = {
      ours + std::to_string(::getpid()) + ".7",  // this process: another thread may be writing it
      ours + "1.0",                              // init is alive
      "model.safetensors.tmp.some-other-host." + std::to_string(dead) + ".0",  // its pids mean nothing here
      "other.safetensors.tmp." + std::string(host.data()) + "." + std::to_string(dead) + ".0",  // another target
      ours + std::to_string(dead) + "." + std::to_string(dead) + ".0",  // host HOST.<dead>'s writer
  };
  for (const std::string& name : kept) write_file_bytes(dir.path / name, bytes_of("partial"));
  write_file_bytes(dir.path / (ours + std::to_string(dead) + ".3"), bytes_of("partial"));

  mf::write_safetensors(path, sample_records());
  std::vector<std::string> expected = kept;
  expected.push_back("model.safetensors");
  std::sort(expected.begin(), expected.end());
  CHECK(dir.entries() == expected);  // only the dead writer's file is gone
  CHECK(mf::read_safetensors(path).records.size() == sample_records().size());
}

TEST_CASE("bytes match what Python's safetensors writes") {
  // Python:
  //   save_file({"a": np.array([1, -2], np.float32), "b": np.array(7, np.int64),
  //              "c": np.array([True, False, True])}, path, metadata={"format": "pt"})
  // The writer (Rust `prepare` in safetensors/src/tensor.rs) sorts tensors by decreasing dtype
  // alignment (its Dtype enum order: BOOL < ... < F32 < F64 < I64), then by name, so the order is
  // b (I64, 8 bytes at [0, 8]), a (F32, 8 bytes at [8, 16]), c (BOOL, 3 bytes at [16, 19]). The
  // header is compact serde_json with "__metadata__" first and keys dtype, shape, data_offsets;
  // it is 194 bytes, padded with 6 spaces to 200, a multiple of 8. safetensors 0.8.0's
  // serialize() produced exactly these 227 bytes.
  const std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("b":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
      R"("c":{"dtype":"BOOL","shape":[3],"data_offsets":[16,19]}})";
  REQUIRE(header.size() == 194);
  const std::vector<std::byte> python = concat({
      bytes_of<uint8_t>({200, 0, 0, 0, 0, 0, 0, 0}),  // header size, little-endian
      bytes_of(header),
      bytes_of("      "),
      bytes_of<uint8_t>({7, 0, 0, 0, 0, 0, 0, 0}),  // b = 7
      bytes_of<uint8_t>({0x00, 0x00, 0x80, 0x3f}),  // a[0] = 1.0f
      bytes_of<uint8_t>({0x00, 0x00, 0x00, 0xc0}),  // a[1] = -2.0f
      bytes_of<uint8_t>({1, 0, 1}),                 // c
  });
  REQUIRE(python.size() == 227);

  const std::vector<TensorRecord> records = {
      {"a", DType::Float32, {2}, bytes_of<float>({1.0f, -2.0f})},
      {"b", DType::Int64, {}, bytes_of<int64_t>({7})},
      {"c", DType::Bool, {3}, bytes_of<uint8_t>({1, 0, 1})},
  };
  CHECK(mf::serialize_safetensors(records, {{"format", "pt"}}) == python);

  const mf::SafetensorsContents contents = mf::parse_safetensors(python);
  REQUIRE(contents.records.size() == 3);
  check_same(contents.records[0], records[1]);
  check_same(contents.records[1], records[0]);
  check_same(contents.records[2], records[2]);
  CHECK(contents.metadata == mf::SafetensorsMetadata{{"format", "pt"}});
}

TEST_CASE("readers accept any padding, key order and header size") {
  // The reference's own test vector: F32 [1, 2, 3] = 0..5, an unpadded 64-byte header.
  const auto data = bytes_of<float>({0, 1, 2, 3, 4, 5});
  const auto unpadded = make_file(R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})", data);
  CHECK(mf::parse_safetensors(unpadded).records.at(0).shape == std::vector<int64_t>{1, 2, 3});

  // Trailing whitespace that is not a multiple of 8, keys out of offset order, offsets before shape.
  const auto shuffled = make_file(
      R"({"z":{"data_offsets":[0,8],"shape":[1],"dtype":"F64"},"a":{"dtype":"I64","shape":[1],"data_offsets":[8,16]}} )"
      "\t\n ",
      bytes_of<int64_t>({1, 2}));
  CHECK(names_of(mf::parse_safetensors(shuffled).records) == std::vector<std::string>{"z", "a"});
}

TEST_CASE("corrupt files raise mf::Error naming the file, the tensor and the fault") {
  const std::string t8 = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  auto entry = [](std::string_view body) { return fmt::format(R"({{"t":{{{}}}}})", body); };
  struct Case {
    std::vector<std::byte> bytes;
    std::string message;
  };
  const std::vector<Case> cases = {
      {zeros(5), "file is 5 bytes, shorter than the 8-byte header size field (truncated)"},
      {concat({le64(uint64_t{1} << 40), bytes_of("{}")}), "header size 1099511627776 exceeds the 100000000-byte limit"},
      {concat({le64(100), bytes_of("{}        ")}), "header size 100 runs past the end of the 18-byte file (truncated)"},
      {make_file(R"({"t":)", {}), "header is not valid JSON: "},
      {make_file("{\"\xff\":1}", {}), "header is not valid JSON: "},
      {make_file(std::string("{}\0\0", 4), {}), "header is not valid JSON: NUL byte at offset 2"},
      {make_file("[1, 2]", {}), "header is a JSON array, not an object"},
      {make_file(R"({"t":3})", {}), "entry of tensor 't' is a JSON number, not an object"},
      {make_file(entry(R"("shape":[2],"data_offsets":[0,8])"), zeros(8)), "tensor 't' has no dtype"},
      {make_file(entry(R"("dtype":4,"shape":[2],"data_offsets":[0,8])"), zeros(8)),
       "tensor 't': dtype is a JSON number, not a string"},
      {make_file(entry(R"("dtype":"F17","shape":[2],"data_offsets":[0,8])"), zeros(8)),
       "tensor 't' has unknown dtype \"F17\""},
      {make_file(entry(R"("dtype":")" + std::string(100, 'X') + R"(","shape":[2],"data_offsets":[0,8])"), zeros(8)),
       "tensor 't' has unknown dtype \"" + std::string(59, 'X') + "..."},
      {make_file(entry(R"("dtype":"F32","data_offsets":[0,8])"), zeros(8)), "tensor 't' has no shape"},
      {make_file(entry(R"("dtype":"F32","shape":2,"data_offsets":[0,8])"), zeros(8)),
       "tensor 't': shape is a JSON number, not an array"},
      {make_file(entry(R"("dtype":"F32","shape":[2,-1],"data_offsets":[0,8])"), zeros(8)),
       "tensor 't': shape entry 1 is -1, not a non-negative integer"},
      {make_file(entry(R"("dtype":"F32","shape":[2.5],"data_offsets":[0,8])"), zeros(8)),
       "tensor 't': shape entry 0 is 2.5, not a non-negative integer"},
      {make_file(entry(R"("dtype":"F32","shape":["2"],"data_offsets":[0,8])"), zeros(8)),
       R"(tensor 't': shape entry 0 is "2", not a non-negative integer)"},
      {make_file(entry(R"("dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8])"), zeros(8)),
       "tensor 't': shape entry 0 is 9223372036854775808, not a non-negative integer"},
      {make_file(entry(R"("dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8])"), zeros(8)),
       "tensor 't': shape [4294967296, 4294967296] has too many elements (overflow)"},
      {make_file(entry(R"("dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8])"), zeros(8)),
       "tensor 't': shape [4611686018427387904] has too many elements (overflow)"},
      {make_file(entry(R"("dtype":"F32","shape":[2])"), zeros(8)), "tensor 't' has no data_offsets"},
      {make_file(entry(R"("dtype":"F32","shape":[2],"data_offsets":[8])"), zeros(8)),
       "tensor 't': data_offsets [8] is not [begin, end] of non-negative integers"},
      {make_file(entry(R"("dtype":"F32","shape":[2],"data_offsets":[0,8,8])"), zeros(8)),
       "tensor 't': data_offsets [0,8,8] is not [begin, end]"},
      {make_file(entry(R"("dtype":"F32","shape":[2],"data_offsets":[-8,0])"), zeros(8)),
       "tensor 't': data_offsets [-8,0] is not [begin, end]"},
      {make_file(entry(R"("dtype":"F32","shape":[2],"data_offsets":[0,8.0])"), zeros(8)),
       "tensor 't': data_offsets [0,8.0] is not [begin, end]"},
      {make_file(entry(R"("dtype":"F32","shape":[2],"data_offsets":{"begin":0})"), zeros(8)),
       R"(tensor 't': data_offsets {"begin":0} is not [begin, end])"},
      {make_file(entry(R"("dtype":"F32","shape":[2],"data_offsets":[8,0])"), zeros(8)),
       "tensor 't': data_offsets [8, 0] begin after they end"},
      {make_file(entry(R"("dtype":"F32","shape":[4],"data_offsets":[0,16])"), zeros(8)),
       "tensor 't': data_offsets [0, 16] end past the 8-byte data buffer (truncated file?)"},
      {make_file(entry(R"("dtype":"F32","shape":[3],"data_offsets":[0,8])"), zeros(8)),
       "tensor 't': data_offsets [0, 8] hold 8 bytes, but shape [3] of F32 needs 12"},
      {make_file(entry(R"("dtype":"F32","shape":[2],"data_offsets":[0,8],"offsets":[0,8])"), zeros(8)),
       "tensor 't' has unexpected key 'offsets'"},
      {make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 zeros(12)),
       "tensor 'b' (data_offsets [4, 12]) overlaps tensor 'a' ([0, 8])"},
      {make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                 zeros(8)),
       "tensor 'e' (data_offsets [4, 4]) overlaps tensor 'a' ([0, 8])"},
      {make_file(entry(R"("dtype":"F32","shape":[2],"data_offsets":[4,12])"), zeros(12)),
       "data buffer bytes [0, 4) before tensor 't' belong to no tensor (gap)"},
      {make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                 zeros(20)),
       "data buffer bytes [8, 12) before tensor 'b' belong to no tensor (gap)"},
      {make_file(t8, zeros(10)), "data buffer bytes [8, 10) after the last tensor belong to no tensor"},
      {make_file(R"({"__metadata__":{},"__metadata__":{}})", {}), "header has two entries named '__metadata__'"},
      {make_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("t":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                 zeros(16)),
       "header has two entries named 't'"},
      {make_file(entry(R"("dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8])"), zeros(8)),
       "header has key 'dtype' twice in 't'"},
      {make_file(R"({"__metadata__":{"k":"a","k":"b"}})", {}), "header has key 'k' twice in '__metadata__'"},
      {make_file(R"({"__metadata__":{"k":1}})", {}), "__metadata__ value of key 'k' is a JSON number, not a string"},
      {make_file(R"({"__metadata__":["k"]})", {}), "__metadata__ is a JSON array, not an object"},
      {make_file(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", bytes_of<uint8_t>({1, 2, 0})),
       "tensor 'm': BOOL element 1 is byte 2, not 0 or 1"},
      {make_file(R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", zeros(4)),
       "unsupported dtype F16 for tensor 'h' (miniflow reads F32, F64, BF16, I64 and BOOL; "
       "SafetensorsReadOptions::skip_unsupported_dtypes skips such tensors)"},
  };
  TempDir dir;
  for (const Case& c : cases) {
    CAPTURE(c.message);
    const std::string in_memory = "safetensors file 'bad.safetensors': " + c.message;
    CHECK_THROWS_WITH_AS(mf::parse_safetensors(c.bytes, "bad.safetensors"), doctest::Contains(in_memory.c_str()),
                         mf::Error);
    // The file reader validates through its own path (header first, then pread per tensor).
    const std::filesystem::path path = dir.path / "bad.safetensors";
    write_file_bytes(path, c.bytes);
    const std::string on_disk = "safetensors file '" + path.string() + "': " + c.message;
    CHECK_THROWS_WITH_AS(mf::read_safetensors(path), doctest::Contains(on_disk.c_str()), mf::Error);
  }
}

TEST_CASE("hostile headers fail cleanly: deep nesting, huge sizes") {
  // Error messages must not dump user JSON recursively: a million nested arrays would overflow the stack.
  const std::string deep = R"({"t":{"dtype":"F32","shape":)" + std::string(1'000'000, '[') +
                           std::string(1'000'000, ']') + R"(,"data_offsets":[0,0]}})";
  CHECK_THROWS_WITH_AS(mf::parse_safetensors(make_file(deep, {})),
                       "safetensors file '<memory>': tensor 't': shape entry 0 is a JSON array of size 1, not a "
                       "non-negative integer",
                       mf::Error);
  // Found by fuzz_vocab, then checked here: a number too big for a double is nlohmann's
  // out_of_range, which escaped as a JSON exception instead of mf::Error.
  CHECK_THROWS_WITH_AS(mf::parse_safetensors(make_file(R"({"t":1e400})", {})),
                       "safetensors file '<memory>': header is not valid JSON: [json.exception.out_of_range.406] "
                       "number overflow parsing '1e400'",
                       mf::Error);
  CHECK_THROWS_WITH_AS(mf::parse_safetensors(concat({le64(std::numeric_limits<uint64_t>::max()), zeros(8)})),
                       doctest::Contains("header size 18446744073709551615 exceeds the 100000000-byte limit"),
                       mf::Error);
}

TEST_CASE("unsupported dtypes can be skipped, but are still validated") {
  const auto file = make_file(R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
                              R"("t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                              concat({zeros(4), bytes_of<float>({5.0f})}));
  const mf::SafetensorsContents contents = mf::parse_safetensors(file, "x", {.skip_unsupported_dtypes = true});
  REQUIRE(contents.records.size() == 1);
  check_same(contents.records[0], {"t", DType::Float32, {1}, bytes_of<float>({5.0f})});
  REQUIRE(contents.skipped.size() == 1);
  CHECK(contents.skipped[0].name == "h");
  CHECK(contents.skipped[0].dtype == "F16");
  CHECK(contents.skipped[0].shape == std::vector<int64_t>{2});

  const auto wrong_size = make_file(R"({"h":{"dtype":"F16","shape":[3],"data_offsets":[0,4]}})", zeros(4));
  CHECK_THROWS_WITH_AS(mf::parse_safetensors(wrong_size, "x", {.skip_unsupported_dtypes = true}),
                       doctest::Contains("tensor 'h': data_offsets [0, 4] hold 4 bytes, but shape [3] of F16 needs 6"),
                       mf::Error);
}

TEST_CASE("invalid records are refused before anything is written") {
  TempDir dir;
  const std::filesystem::path path = dir.path / "out.safetensors";
  auto refused = [&](std::vector<TensorRecord> records, const std::string& message) {
    CAPTURE(message);
    const std::string full = "cannot serialize safetensors: " + message;
    CHECK_THROWS_WITH_AS(mf::write_safetensors(path, records), doctest::Contains(full.c_str()), mf::Error);
    CHECK(dir.entries().empty());
  };
  refused({{"t", DType::Float32, {3}, zeros(8)}}, "tensor 't': data has 8 bytes, but shape [3] of float32 needs 12");
  refused({{"t", DType::Float32, {-1}, {}}}, "tensor 't' has negative dimension in shape [-1]");
  refused({{"t", DType::Float32, {1}, zeros(4)}, {"t", DType::Int64, {}, zeros(8)}}, "two tensors are named 't'");
  refused({{"__metadata__", DType::Float32, {}, zeros(4)}}, "'__metadata__' is reserved and cannot name a tensor");
  refused({{"bad\xff", DType::Float32, {}, zeros(4)}}, "tensor name 'bad\xff' is not valid UTF-8");
  refused({{"b", DType::Bool, {2}, bytes_of<uint8_t>({0, 7})}}, "tensor 'b': bool element 1 is byte 7, not 0 or 1");
  refused({{"t", DType::Int64, {int64_t{1} << 62, 4}, {}}}, "tensor 't': shape [4611686018427387904, 4] has too many");
  // The message names the file it would have written.
  const std::string names_file = "(writing '" + path.string() + "')";
  CHECK_THROWS_WITH_AS(mf::write_safetensors(path, std::vector<TensorRecord>{{"t", DType::Float32, {-1}, {}}}),
                       doctest::Contains(names_file.c_str()), mf::Error);
  CHECK(dir.entries().empty());
}

TEST_CASE("metadata that is not UTF-8 is refused where it is set, not when the file is written") {
  // The header is JSON, which holds UTF-8 only: "\xc3" starts a two-byte sequence and ends there,
  // "\xff" is never valid.
  mf::SafetensorsMetadata metadata;
  CHECK_THROWS_WITH_AS(metadata["chars"] = "ab\xc3", "safetensors metadata: the value for key 'chars' is not valid UTF-8",
                       mf::Error);
  CHECK_THROWS_WITH_AS(metadata.set("\xff", "v"), doctest::Contains("is not valid UTF-8"), mf::Error);
  CHECK_THROWS_WITH_AS((mf::SafetensorsMetadata{{"k", "\xc3"}}),
                       "safetensors metadata: the value for key 'k' is not valid UTF-8", mf::Error);
  CHECK(metadata.empty());
  metadata["chars"] = "äöü ✓";
  metadata.set("step", "12");
  CHECK(metadata.at("chars") == "äöü ✓");
  CHECK(metadata.size() == 2);
  CHECK_THROWS_WITH_AS(metadata.at("missing"), "safetensors metadata: there is no key 'missing'", mf::Error);
}

TEST_CASE("write_safetensors is atomic") {
  TempDir dir;
  const std::filesystem::path path = dir.path / "model.safetensors";
  const std::vector<TensorRecord> old = {{"old", DType::Float32, {2}, bytes_of<float>({1, 2})}};
  mf::write_safetensors(path, old);
  const std::vector<std::byte> before = read_file_bytes(path);

  SUBCASE("a missing directory is named in the error") {
    const std::filesystem::path missing = dir.path / "no_such_dir" / "x.safetensors";
    const std::string message = "cannot write safetensors file '" + missing.string() + "': creating temporary file";
    CHECK_THROWS_WITH_AS(mf::write_safetensors(missing, old), doctest::Contains(message.c_str()), mf::Error);
    CHECK_THROWS_WITH_AS(mf::write_safetensors(missing, old), doctest::Contains("No such file or directory"),
                         mf::Error);
  }

  SUBCASE("a write that fails midway leaves the existing file intact") {
    // A file-size limit makes the kernel fail the temporary file's writes with EFBIG after 4 KiB:
    // a genuine mid-write failure, and one that also happens for root (who ignores permissions).
    const std::vector<TensorRecord> big = {{"big", DType::Float64, {100000}, zeros(800000)}};
    std::string message;
    rlimit saved{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
    rlimit limited = saved;
    limited.rlim_cur = 4096;
    auto* previous_handler = std::signal(SIGXFSZ, SIG_IGN);  // get EFBIG instead of being killed
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &limited) == 0);
    try {
      mf::write_safetensors(path, big);
    } catch (const mf::Error& e) {
      message = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, previous_handler);

    CHECK(message.find("cannot write safetensors file '" + path.string() + "': writing temporary file") == 0);
    CHECK(message.find("File too large") != std::string::npos);
    CHECK(read_file_bytes(path) == before);
    CHECK(dir.entries() == std::vector<std::string>{"model.safetensors"});
  }

  SUBCASE("a rename that fails removes the temporary file") {
    const std::filesystem::path occupied = dir.path / "occupied";
    std::filesystem::create_directories(occupied / "inside");
    const std::string message = "cannot write safetensors file '" + occupied.string() + "': renaming temporary file";
    CHECK_THROWS_WITH_AS(mf::write_safetensors(occupied, old), doctest::Contains(message.c_str()), mf::Error);
    CHECK(std::filesystem::is_directory(occupied / "inside"));
    CHECK(dir.entries() == std::vector<std::string>{"model.safetensors", "occupied"});
  }
}

// Every other writer (vocabularies, translations, charts) goes through the same AtomicFile as
// write_safetensors; this holds the text entry point to the same contract.
TEST_CASE("write_file_atomic replaces a text file whole, or leaves it and names what failed") {
  TempDir dir;
  const std::filesystem::path path = dir.path / "out.txt";
  mf::write_file_atomic(path, "first version\n", "translations");
  mf::write_file_atomic(path, "second\n", "translations");
  const std::vector<std::byte> second = read_file_bytes(path);
  CHECK(second == bytes_of("second\n"));
  CHECK(dir.entries() == std::vector<std::string>{"out.txt"});  // no temporary file left

  const std::filesystem::path missing = dir.path / "no_such_dir" / "x.txt";
  const std::string message = "cannot write translations '" + missing.string() + "': creating temporary file";
  CHECK_THROWS_WITH_AS(mf::write_file_atomic(missing, "x", "translations"), doctest::Contains(message.c_str()),
                       mf::Error);

  // An AtomicFile abandoned before commit() (an exception between writes) leaves the target as it was.
  {
    mf::AtomicFile file(path, "translations");
    file.write(std::string_view("half of a new"));
  }
  CHECK(read_file_bytes(path) == second);
  CHECK(dir.entries() == std::vector<std::string>{"out.txt"});
}

TEST_CASE("read_safetensors names the path when it cannot read") {
  TempDir dir;
  const std::filesystem::path missing = dir.path / "missing.safetensors";
  const std::string message = "cannot open safetensors file '" + missing.string() + "': No such file or directory";
  CHECK_THROWS_WITH_AS(mf::read_safetensors(missing), message.c_str(), mf::Error);
  const std::string not_file = "cannot read safetensors file '" + dir.path.string() + "': not a regular file";
  CHECK_THROWS_WITH_AS(mf::read_safetensors(dir.path), not_file.c_str(), mf::Error);
}

TEST_CASE("reads the PyTorch reference file (a copy of ../shared/reference's, in tests/data)") {
  // Tests run from the project root.
  const mf::SafetensorsContents contents = mf::read_safetensors("tests/data/transformer_tiny.safetensors");
  CHECK(contents.records.size() == 440);
  CHECK(contents.skipped.empty());

  const TensorRecord& logits = record_named(contents.records, "expected.logits");
  CHECK(logits.dtype == DType::Float64);
  CHECK(logits.shape == std::vector<int64_t>{3, 6, 13});
  CHECK(logits.data.size() == 3 * 6 * 13 * 8);

  // Values read with Python's struct module from the same file.
  check_same(record_named(contents.records, "input.src"),
             {"input.src", DType::Int64, {3, 5}, bytes_of<int64_t>({5, 7, 3, 9, 4, 6, 8, 11, 0, 0, 12, 3, 0, 0, 0})});
  check_same(record_named(contents.records, "expected.loss"),
             {"expected.loss", DType::Float64, {}, bytes_of<double>({3.6541007764741784})});

  REQUIRE(contents.metadata.contains("config"));
  CHECK(contents.metadata.at("config").find(R"("d_model": 16)") != std::string::npos);

  const mf::SafetensorsContents again =
      mf::parse_safetensors(mf::serialize_safetensors(contents.records, contents.metadata));
  CHECK(again.records.size() == contents.records.size());
  CHECK(again.metadata == contents.metadata);
}
