// Checkpoints: tensors <-> records, bit-exact save/load of every dtype and of views, every way a
// checkpoint can be corrupt or fail to match its model, atomic saves, and the PyTorch reference file.
#include <doctest/doctest.h>

#include "helpers.h"

#include <sys/resource.h>
#include <unistd.h>

#include <bit>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iterator>

using namespace mf;
using mf::testing::check_close;

namespace {

// A fresh directory for one test, removed with everything in it.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("miniflow_test_checkpoint_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The JSON header of a safetensors file's bytes, and the file rebuilt around a new header.
uint64_t header_size(const std::string& file) {
  uint64_t size = 0;
  std::memcpy(&size, file.data(), 8);
  return size;
}
std::string header_of(const std::string& file) { return file.substr(8, header_size(file)); }
std::string with_header(const std::string& file, const std::string& header) {
  std::string size(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(size.data(), &n, 8);
  return size + header + file.substr(8 + header_size(file));
}
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, "'" << from << "' not found in " << text);
  return text.replace(at, from.size(), to);
}

// The bytes a tensor is stored as (row-major, little-endian).
std::vector<std::byte> stored_bytes(const Tensor& t) { return nn::to_record("t", t).data; }

/// y = x @ w^T + b plus an int64 buffer: enough state to exercise module checkpoints.
class Affine : public nn::Module {
 public:
  Affine(int64_t in, int64_t out) : Module("Affine") {
    weight = register_parameter("weight", randn({out, in}));
    bias = register_parameter("bias", randn({out}));
    steps = register_buffer("steps", full({}, 7, DType::Int64));
  }
  Tensor weight, bias, steps;
};

class Net : public nn::Module {
 public:
  explicit Net(int64_t hidden = 4) : Module("Net") {
    first = register_module("first", std::make_shared<Affine>(3, hidden));
    second = register_module("second", std::make_shared<Affine>(hidden, 2));
  }
  std::shared_ptr<Affine> first, second;
};

}  // namespace

TEST_CASE("to_record copies any view contiguously; from_record rebuilds it") {
  Tensor base = arange(6, DType::Float64).view({2, 3});
  TensorRecord record = nn::to_record("x", base.t());  // [3, 2] with strides [1, 3]
  CHECK(record.name == "x");
  CHECK(record.dtype == DType::Float64);
  CHECK(record.shape == Shape{3, 2});
  // The transpose of [[0, 1, 2], [3, 4, 5]] in row-major order.
  CHECK(record.data == nn::to_record("y", testing::f64({0, 3, 1, 4, 2, 5}, {3, 2})).data);
  check_close(nn::from_record(record), base.t(), 0, 0);

  TensorRecord wrong = record;
  wrong.data.resize(8);
  CHECK_THROWS_WITH_AS(nn::from_record(wrong), "from_record: tensor 'x' has 8 bytes, but shape [3, 2] of float64 needs 48",
                       Error);
}

