#include <doctest/doctest.h>

#include "helpers.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>
#include <string>

using namespace mf;

namespace {

/// 0, 1, ..., n-1 as a 1-D tensor of `dtype` (arange is not needed for this).
Tensor iota(int64_t n, DType dtype) {
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = static_cast<double>(i);
  return from_vector(values).to(dtype);
}

}  // namespace

TEST_CASE("device names parse and print") {
  CHECK(mf::Device::parse("cpu") == mf::Device::cpu());
  CHECK(mf::Device::parse("cuda:1").str() == "cuda:1");
  CHECK_THROWS_WITH_AS(mf::Device::parse("tpu"), "unknown device 'tpu' (expected cpu, cuda or cuda:N)", mf::Error);
}

// Expected strings are what PyTorch prints for the same tensors (with "dtype=float64" for its
// "dtype=torch.float64" and "AddBackward" for "AddBackward0").
TEST_CASE("printing: floats get 4 decimals in aligned columns") {
  Tensor t = from_vector(std::vector<float>{1, 2.5, -3, 4}, {2, 2});
  CHECK(fmt::format("{}", t) ==
        "tensor([[ 1.0000,  2.5000],\n"
        "        [-3.0000,  4.0000]])");
  CHECK(to_string(scalar_tensor(3.5)) == "tensor(3.5000)");
  std::ostringstream out;
  out << tensor({0.25, -1});
  CHECK(out.str() == "tensor([ 0.2500, -1.0000])");
}

TEST_CASE("printing: whole-number floats, integers and bools print plainly") {
  CHECK(to_string(tensor({1, 2, 3})) == "tensor([1., 2., 3.])");
  CHECK(to_string(zeros({2, 2, 2})) ==
        "tensor([[[0., 0.],\n"
        "         [0., 0.]],\n"
        "\n"
        "        [[0., 0.],\n"
        "         [0., 0.]]])");
  CHECK(to_string(iota(12, DType::Int64).view({3, 4})) ==
        "tensor([[ 0,  1,  2,  3],\n"
        "        [ 4,  5,  6,  7],\n"
        "        [ 8,  9, 10, 11]])");
  CHECK(to_string(from_vector(std::vector<bool>{true, false})) == "tensor([ True, False])");
}

TEST_CASE("printing: scientific notation for wide or tiny magnitudes") {
  // max / min > 1000 switches to %.4e, as does anything below 1e-4.
  CHECK(to_string(tensor({1e-5, 1.0})) == "tensor([1.0000e-05, 1.0000e+00])");
  CHECK(to_string(tensor({1e10, 1.0})) == "tensor([1.0000e+10, 1.0000e+00])");
  CHECK(to_string(tensor({100, 0.5})) == "tensor([100.0000,   0.5000])");
}

TEST_CASE("printing: non-finite values take the column width but not the notation") {
  double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(to_string(tensor({nan, 1.5, -inf})) == "tensor([   nan, 1.5000,   -inf])");
  CHECK(to_string(tensor({nan, 1})) == "tensor([nan, 1.])");
  // A NaN with its sign bit set (as 0 * inf gives on x86) prints as Python prints it: "nan".
  CHECK(to_string(tensor({-nan, 1.5})) == "tensor([   nan, 1.5000])");
  CHECK(to_string(from_vector(std::vector<float>{-std::numeric_limits<float>::quiet_NaN()}, {1})) == "tensor([nan])");
}

TEST_CASE("messages print a NaN as nan whatever its sign bit; infinities keep theirs") {
  double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  REQUIRE(fmt::format("{}", -nan) == "-nan");  // what fmt itself prints, and what readable() undoes
  CHECK(format_message("loss {} {:.3f} {} {}", -nan, -static_cast<float>(nan), inf, -inf) == "loss nan nan inf -inf");
  CHECK(format_message("{:>6}|{}|{}", -nan, std::string("text"), 7) == "   nan|text|7");
  CHECK(std::signbit(-nan));
  CHECK(!std::signbit(readable(-nan)));
  CHECK(readable(-2.5) == -2.5);
  CHECK(readable(int64_t{-3}) == -3);
  // fail() and so MF_CHECK format alike.
  CHECK_THROWS_WITH_AS(fail("the norm is {}", -nan), "the norm is nan", mf::Error);
}

