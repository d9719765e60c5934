// miniflow's float GEMM (ops/cpu/sgemm_kernel.inc) against naive loops in double, on each of its
// paths this CPU runs, and its AVX2 path against its AVX-512 one bit for bit.
#include "ops/cpu/sgemm.h"

#include "core/dtype.h"
#include "core/isa.h"
#include "miniflow.h"
#include "ops/cpu/gemm_bf16.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

namespace {

struct Operand {
  std::vector<float> values;
  int64_t ld;
};

/// A rows x cols row-major matrix with rows `ld = cols + padding` apart (a strided view, as BLAS sees
/// one); the padding holds `filler`.
Operand random_matrix(int64_t rows, int64_t cols, int64_t padding, float filler, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1, 1);
  Operand m{std::vector<float>(static_cast<size_t>(rows * (cols + padding))), cols + padding};
  for (size_t i = 0; i < m.values.size(); ++i)
    m.values[i] = static_cast<int64_t>(i) % m.ld < cols ? uniform(rng) : filler;
  return m;
}

}  // namespace

/// The ISA paths of miniflow's GEMM that kernel_isa() allows, widest first.
std::vector<mf::Isa> gemm_paths() {
  std::vector<mf::Isa> paths;
  for (mf::Isa isa : {mf::Isa::avx512, mf::Isa::avx2})
    if (isa <= mf::kernel_isa()) paths.push_back(isa);
  return paths;
}