TEST_CASE("save_tensors then load_tensors is bit-exact for every dtype, views included") {
  TempDir dir;
  const std::filesystem::path path = dir.path / "tensors.safetensors";
  // Values whose bits matter: a NaN with a payload, -0.0, a denormal, infinities, int64 extremes.
  const float nan_payload = std::bit_cast<float>(uint32_t{0x7fc12345});
  Tensor f32 = from_vector<float>({1.5f, -0.0f, nan_payload, 1e-45f, -3.25f, INFINITY}, {2, 3});
  Tensor f64 = randn({4, 5}, DType::Float64);
  Tensor i64 = from_vector<int64_t>({0, -1, INT64_MAX, INT64_MIN}, {4});
  Tensor mask = from_vector<bool>({true, false, false, true, true, false}, {3, 2});
  const nn::StateDict saved = {
      {"f32", f32},
      {"f64", f64},
      {"i64", i64},
      {"mask", mask},
      {"scalar", scalar_tensor(2.5, DType::Float64)},
      {"empty", zeros({0, 3})},
      {"f32.transposed", f32.t()},                      // [3, 2], strides [1, 3]
      {"f64.strided", f64.slice(1, 0, 5, 2)},           // [4, 3], every other column
      {"i64.expanded", i64.unsqueeze(0).expand({2, 4})},  // stride 0
      {"mask.column", mask.select(1, 1)},               // [3], offset 1
      {"requires_grad", randn({2}).set_requires_grad()},
  };
  const SafetensorsMetadata metadata = {{"step", "12"}, {"config", R"({"d_model": 16})"}};
  nn::save_tensors(path, saved, metadata);

  const nn::TensorFile loaded = nn::load_tensors(path);
  CHECK(loaded.metadata == metadata);
  REQUIRE(loaded.tensors.size() == saved.size());
  for (const nn::NamedTensor& want : saved) {
    CAPTURE(want.name);
    const Tensor* got = nn::find(loaded.tensors, want.name);
    REQUIRE(got != nullptr);
    CHECK(got->dtype() == want.tensor.dtype());
    CHECK(got->shape() == want.tensor.shape());
    CHECK(got->is_contiguous());
    CHECK_FALSE(got->requires_grad());
    CHECK(stored_bytes(*got) == stored_bytes(want.tensor));
  }
  // Element by element for the views, independently of to_record.
  CHECK(nn::find(loaded.tensors, "f64.strided")->at<double>({3, 2}) == f64.at<double>({3, 4}));
  CHECK(nn::find(loaded.tensors, "i64.expanded")->to_vector<int64_t>() ==
        std::vector<int64_t>{0, -1, INT64_MAX, INT64_MIN, 0, -1, INT64_MAX, INT64_MIN});
  CHECK(nn::find(loaded.tensors, "mask.column")->to_vector<bool>() == std::vector<bool>{false, true, false});
  CHECK(std::bit_cast<uint32_t>(nn::find(loaded.tensors, "f32.transposed")->at<float>({2, 0})) == 0x7fc12345);

  SUBCASE("the file is what core/safetensors writes for the same records") {
    std::vector<TensorRecord> records;
    for (const nn::NamedTensor& entry : saved) records.push_back(nn::to_record(entry.name, entry.tensor));
    const std::vector<std::byte> expected = serialize_safetensors(records, metadata);
    const std::string file = read_bytes(path);
    CHECK(file.size() == expected.size());
    CHECK(std::memcmp(file.data(), expected.data(), expected.size()) == 0);
  }
}

TEST_CASE("modules save and load their parameters and buffers") {
  TempDir dir;
  const std::filesystem::path path = dir.path / "net.safetensors";
  Net source;
  source.first->steps.fill_(41);
  nn::save(source, path, {{"epoch", "3"}});
  CHECK(nn::load_tensors(path).metadata == SafetensorsMetadata{{"epoch", "3"}});

  Net target;
  Tensor held = target.first->weight;  // a handle taken before loading sees the values
  const nn::LoadReport report = nn::load(target, path);
  CHECK(report.ok());
  for (const nn::NamedTensor& want : source.state_dict()) {
    CAPTURE(want.name);
    CHECK(stored_bytes(*nn::find(target.state_dict(), want.name)) == stored_bytes(want.tensor));
  }
  CHECK(stored_bytes(held) == stored_bytes(source.first->weight));
  CHECK(target.first->steps.item<int64_t>() == 41);
  CHECK(target.first->weight.requires_grad());
}