TEST_CASE("cpu_has_avx512_bf16 and cpu_has_avx512_vnni agree with the kernel's flags in /proc/cpuinfo") {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line) && !line.starts_with("flags")) {
  }
  if (line.empty()) {
    MESSAGE("skipped: /proc/cpuinfo lists no flags");
    return;
  }
  std::istringstream words(line);
  std::set<std::string> flags{std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
  CHECK(cpu_has_avx512_bf16() == (flags.count("avx512f") && flags.count("avx512bw") && flags.count("avx512_bf16")));
  CHECK(cpu_has_avx512_vnni() == (flags.count("avx512f") && flags.count("avx512bw") && flags.count("avx512_vnni")));
  MESSAGE("AVX512-BF16: ", cpu_has_avx512_bf16(), ", AVX512-VNNI: ", cpu_has_avx512_vnni());
}

TEST_CASE("cpu_has_fast_avx512_bf16 holds on AMD's CPUs with AVX512-BF16 and on no other vendor's") {
  // The rule core/isa.h states, against the vendor /proc/cpuinfo names: AMD's cores run vdpbf16ps at
  // twice the float32 FMA's rate, Intel's Emerald Rapids at half (BENCHMARKS.md).
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, vendor;
  while (std::getline(cpuinfo, line))
    if (line.starts_with("vendor_id")) {
      vendor = line.substr(line.find(':') + 2);
      break;
    }
  if (vendor.empty()) {
    MESSAGE("skipped: /proc/cpuinfo names no vendor");
    return;
  }
  CHECK(cpu_has_fast_avx512_bf16() == (cpu_has_avx512_bf16() && vendor == "AuthenticAMD"));
  MESSAGE(vendor, ": vdpbf16ps chosen for the bfloat16 GEMM: ", cpu_has_fast_avx512_bf16());
}

TEST_CASE("cpu_model_name names the first processor with its family and model numbers") {
  // Laid out as Linux writes /proc/cpuinfo: tab-padded keys, one block per processor; "model" is not
  // "model name".
  std::istringstream two_processors(
      "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
      "model name\t: AMD EPYC\nstepping\t: 1\n\n"
      "processor\t: 1\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: Another CPU\n");
  CHECK(detail::cpu_model_name_from(two_processors) == "AMD EPYC (family 26, model 2)");
  std::istringstream without_numbers("processor\t: 0\nmodel name\t: Some CPU\n");
  CHECK(detail::cpu_model_name_from(without_numbers) == "Some CPU");
  std::istringstream empty("");
  CHECK(detail::cpu_model_name_from(empty) == "unknown CPU");
  MESSAGE("this CPU: ", cpu_model_name());
}

TEST_CASE("MINIFLOW_ISA narrows the kernel path and never widens it") {
  using detail::resolve_isa_request;
  for (Isa cpu : {Isa::baseline, Isa::avx2, Isa::avx512}) {
    CAPTURE(isa_name(cpu));
    CHECK(resolve_isa_request("", cpu).isa == cpu);
    CHECK(resolve_isa_request("", cpu).warning.empty());
    CHECK(resolve_isa_request("baseline", cpu).isa == Isa::baseline);
    CHECK(resolve_isa_request(isa_name(cpu), cpu).isa == cpu);
    CHECK(resolve_isa_request(isa_name(cpu), cpu).warning.empty());
    auto unknown = resolve_isa_request("sse9", cpu);
    CHECK(unknown.isa == cpu);
    CHECK(unknown.warning == fmt::format("MINIFLOW_ISA='sse9' is not one of avx512, avx2, baseline; using {}",
                                         isa_name(cpu)));
  }
  CHECK(resolve_isa_request("avx2", Isa::avx512).isa == Isa::avx2);
  auto wider = resolve_isa_request("avx512", Isa::avx2);
  CHECK(wider.isa == Isa::avx2);
  CHECK(wider.warning == "MINIFLOW_ISA=avx512 asks for more than this CPU runs; using avx2");
  CHECK(resolve_isa_request("AVX2", Isa::avx512).isa == Isa::avx512);  // names are lower case, as printed

  // This process: CI runs the suites with MINIFLOW_ISA set, and this holds kernel_isa() to it.
  const char* requested = std::getenv("MINIFLOW_ISA");
  CHECK(kernel_isa() == resolve_isa_request(requested ? requested : "", cpu_isa()).isa);
  CHECK(kernel_isa() <= cpu_isa());
  CHECK(describe_kernel_isa().starts_with(fmt::format("kernels {} (", isa_name(kernel_isa()))));
}

