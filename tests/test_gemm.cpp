// miniflow's AVX-512 float GEMM (ops/sgemm.cpp) against naive loops in double.
#include "ops/cpu/sgemm.h"

#include "core/isa.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <limits>
#include <random>
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

TEST_CASE("miniflow's AVX-512 float GEMM equals naive loops over its blocks and edges") {
  // The shapes cross every boundary of the kernel's loops: strips of 12 rows, panels of 32 columns
  // (the last one narrower than 16 columns and wider), blocks of 96 rows (A^T), 512 values of k and
  // 1 MiB of packed B (33000 columns at k = 8; 600 columns at k = 530, with two blocks of k), each
  // with a remainder, A^T packed whole across such column blocks (over one block of rows and two),
  // plus k = 0 and single elements; with both operands plain or transposed, their
  // rows packed tight or with NaN between them (which a read past a row would carry into C).
  // beta = 0 must overwrite C without reading it (C starts as NaN), other betas scale it; a bias,
  // where given, adds one value per column; relu, where asked, clamps the finished sum.
  std::mt19937 rng(7);
  float nan = std::numeric_limits<float>::quiet_NaN();
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
            if (!mf::cpu::sgemm(trans_a, trans_b, n, m, k, a.values.data(), a.ld, b.values.data(), b.ld, c.values.data(),
                                c.ld, epilogue)) {
              // Declined exactly when the kernel path is narrower than AVX-512 (the CPU's or MINIFLOW_ISA's).
              REQUIRE(mf::kernel_isa() != mf::Isa::avx512);
              MESSAGE(fmt::format("skipped: kernels {}, so float products go to OpenBLAS", mf::isa_name(mf::kernel_isa())));
              return;
            }
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