TEST_CASE("corrupt checkpoints raise mf::Error naming the file and the fault") {
  TempDir dir;
  const std::filesystem::path good = dir.path / "good.safetensors";
  nn::save_tensors(good, {{"a", from_vector<float>({1, 2}, {2})}, {"b", from_vector<float>({3, 4}, {2})}});
  const std::string file = read_bytes(good);
  // What the writer lays out: both F32, so by name; a at [0, 8), b at [8, 16).
  const std::string header = header_of(file);
  REQUIRE(header.find(R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]})") != std::string::npos);
  std::string huge_size = file;
  const uint64_t too_big = file.size() + 100;
  std::memcpy(huge_size.data(), &too_big, 8);

  struct Case {
    std::string what, bytes, message;
  };
  const std::vector<Case> cases = {
      {"truncated data", file.substr(0, file.size() - 3), "end past the 13-byte data buffer (truncated file?)"},
      {"truncated header", file.substr(0, 20), "runs past the end of the 20-byte file (truncated)"},
      {"truncated size field", file.substr(0, 5), "shorter than the 8-byte header size field (truncated)"},
      {"header size beyond the file", huge_size, "runs past the end of the"},
      {"bad JSON", with_header(file, replaced(header, R"("a":)", R"("a" )")), "header is not valid JSON"},
      {"unknown dtype", with_header(file, replaced(header, R"("dtype":"F32")", R"("dtype":"F31")")),
       "tensor 'a' has unknown dtype \"F31\""},
      {"offsets out of range",
       with_header(file, replaced(header, R"("shape":[2],"data_offsets":[8,16])", R"("shape":[4],"data_offsets":[8,24])")),
       "tensor 'b': data_offsets [8, 24] end past the 16-byte data buffer"},
      {"overlapping offsets", with_header(file, replaced(header, "[8,16]", "[4,12]")),
       "tensor 'b' (data_offsets [4, 12]) overlaps tensor 'a' ([0, 8])"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const std::filesystem::path path = dir.path / "bad.safetensors";
    write_bytes(path, c.bytes);
    const std::string prefix = "safetensors file '" + path.string() + "': ";
    CHECK_THROWS_WITH_AS(nn::load_tensors(path), doctest::Contains((prefix).c_str()), Error);
    CHECK_THROWS_WITH_AS(nn::load_tensors(path), doctest::Contains(c.message.c_str()), Error);
  }
  CHECK(nn::load_tensors(good).tensors.size() == 2);  // the edits were all that was wrong
}

TEST_CASE("an empty tensor whose other sizes overflow int64 is refused with the file and tensor named") {
  // Found with fuzz_safetensors: valid safetensors (no bytes for an empty tensor), but its strides as a
  // tensor overflow int64.
  TempDir dir;
  const std::filesystem::path path = dir.path / "empty_huge.safetensors";
  const std::string header = R"({"e":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})";
  std::string bytes(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  write_bytes(path, bytes + header);
  CHECK(read_safetensors(path).records.at(0).shape == std::vector<int64_t>{0, 4294967296, 4294967296});
  CHECK_THROWS_WITH_AS(nn::load_tensors(path),
                       doctest::Contains(("cannot load '" + path.string() + "': from_record: tensor 'e': shape [0, "
                                          "4294967296, 4294967296] has too many elements").c_str()),
                       Error);
}

TEST_CASE("a checkpoint that does not match the model is refused with every problem listed") {
  TempDir dir;
  const std::filesystem::path path = dir.path / "net.safetensors";
  Net source;
  nn::StateDict state = source.state_dict();
  const std::string prefix = "cannot load checkpoint '" + path.string() + "': ";

  SUBCASE("missing and unexpected keys, strict and not") {
    state.erase(state.begin());  // first.weight
    state.push_back({"third.weight", zeros({1})});
    nn::save_tensors(path, state);
    Net target;
    const Tensor before = target.first->bias.clone();
    const std::string message = prefix +
                                "load_state_dict: the state does not match Net:\n  missing key: first.weight\n"
                                "  unexpected key: third.weight";
    CHECK_THROWS_WITH_AS(nn::load(target, path), message.c_str(), Error);
    check_close(target.first->bias, before, 0, 0);  // nothing loaded

    const nn::LoadReport report = nn::load(target, path, /*strict=*/false);
    CHECK(report.missing == std::vector<std::string>{"first.weight"});
    CHECK(report.unexpected == std::vector<std::string>{"third.weight"});
    CHECK(report.mismatched.empty());
    check_close(target.first->bias, source.first->bias, 0, 0);  // the matching keys did load
  }
  SUBCASE("a shape mismatch names both shapes") {
    nn::save(source, path);
    Net wider(5);
    CHECK_THROWS_WITH_AS(nn::load(wider, path), doctest::Contains(prefix.c_str()), Error);
    CHECK_THROWS_WITH_AS(nn::load(wider, path),
                         doctest::Contains("mismatched: first.weight: checkpoint has [4, 3] float32, model has [5, 3] "
                                           "float32\n  mismatched: first.bias: checkpoint has [4] float32, model has "
                                           "[5] float32\n  mismatched: second.weight: checkpoint has [2, 4] float32, "
                                           "model has [2, 5] float32"),
                         Error);
  }
  SUBCASE("a dtype mismatch names both dtypes") {
    nn::save(source, path);
    Net doubled;
    doubled.to(DType::Float64);
    CHECK_THROWS_WITH_AS(nn::load(doubled, path),
                         doctest::Contains("mismatched: second.bias: checkpoint has [2] float32, model has [2] float64"),
                         Error);
    const nn::LoadReport report = nn::load(doubled, path, /*strict=*/false);
    CHECK(report.mismatched.size() == 4);  // the int64 buffers still match
    CHECK(report.missing.empty());
  }
}

TEST_CASE("a failed save leaves the previous checkpoint intact") {
  TempDir dir;
  const std::filesystem::path path = dir.path / "net.safetensors";
  Net net;
  nn::save(net, path);
  const std::string before = read_bytes(path);

  SUBCASE("saving into a directory that was removed fails clearly") {
    const std::filesystem::path gone = dir.path / "run2";
    std::filesystem::create_directories(gone);
    std::filesystem::remove(gone);
    const std::string message = "cannot write safetensors file '" + (gone / "net.safetensors").string() + "'";
    CHECK_THROWS_WITH_AS(nn::save(net, gone / "net.safetensors"), doctest::Contains(message.c_str()), Error);
    CHECK(read_bytes(path) == before);
  }
  SUBCASE("a save that fails midway over the same path") {
    // As in test_safetensors: a file-size limit makes the temporary file's writes fail (EFBIG) after
    // 4 KiB, which also happens for root.
    struct Big : nn::Module {
      Big() : Module("Big") { register_parameter("w", zeros({100000}, DType::Float64)); }
    } big;
    rlimit saved{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
    rlimit limited = saved;
    limited.rlim_cur = 4096;
    auto* previous_handler = std::signal(SIGXFSZ, SIG_IGN);
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &limited) == 0);
    std::string message;
    try {
      nn::save(big, path);
    } catch (const Error& e) {
      message = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, previous_handler);
    CHECK(message.find("cannot write safetensors file '" + path.string() + "'") == 0);
    CHECK(read_bytes(path) == before);
    Net reloaded;
    CHECK(nn::load(reloaded, path).ok());
  }
}