TEST_CASE("miniflow's float GEMM equals naive loops over its blocks and edges, on each ISA path") {
  // The shapes cross every boundary of the kernel's loops: strips of 12 rows (6 on AVX2), panels of
  // 32 columns (16), the last one narrower than a vector and wider, blocks of 96 rows (A^T), 512 values of k and
  // 1 MiB of packed B (33000 columns at k = 8; 600 columns at k = 530, with two blocks of k), each
  // with a remainder, A^T packed whole across such column blocks (over one block of rows and two),
  // plus k = 0 and single elements; with both operands plain or transposed, their
  // rows packed tight or with NaN between them (which a read past a row would carry into C).
  // beta = 0 must overwrite C without reading it (C starts as NaN), other betas scale it; a bias,
  // where given, adds one value per column; relu, where asked, clamps the finished sum.
  if (gemm_paths().empty()) {
    // Declined exactly when the kernel path is narrower than AVX2 (the CPU's or MINIFLOW_ISA's).
    float x = 1, y = 2, z = 0;
    CHECK_FALSE(mf::cpu::sgemm(false, false, 1, 1, 1, &x, 1, &y, 1, &z, 1));
    MESSAGE(fmt::format("skipped: kernels {}, so float products go to OpenBLAS", mf::isa_name(mf::kernel_isa())));
    return;
  }
  std::mt19937 rng(7);
  float nan = std::numeric_limits<float>::quiet_NaN();
  for (mf::Isa isa : gemm_paths())
  for (auto [n, m, k] : {std::array<int64_t, 3>{1, 1, 1}, std::array<int64_t, 3>{12, 32, 16},
                         std::array<int64_t, 3>{13, 33, 17}, std::array<int64_t, 3>{97, 70, 530},
                         std::array<int64_t, 3>{200, 45, 3}, std::array<int64_t, 3>{3, 33000, 8},
                         std::array<int64_t, 3>{13, 600, 530}, std::array<int64_t, 3>{25, 50, 40},
                         std::array<int64_t, 3>{5, 7, 1100}, std::array<int64_t, 3>{100, 520, 515},
                         std::array<int64_t, 3>{4, 5, 0}})
    for (int64_t padding : {0, 3})
      for (bool trans_a : {false, true})
        for (bool trans_b : {false, true})
          for (auto [alpha, beta, with_bias, relu] :
               {std::array<float, 4>{1, 0, 0, 0}, std::array<float, 4>{1, 1, 0, 0},
                std::array<float, 4>{0.5f, -2, 0, 0}, std::array<float, 4>{1, 0, 1, 0},
                std::array<float, 4>{0.5f, 1, 1, 0}, std::array<float, 4>{1, 0, 1, 1},
                std::array<float, 4>{0.5f, 1, 0, 1}}) {
            CAPTURE(mf::isa_name(isa));
            CAPTURE(padding);
            CAPTURE(n);
            CAPTURE(m);
            CAPTURE(k);
            CAPTURE(trans_a);
            CAPTURE(trans_b);
            CAPTURE(alpha);
            CAPTURE(beta);
            CAPTURE(with_bias);
            CAPTURE(relu);
            Operand a = trans_a ? random_matrix(k, n, padding, nan, rng) : random_matrix(n, k, padding, nan, rng);
            Operand b = trans_b ? random_matrix(m, k, padding, nan, rng) : random_matrix(k, m, padding, nan, rng);
            Operand c = random_matrix(n, m, padding, 2.5f, rng), bias = random_matrix(1, m, 0, 0, rng);
            if (beta == 0) std::fill(c.values.begin(), c.values.end(), nan);
            std::vector<float> before = c.values;
            const mf::cpu::GemmEpilogue<float> epilogue{
                .alpha = alpha, .beta = beta, .bias = with_bias ? bias.values.data() : nullptr, .relu = relu != 0};
            REQUIRE(mf::cpu::detail::sgemm_on(isa, trans_a, trans_b, n, m, k, a.values.data(), a.ld, b.values.data(),
                                              b.ld, c.values.data(), c.ld, epilogue));
            auto at = [&](int64_t i, int64_t p) { return double{a.values[trans_a ? p * a.ld + i : i * a.ld + p]}; };
            auto bt = [&](int64_t p, int64_t j) { return double{b.values[trans_b ? j * b.ld + p : p * b.ld + j]}; };
            int64_t wrong = 0;  // elements off by more than float's rounding bound, k eps sum |a b| (+ beta's)
            for (int64_t i = 0; i < n; ++i)
              for (int64_t j = 0; j < m; ++j) {
                double sum = 0, magnitude = 0;
                for (int64_t p = 0; p < k; ++p) {
                  sum += at(i, p) * bt(p, j);
                  magnitude += std::abs(at(i, p) * bt(p, j));
                }
                double scaled_old = beta == 0 ? 0 : beta * double{before[static_cast<size_t>(i * c.ld + j)]};
                double added = with_bias ? double{bias.values[static_cast<size_t>(j)]} : 0;
                double expected = alpha * sum + scaled_old + added;
                if (relu != 0) expected = std::max(expected, 0.0);  // after the last block of k only
                double bound =
                    1e-7 * (static_cast<double>(k + 3) * magnitude + std::abs(scaled_old) + std::abs(added)) + 1e-30;
                wrong += !(std::abs(c.values[static_cast<size_t>(i * c.ld + j)] - expected) <= bound);  // NaN too
              }
            CHECK(wrong == 0);
            for (int64_t i = 0; i < n; ++i)  // the padding between rows of C is left alone
              for (int64_t j = m; j < c.ld; ++j) {
                size_t at = static_cast<size_t>(i * c.ld + j);
                CHECK((c.values[at] == before[at] || (std::isnan(c.values[at]) && std::isnan(before[at]))));
              }
          }
}

