// Seedable random numbers. Philox4x32-10 is counter-based: value i of a draw depends only on
// (seed, counter + i), so results do not depend on how work is split across threads or devices.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace mf {

/// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
struct Philox {
  static constexpr uint32_t kMultiplier0 = 0xD2511F53, kMultiplier1 = 0xCD9E8D57;  // the round's products
  static constexpr uint32_t kWeyl0 = 0x9E3779B9, kWeyl1 = 0xBB67AE85;              // the key's bumps

  static constexpr std::array<uint32_t, 4> block(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
    uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
    uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
    uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
    for (int round = 0; round < 10; ++round) {
      uint64_t p0 = uint64_t{kMultiplier0} * c0, p1 = uint64_t{kMultiplier1} * c2;
      uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0, n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
      c1 = static_cast<uint32_t>(p1);
      c3 = static_cast<uint32_t>(p0);
      c0 = n0;
      c2 = n2;
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    return {c0, c1, c2, c3};
  }
};

/// Writes the words of Philox blocks (key, 0, counter + i) for i in [0, blocks) to out[4 * i + j]:
/// the same words as Philox::block, 16 or 8 blocks at a time where the CPU has AVX-512 or AVX2.
void philox_fill(uint64_t key, uint64_t counter, int64_t blocks, uint32_t* out);

namespace detail {
struct PhiloxFillVariant {
  const char* isa;
  void (*fill)(uint64_t key, uint64_t counter, int64_t blocks, uint32_t* out);
};
/// The implementations kernel_isa() allows, fastest first (philox_fill uses the first); for tests.
std::vector<PhiloxFillVariant> philox_fill_variants();
}  // namespace detail

/// Uniform in [0, 1) with 24 random bits (float) or 53 (double).
constexpr float uniform_float(uint32_t bits) { return static_cast<float>(bits >> 8) * 0x1.0p-24f; }
constexpr double uniform_double(uint32_t hi, uint32_t lo) {
  return static_cast<double>(((uint64_t{hi} << 32) | lo) >> 11) * 0x1.0p-53;
}

/// A random stream: a seed plus how many Philox blocks have been used. Copying a Generator (or its
/// state()) and restoring it later replays the same numbers.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}

  void manual_seed(uint64_t seed) {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t offset) { offset_ = offset; }

  /// Reserves `blocks` Philox blocks (4 x 32 bits each) and returns the counter of the first.
  uint64_t reserve(uint64_t blocks) {
    uint64_t first = offset_;
    offset_ += blocks;
    return first;
  }

 private:
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
};

/// The generator factories and dropout use when none is passed.
Generator& default_generator();

/// Reseeds the default generator (torch.manual_seed).
void manual_seed(uint64_t seed);

}  // namespace mf