TEST_CASE("printing: strided views read through their strides") {
  Tensor t = iota(6, DType::Int64).view({2, 3}).t();  // [3, 2], strides [1, 3]
  CHECK(to_string(t) ==
        "tensor([[0, 3],\n"
        "        [1, 4],\n"
        "        [2, 5]])");
  CHECK(to_string(iota(10, DType::Int64).slice(0, 1, 10, 4)) == "tensor([1, 5, 9])");
}

TEST_CASE("printing: suffixes name non-default dtype, autograd state") {
  CHECK(to_string(tensor({1, 2}, DType::Float64)) == "tensor([1., 2.], dtype=float64)");
  CHECK(to_string(tensor({1, 2}, DType::Int64)) == "tensor([1, 2])");
  Tensor x = ones({2}).set_requires_grad();
  CHECK(to_string(x) == "tensor([1., 1.], requires_grad=True)");
  CHECK(to_string(x + x) == "tensor([2., 2.], grad_fn=<AddBackward>)");
  CHECK(to_string((x + x).detach()) == "tensor([2., 2.])");
}

TEST_CASE("printing: empty and undefined tensors") {
  CHECK(to_string(zeros({0})) == "tensor([])");
  CHECK(to_string(zeros({0, 3})) == "tensor([], size=(0, 3))");
  CHECK(to_string(zeros({0}, DType::Int64)) == "tensor([], dtype=int64)");
  CHECK(to_string(Tensor()) == "tensor(undefined)");
}

TEST_CASE("printing: over 1000 elements elides the middle of every dim") {
  CHECK(to_string(iota(2000, DType::Int64)) == "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
  CHECK(to_string(iota(1000, DType::Int64)).find("...") == std::string::npos);  // 1000 is not over the threshold
  CHECK(to_string(iota(2000, DType::Int64).view({40, 50})) ==
        "tensor([[   0,    1,    2,  ...,   47,   48,   49],\n"
        "        [  50,   51,   52,  ...,   97,   98,   99],\n"
        "        [ 100,  101,  102,  ...,  147,  148,  149],\n"
        "        ...,\n"
        "        [1850, 1851, 1852,  ..., 1897, 1898, 1899],\n"
        "        [1900, 1901, 1902,  ..., 1947, 1948, 1949],\n"
        "        [1950, 1951, 1952,  ..., 1997, 1998, 1999]])");
}

TEST_CASE("printing: long rows wrap at 80 columns") {
  // Width 6 + ", " per element: (80 - 7) / 8 = 9 elements per line.
  Tensor t = iota(12, DType::Float64).div(scalar_tensor(7.0, DType::Float64));
  CHECK(to_string(t) ==
        "tensor([0.0000, 0.1429, 0.2857, 0.4286, 0.5714, 0.7143, 0.8571, 1.0000, 1.1429,\n"
        "        1.2857, 1.4286, 1.5714], dtype=float64)");
  // A suffix that would pass column 80 goes on its own line.
  CHECK(to_string(t.slice(0, 0, 9)) ==
        "tensor([0.0000, 0.1429, 0.2857, 0.4286, 0.5714, 0.7143, 0.8571, 1.0000, 1.1429],\n"
        "       dtype=float64)");
}