TEST_CASE("a weight packed once gives sgemm's bits, whole or split by columns or rows, on each path") {
  // sgemm_packed runs sgemm's tiles over panels packed up front: every element must come out as sgemm
  // computes it from the unpacked weight (c = a w^T), whichever share of columns (starting on a panel)
  // or rows a thread takes. Shapes cross strips, panels, the last partial panel, two blocks of k and
  // several blocks of columns, with rows that fit the panel-outer order and (300 x 300) rows that do
  // not; epilogues as sgemm's test; beta = 0 starts C as NaN.
  if (gemm_paths().empty()) {
    mf::cpu::PackedSgemmWeight w(2, 2, std::vector<float>(4, 1).data(), 2);
    CHECK_FALSE(w.usable());
    MESSAGE(fmt::format("skipped: kernels {}, so float products go to OpenBLAS", mf::isa_name(mf::kernel_isa())));
    return;
  }
  std::mt19937 rng(13);
  float nan = std::numeric_limits<float>::quiet_NaN();
  for (mf::Isa isa : gemm_paths())
    for (auto [n, m, k] : {std::array<int64_t, 3>{1, 1, 1}, std::array<int64_t, 3>{13, 33, 17},
                           std::array<int64_t, 3>{40, 8000, 64}, std::array<int64_t, 3>{97, 70, 530},
                           std::array<int64_t, 3>{7, 600, 1100}, std::array<int64_t, 3>{300, 70, 300},
                           std::array<int64_t, 3>{4, 5, 0}})
      for (auto [alpha, beta, with_bias, relu] : {std::array<float, 4>{1, 0, 0, 0}, std::array<float, 4>{1, 0, 1, 1},
                                                  std::array<float, 4>{0.5f, 1, 1, 0}}) {
        CAPTURE(mf::isa_name(isa));
        CAPTURE(n);
        CAPTURE(m);
        CAPTURE(k);
        CAPTURE(beta);
        Operand a = random_matrix(n, k, 2, nan, rng), w = random_matrix(m, k, 3, nan, rng);
        Operand bias = random_matrix(1, m, 0, 0, rng), start = random_matrix(n, m, 1, 2.5f, rng);
        if (beta == 0) std::fill(start.values.begin(), start.values.end(), nan);
        const mf::cpu::GemmEpilogue<float> epilogue{
            .alpha = alpha, .beta = beta, .bias = with_bias ? bias.values.data() : nullptr, .relu = relu != 0};
        Operand want = start;
        REQUIRE(mf::cpu::detail::sgemm_on(isa, false, true, n, m, k, a.values.data(), a.ld, w.values.data(), w.ld,
                                          want.values.data(), want.ld, epilogue));
        const mf::cpu::PackedSgemmWeight packed(m, k, w.values.data(), w.ld, isa);
        REQUIRE(packed.usable());
        const int64_t panel = packed.panel_columns(), split_column = std::min(m, 2 * panel), split_row = n / 2;
        Operand whole = start, by_columns = start, by_rows = start;
        mf::cpu::sgemm_packed(n, 0, m, a.values.data(), a.ld, packed, whole.values.data(), whole.ld, epilogue);
        for (auto [first, last] : {std::pair{int64_t{0}, split_column}, std::pair{split_column, m}})
          mf::cpu::sgemm_packed(n, first, last, a.values.data(), a.ld, packed, by_columns.values.data(), by_columns.ld,
                                epilogue);
        mf::cpu::sgemm_packed(split_row, 0, m, a.values.data(), a.ld, packed, by_rows.values.data(), by_rows.ld,
                              epilogue);
        mf::cpu::sgemm_packed(n - split_row, 0, m, a.values.data() + split_row * a.ld, a.ld, packed,
                              by_rows.values.data() + split_row * by_rows.ld, by_rows.ld, epilogue);
        for (const Operand* got : {&whole, &by_columns, &by_rows})
          CHECK(std::memcmp(got->values.data(), want.values.data(), want.values.size() * sizeof(float)) == 0);
      }
}