TEST_CASE("loads the PyTorch reference checkpoint's parameters into a StateDict") {
  // A copy of ../shared/reference/transformer_tiny.safetensors (tests/data/README.md).
  const nn::TensorFile file = nn::load_tensors("tests/data/transformer_tiny.safetensors");
  CHECK(file.tensors.size() == 440);
  nn::StateDict params;
  const std::string prefix = "param.";
  for (const nn::NamedTensor& entry : file.tensors)
    if (entry.name.starts_with(prefix)) params.push_back({entry.name.substr(prefix.size()), entry.tensor});
  // embed 1 + 2 encoder layers x 16 (4 projections, 2 linears, 2 norms, each weight + bias)
  // + 2 decoder layers x 26 (8 projections, 2 linears, 3 norms).
  CHECK(params.size() == 85);

  const Tensor* embed = nn::find(params, "embed.weight");
  REQUIRE(embed != nullptr);
  CHECK(embed->shape() == Shape{13, 16});
  CHECK(embed->dtype() == DType::Float64);
  // Values read with Python's struct module from the same file.
  CHECK(embed->at<double>({0, 0}) == -0.009578713142485437);
  CHECK(embed->at<double>({0, 2}) == -0.033069609445789135);
  const Tensor* norm3 = nn::find(params, "decoder.layers.1.norm3.bias");
  REQUIRE(norm3 != nullptr);
  CHECK(norm3->at<double>({15}) == -0.15767025252279476);
  CHECK(nn::find(file.tensors, "input.tgt_out")->to_vector<int64_t>() ==
        std::vector<int64_t>{4, 10, 6, 7, 8, 2, 9, 5, 12, 2, 0, 0, 3, 2, 0, 0, 0, 0});
  CHECK(file.metadata.at("config").find(R"("d_model": 16)") != std::string::npos);
}