TEST_CASE("linear and matmul under NoGradGuard run on weights packed once, with the bits of a plain product") {
  // Without grad mode a float product against a weight's transpose packs the weight at its second
  // call and reuses the packing while the weight is unchanged (ops/packed_weights.h). Results must be those
  // of the product in grad mode, which packs on every call; a weight written in place must be packed
  // anew, its next product following the new values. 40 rows: past the skinny kernel's 32.
  mf::manual_seed(3);
  mf::Tensor x = mf::randn({40, 70}), weight = mf::randn({300, 70}), bias = mf::randn({300});
  mf::Tensor plain = mf::linear(x, weight, bias), plain_matmul = mf::matmul(x, weight.t());
  auto same_bits = [](const mf::Tensor& a, const mf::Tensor& b) {
    return a.to_vector<float>() == b.to_vector<float>();
  };
  mf::Tensor doubled;
  {
    mf::NoGradGuard no_grad;
    for (int call = 0; call < 3; ++call) {  // unpacked, packed, the packing reused
      CHECK(same_bits(mf::linear(x, weight, bias), plain));
      CHECK(same_bits(mf::matmul(x, weight.t()), plain_matmul));
    }
    weight.mul_(2.0);
    mf::linear(x, weight, bias);  // the written weight met anew: unpacked
    doubled = mf::linear(x, weight, bias);
  }
  CHECK(same_bits(doubled, mf::linear(x, weight, bias)));  // in grad mode: packed on the call
  CHECK_FALSE(same_bits(doubled, plain));
}

TEST_CASE("miniflow's GEMM gives the same bits on its AVX2 path as on its AVX-512 path") {
  // Each element of C is one chain of FMAs over k in order per block of k, on either path (the tiles
  // differ: 12 x 32 against 6 x 16), so a training step's products do not depend on the CPU. The
  // shapes put elements in different tiles and edges on the two paths and span two blocks of k.
  if (mf::kernel_isa() != mf::Isa::avx512) {
    MESSAGE(fmt::format("skipped: kernels {}, so only one path runs here", mf::isa_name(mf::kernel_isa())));
    return;
  }
  std::mt19937 rng(11);
  for (auto [n, m, k] : {std::array<int64_t, 3>{37, 75, 600}, std::array<int64_t, 3>{200, 130, 64},
                         std::array<int64_t, 3>{5, 3000, 40}})
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true})
        for (auto [beta, with_bias, relu] : {std::array<int, 3>{0, 0, 0}, std::array<int, 3>{1, 1, 1}}) {
          CAPTURE(n);
          CAPTURE(m);
          CAPTURE(k);
          CAPTURE(trans_a);
          CAPTURE(trans_b);
          Operand a = trans_a ? random_matrix(k, n, 1, 0, rng) : random_matrix(n, k, 1, 0, rng);
          Operand b = trans_b ? random_matrix(m, k, 0, 0, rng) : random_matrix(k, m, 0, 0, rng);
          Operand bias = random_matrix(1, m, 0, 0, rng), c512 = random_matrix(n, m, 0, 0, rng);
          Operand c2 = c512;
          const mf::cpu::GemmEpilogue<float> epilogue{.alpha = 0.75f, .beta = static_cast<float>(beta),
                                                      .bias = with_bias ? bias.values.data() : nullptr,
                                                      .relu = relu != 0};
          for (auto [isa, c] : {std::pair{mf::Isa::avx512, &c512}, std::pair{mf::Isa::avx2, &c2}})
            REQUIRE(mf::cpu::detail::sgemm_on(isa, trans_a, trans_b, n, m, k, a.values.data(), a.ld, b.values.data(),
                                              b.ld, c->values.data(), c->ld, epilogue));
          CHECK(std::memcmp(c512.values.data(), c2.values.data(), c2.values.size() * sizeof(float)) == 0);
        }
}

// The bfloat16 GEMM (ops/cpu/gemm_bf16.h) against float64 sums of the bfloat16-rounded operands.
// Each product of two bfloat16 values is exact in float32 (8 + 8 significant bits), so a path errs
// only in its float32 additions: k of them per element (one per product, one per block of k added to
// C) each with relative error at most u = 2^-24, which bounds the result's error by
// gamma_{k+1} = (k+1)u / (1 - (k+1)u) times the sum of |products| (Higham, Accuracy and Stability of
// Numerical Algorithms, 2nd ed., section 3.1). The epilogue (alpha times the sum, plus beta c, plus
// the bias) rounds up to three times more, so the bound used is gamma_{k+4} times |alpha| sum |products|
// + |beta c| + |bias|; ReLU moves no value further from its reference. Against the unrounded float32
// operands each product is off by at most (2 * 2^-8 + 2^-16) of its size besides.
TEST_CASE("the bfloat16 GEMM sums the rounded operands' products to float32 accuracy, on each path") {
  std::mt19937 rng(20261126);
  auto rounded = [](float x) { return static_cast<double>(static_cast<float>(mf::bfloat16(x))); };
  std::vector<bool> paths{false};
  if (mf::cpu::detail::gemm_bf16_can_use_dot_products()) paths.push_back(true);
  else MESSAGE("the AVX512-BF16 path is not checked: this CPU (or MINIFLOW_ISA) does not run vdpbf16ps");
  struct Shape3 {
    int64_t rows, cols, depth;
  };
  // Strips of 12 rows and panels of 32 columns with remainders, 512 columns and 256 pairs of k per block
  // with remainders, blocks of 144 rows with a remainder where B is one block, an odd depth (a zero
  // pads the last pair), single elements.
  for (Shape3 s : {Shape3{1, 1, 1}, Shape3{13, 33, 3}, Shape3{25, 515, 64}, Shape3{7, 40, 1031}, Shape3{30, 17, 530},
                   Shape3{301, 45, 515}})
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true})
        for (int variant = 0; variant < 3; ++variant)  // c = product; c += product; the whole epilogue
          for (bool dot_products : paths) {
            CAPTURE(s.rows);
            CAPTURE(s.cols);
            CAPTURE(s.depth);
            CAPTURE(trans_a);
            CAPTURE(trans_b);
            CAPTURE(variant);
            CAPTURE(dot_products);
            const float nan = std::numeric_limits<float>::quiet_NaN();
            Operand a = trans_a ? random_matrix(s.depth, s.rows, 3, nan, rng) : random_matrix(s.rows, s.depth, 3, nan, rng);
            Operand b = trans_b ? random_matrix(s.cols, s.depth, 2, nan, rng) : random_matrix(s.depth, s.cols, 2, nan, rng);
            Operand c = random_matrix(s.rows, s.cols, 1, nan, rng);
            if (variant == 0) std::fill(c.values.begin(), c.values.end(), nan);  // beta = 0 must not read C
            const std::vector<float> c_before = c.values;
            std::vector<float> bias(static_cast<size_t>(s.cols));
            for (float& v : bias) v = std::uniform_real_distribution<float>(-1, 1)(rng);
            const mf::cpu::GemmEpilogue<float> epilogue =
                variant == 0 ? mf::cpu::GemmEpilogue<float>{}
                : variant == 1 ? mf::cpu::GemmEpilogue<float>{.beta = 1}
                               : mf::cpu::GemmEpilogue<float>{.alpha = 0.5f, .beta = -2, .bias = bias.data(), .relu = true};
            mf::cpu::detail::gemm_bf16_on(dot_products, trans_a, trans_b, s.rows, s.cols, s.depth, a.values.data(),
                                          a.ld, b.values.data(), b.ld, c.values.data(), c.ld, epilogue);
            const double u = std::ldexp(1.0, -24), gamma = (s.depth + 4) * u / (1 - (s.depth + 4) * u);
            int bad = 0;
            for (int64_t i = 0; i < s.rows; ++i)
              for (int64_t j = 0; j < s.cols; ++j) {
                double sum = 0, magnitude = 0;
                for (int64_t p = 0; p < s.depth; ++p) {
                  const double x = rounded(a.values[static_cast<size_t>(trans_a ? p * a.ld + i : i * a.ld + p)]);
                  const double y = rounded(b.values[static_cast<size_t>(trans_b ? j * b.ld + p : p * b.ld + j)]);
                  sum += x * y;
                  magnitude += std::fabs(x * y);
                }
                const double start =
                    epilogue.beta == 0 ? 0.0 : epilogue.beta * c_before[static_cast<size_t>(i * c.ld + j)];
                const double added = epilogue.bias ? bias[static_cast<size_t>(j)] : 0.0;
                double want = epilogue.alpha * sum + start + added;
                if (epilogue.relu) want = std::max(want, 0.0);
                const double bound = gamma * (std::fabs(epilogue.alpha) * magnitude + std::fabs(start) + std::fabs(added));
                const double got = c.values[static_cast<size_t>(i * c.ld + j)];
                if (!(std::fabs(got - want) <= bound) && bad++ < 3)
                  FAIL_CHECK(fmt::format("c[{}][{}] = {} but the rounded operands give {} (bound {})", i, j, got,
                                         want, bound));
              }
            CHECK(bad == 0);
            for (int64_t i = 0; i < s.rows; ++i)  // the padding between C's rows is never written
              CHECK(std::isnan(c.values[static_cast<size_t>(i * c.ld + s.cols)]));
          }
}

TEST_CASE("set_float32_matmul_precision(\"medium\") takes float32 products to bfloat16 where AVX512-BF16 runs") {
  CHECK(mf::get_float32_matmul_precision() == "highest");
  CHECK_THROWS_WITH_AS(mf::set_float32_matmul_precision("low"),
                       "set_float32_matmul_precision: expected \"highest\", \"high\" or \"medium\", got \"low\"",
                       mf::Error);
  mf::Tensor x = mf::randn({40, 70}), w = mf::randn({50, 70}), bias = mf::randn({50});
  auto round_trip = [](const mf::Tensor& t) { return t.to(mf::DType::BFloat16).to(mf::DType::Float32); };
  const mf::Tensor exact = mf::linear(x, w, bias);
  const mf::Tensor from_rounded = mf::linear(round_trip(x), round_trip(w), bias);  // float32 sums, rounded inputs
  mf::set_float32_matmul_precision("medium");
  CHECK(mf::get_float32_matmul_precision() == "medium");
  const mf::Tensor medium = mf::linear(x, w, bias);
  const mf::Tensor medium_product = mf::matmul(x, w.t());
  mf::set_float32_matmul_precision("highest");
  const std::vector<float> got = medium.to_vector<float>(), exact_values = exact.to_vector<float>(),
                           rounded_values = from_rounded.to_vector<float>();
  if (!mf::cpu::gemm_bf16_uses_dot_products()) {
    CHECK(got == exact_values);  // no AVX512-BF16 here: float32 products stay float32
    return;
  }
  // Against float32 sums of the rounded inputs only the order of the float32 additions differs: 70
  // products of magnitude ~1 each, so a few float32 ulps of ~10. Against the exact inputs, bfloat16's
  // rounding (2^-9 relative per input) shows.
  double largest_from_rounded = 0, largest_from_exact = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    largest_from_rounded = std::max(largest_from_rounded, std::fabs(double(got[i]) - rounded_values[i]));
    largest_from_exact = std::max(largest_from_exact, std::fabs(double(got[i]) - exact_values[i]));
  }
  CHECK(largest_from_rounded < 1e-4);
  CHECK(largest_from_exact > 1e-3);
  const std::vector<float> product_plus_bias = medium_product.add(bias).to_vector<float>();
  double largest_gap = 0;  // the same products, the bias added after the GEMM instead of in it
  for (size_t i = 0; i < got.size(); ++i) largest_gap = std::max(largest_gap, std::fabs(double(got[i]) - product_plus_bias[i]));
  CHECK(largest_gap < 1e-5);
}
