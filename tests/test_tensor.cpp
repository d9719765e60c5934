// The Tensor handle and the core beneath it: views and strides, copies, element access, factories,
// broadcasting and promotion, the caching allocator, the thread pool and the random number generator.
#include <doctest/doctest.h>

#include "helpers.h"
#include "ops/reference.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <set>
#include <span>
#include <thread>
#include <tuple>
#include <utility>

using namespace mf;
using mf::testing::check_close;
using mf::testing::ThreadCountGuard;

namespace {

/// 0, 1, ..., n-1 as a 1-D tensor of `dtype`.
Tensor iota(int64_t n, DType dtype = DType::Float32) {
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = static_cast<double>(i);
  return from_vector(values).to(dtype);
}

}  // namespace

// ---- views --------------------------------------------------------------------------------------

TEST_CASE("views share storage: writing through a view changes the base") {
  Tensor x = zeros({3, 4});
  size_t allocations = cpu_allocator().stats().system_allocations;
  size_t bytes = cpu_allocator().stats().allocated_bytes;
  Tensor row = x.select(0, 1);
  Tensor column = x.t().select(0, 2);
  Tensor block = x.slice(0, 1, 3).slice(1, 2, 4);
  CHECK(cpu_allocator().stats().system_allocations == allocations);  // no copies were made
  CHECK(cpu_allocator().stats().allocated_bytes == bytes);
  CHECK(row.storage() == x.storage());
  CHECK(column.storage() == x.storage());

  row.fill_(1);
  column.fill_(2);
  block.copy_(from_vector(std::vector<float>{7, 8}, {1, 2}));  // broadcast over the block's 2 rows
  // Row 1 is ones, column 2 is twos (written after the row), then the block x[1:3, 2:4] = [7, 8].
  CHECK(x.to_vector<float>() == std::vector<float>{0, 0, 2, 0,  //
                                                   1, 1, 7, 8,  //
                                                   0, 0, 7, 8});
}

TEST_CASE("views: shapes, strides and offsets") {
  Tensor x = zeros({2, 3, 4});
  CHECK(x.strides() == Shape{12, 4, 1});
  CHECK(x.is_contiguous());

  Tensor t = x.transpose(0, 2);
  CHECK(t.shape() == Shape{4, 3, 2});
  CHECK(t.strides() == Shape{1, 4, 12});
  CHECK_FALSE(t.is_contiguous());

  Tensor p = x.permute({1, 2, 0});
  CHECK(p.shape() == Shape{3, 4, 2});
  CHECK(p.strides() == Shape{4, 1, 12});

  Tensor s = x.slice(1, 1, 3);
  CHECK(s.shape() == Shape{2, 2, 4});
  CHECK(s.strides() == Shape{12, 4, 1});
  CHECK(s.offset() == 4);

  Tensor stepped = x.slice(-1, 1, 4, 2);  // elements 1 and 3 of the last dim
  CHECK(stepped.shape() == Shape{2, 3, 2});
  CHECK(stepped.strides() == Shape{12, 4, 2});
  CHECK(stepped.offset() == 1);

  Tensor selected = x.select(1, -1);  // index 2
  CHECK(selected.shape() == Shape{2, 4});
  CHECK(selected.strides() == Shape{12, 1});
  CHECK(selected.offset() == 8);

  Tensor narrowed = x.narrow(2, 1, 2);
  CHECK(narrowed.shape() == Shape{2, 3, 2});
  CHECK(narrowed.offset() == 1);

  Tensor e = zeros({3, 1}).expand({2, 3, 4});
  CHECK(e.shape() == Shape{2, 3, 4});
  CHECK(e.strides() == Shape{0, 1, 0});

  CHECK(zeros({1, 3, 1}).squeeze().shape() == Shape{3});
  CHECK(zeros({1, 3, 1}).squeeze(0).shape() == Shape{3, 1});
  CHECK(zeros({3}).unsqueeze(-1).shape() == Shape{3, 1});
  CHECK(x.flatten(1).shape() == Shape{2, 12});
  CHECK(zeros({}).flatten().shape() == Shape{1});
}

TEST_CASE("views: split and chunk are views covering the dim") {
  Tensor x = iota(10);
  std::vector<Tensor> parts = split(x, 4);
  REQUIRE(parts.size() == 3);
  CHECK(parts[2].to_vector<float>() == std::vector<float>{8, 9});
  CHECK(parts[1].offset() == 4);
  std::vector<Tensor> chunks = chunk(x.view({2, 5}), 2, 1);  // sizes 3 and 2 along dim 1
  REQUIRE(chunks.size() == 2);
  CHECK(chunks[0].shape() == Shape{2, 3});
  CHECK(chunks[1].to_vector<float>() == std::vector<float>{3, 4, 8, 9});
  CHECK(chunks[1].storage() == x.storage());
}

TEST_CASE("views: errors name the problem") {
  Tensor x = zeros({2, 3});
  CHECK_THROWS_WITH_AS(x.select(0, 2), doctest::Contains("index 2 is out of range for dim 0 of size 2"), Error);
  CHECK_THROWS_WITH_AS(x.permute({0, 0}), doctest::Contains("repeats a dim"), Error);
  CHECK_THROWS_WITH_AS(x.expand({4, 3}), doctest::Contains("cannot expand shape [2, 3] to [4, 3]"), Error);
  CHECK_THROWS_WITH_AS(x.view({4, 2}), doctest::Contains("shape [4, 2] is invalid for 6 elements"), Error);
  CHECK_THROWS_WITH_AS(x.transpose(0, 2), doctest::Contains("dim 2 is out of range"), Error);
}

TEST_CASE("empty refuses shapes whose strides or bytes overflow") {
  // Found with fuzz_safetensors: an empty tensor [0, 2^32, 2^32] holds no bytes, but its stride for
  // dim 0 would be 2^64, past int64 (signed overflow).
  CHECK_THROWS_WITH_AS(Tensor::empty({0, int64_t{1} << 32, int64_t{1} << 32}),
                       doctest::Contains("shape [0, 4294967296, 4294967296] has too many elements"), Error);
  CHECK_THROWS_WITH_AS(zeros({int64_t{1} << 32, int64_t{1} << 32}), doctest::Contains("has too many elements"), Error);
  // 2^62 float64 elements are 2^65 bytes: the element count fits int64, the byte count does not.
  CHECK_THROWS_WITH_AS(Tensor::empty({int64_t{1} << 62}, DType::Float64),
                       doctest::Contains("shape [4611686018427387904] has too many elements (its size in bytes does "
                                         "not fit in 64 bits)"),
                       Error);
  // The largest stride that fits is fine: [0, 2^31, 2^31] has strides [2^62, 2^31, 1].
  Tensor wide = Tensor::empty({0, int64_t{1} << 31, int64_t{1} << 31});
  CHECK(wide.strides() == Shape{int64_t{1} << 62, int64_t{1} << 31, 1});
  CHECK(wide.numel() == 0);
}

TEST_CASE("contiguous() copies only when needed") {
  Tensor x = iota(6).view({2, 3});
  CHECK(x.contiguous().is_same(x));
  CHECK(x.slice(0, 1, 2).contiguous().storage() == x.storage());  // one row: already contiguous

  Tensor t = x.t();
  Tensor c = t.contiguous();
  CHECK(c.storage() != x.storage());
  CHECK(c.is_contiguous());
  CHECK(c.strides() == Shape{2, 1});
  CHECK(c.to_vector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5});
}

TEST_CASE("reshape views when strides allow, view refuses a copy") {
  Tensor x = iota(6).view({2, 3});
  Tensor r = x.reshape({3, 2});
  CHECK(r.storage() == x.storage());
  CHECK(x.slice(0, 1, 2).view({3}).storage() == x.storage());  // a row slice stays viewable

  Tensor t = x.t();
  CHECK_THROWS_WITH_AS(t.view({6}), doctest::Contains("use reshape"), Error);
  Tensor flat = t.reshape({6});
  CHECK(flat.storage() != x.storage());
  CHECK(flat.to_vector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5});
  CHECK(x.reshape({-1}).shape() == Shape{6});
  CHECK_THROWS_WITH_AS(x.reshape({-1, -1}), doctest::Contains("more than one -1"), Error);
}

// ---- element access -----------------------------------------------------------------------------

TEST_CASE("item, at and to_vector read through strides") {
  Tensor x = iota(12).view({3, 4});
  Tensor v = x.t().slice(0, 1, 3);  // [2, 3]: v[i][j] = x[j][i + 1]
  CHECK(v.shape() == Shape{2, 3});
  CHECK(v.at<float>({1, 2}) == 10);  // x[2][2]
  CHECK(v.at<int64_t>({0, 1}) == 5);  // x[1][1]
  CHECK(v.to_vector<float>() == std::vector<float>{1, 5, 9, 2, 6, 10});
  CHECK(x.select(0, 2).select(0, 3).item<double>() == 11);
  CHECK(scalar_tensor(2.5).item<float>() == 2.5f);
  CHECK(zeros({1, 1}).item<float>() == 0);
  CHECK(zeros({3}).expand({2, 3}).to_vector<float>().size() == 6);

  CHECK_THROWS_WITH_AS(x.item<float>(), doctest::Contains("has 12 elements, expected 1"), Error);
  CHECK_THROWS_WITH_AS(x.at<float>({3, 0}), doctest::Contains("index [3, 0] is out of bounds for shape [3, 4]"),
                       Error);
  CHECK_THROWS_WITH_AS(x.at<float>({1}), doctest::Contains("index has 1 entries"), Error);
  CHECK_THROWS_WITH_AS(x.data_ptr<double>(), doctest::Contains("tensor has dtype float32, asked for float64"), Error);
}

// ---- factories ----------------------------------------------------------------------------------

TEST_CASE("factories: shapes, dtypes and values") {
  Tensor z = zeros({2, 3});
  CHECK(z.shape() == Shape{2, 3});
  CHECK(z.dtype() == DType::Float32);
  CHECK(z.device() == Device::cpu());
  CHECK(z.to_vector<float>() == std::vector<float>(6, 0));
  CHECK(ones({4}, DType::Int64).to_vector<int64_t>() == std::vector<int64_t>(4, 1));
  CHECK(full({2}, -1.5, DType::Float64).to_vector<double>() == std::vector<double>{-1.5, -1.5});
  CHECK(full({3}, 1, DType::Bool).to_vector<bool>() == std::vector<bool>{true, true, true});

  Tensor s = scalar_tensor(4);
  CHECK(s.dim() == 0);
  CHECK(s.numel() == 1);
  CHECK(s.item<float>() == 4);

  Tensor v = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(v.dtype() == DType::Int64);
  CHECK(v.at<int64_t>({1, 0}) == 4);
  CHECK(from_vector(std::vector<double>{7}).dim() == 0);  // one value and no shape: a scalar
  CHECK(from_vector(std::vector<double>{1, 2}).shape() == Shape{2});
  CHECK_THROWS_WITH_AS(from_vector(std::vector<float>{1, 2, 3}, {2, 2}),
                       doctest::Contains("3 values do not fill shape [2, 2]"), Error);

  Tensor t = tensor({1, 2, 3}, DType::Float64);
  CHECK(t.dtype() == DType::Float64);
  CHECK(t.to_vector<double>() == std::vector<double>{1, 2, 3});
  CHECK(zeros_like(t).dtype() == DType::Float64);
  CHECK(ones_like(v).to_vector<int64_t>() == std::vector<int64_t>(6, 1));
  CHECK(empty_like(v).shape() == Shape{2, 3});
  CHECK(zeros({0, 4}).numel() == 0);
  CHECK_THROWS_WITH_AS(Tensor::empty({2, -1}), doctest::Contains("negative size in shape [2, -1]"), Error);
}

TEST_CASE("clone, to(dtype), fill_, zero_, add_, mul_") {
  Tensor x = iota(4, DType::Float64);
  Tensor c = x.clone();
  CHECK(c.storage() != x.storage());
  c.fill_(3);
  CHECK(x.to_vector<double>() == std::vector<double>{0, 1, 2, 3});
  c.add_(1).mul_(2);
  CHECK(c.to_vector<double>() == std::vector<double>{8, 8, 8, 8});
  c.zero_();
  CHECK(c.to_vector<double>() == std::vector<double>(4, 0));
  c.add_(x).mul_(x);  // x^2
  CHECK(c.to_vector<double>() == std::vector<double>{0, 1, 4, 9});

  Tensor i = tensor({-1.7, 2.9}).to(DType::Int64);  // truncates toward zero, as a C++ cast
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{-1, 2});
  CHECK(x.to(DType::Float64).is_same(x));  // same dtype: no copy
  CHECK(tensor({0, 2}).to(DType::Bool).to_vector<bool>() == std::vector<bool>{false, true});
  CHECK_THROWS_WITH_AS(c.add_(zeros({2, 4}, DType::Float64)),
                       doctest::Contains("cannot be written in place into a tensor of shape [4]"), Error);
}

// ---- broadcasting and promotion -----------------------------------------------------------------

TEST_CASE("broadcasting shapes and errors") {
  CHECK(broadcast_shapes(Shape{3, 1}, Shape{1, 4}) == Shape{3, 4});
  CHECK(broadcast_shapes(Shape{2, 3, 4}, Shape{4}) == Shape{2, 3, 4});
  CHECK(broadcast_shapes(Shape{}, Shape{2}) == Shape{2});
  CHECK(broadcast_shapes(Shape{5, 1, 3}, Shape{2, 1}) == Shape{5, 2, 3});
  CHECK(broadcast_shapes(Shape{0, 1}, Shape{1, 3}) == Shape{0, 3});
  CHECK_THROWS_WITH_AS(broadcast_shapes(Shape{2, 3}, Shape{4}),
                       "shapes [2, 3] and [4] do not broadcast (dim 1: 3 vs 4)", Error);

  // Column [3, 1] + row [4]: out[i][j] = i + 10 j.
  Tensor sum = iota(3).view({3, 1}) + iota(4).mul(10.0);
  CHECK(sum.shape() == Shape{3, 4});
  CHECK(sum.at<float>({2, 3}) == 32);
  CHECK_THROWS_WITH_AS(add(zeros({2, 3}), zeros({2})), doctest::Contains("add: shapes [2, 3] and [2] do not broadcast"),
                       Error);
}

TEST_CASE("dtype promotion") {
  Tensor i = from_vector(std::vector<int64_t>{1, 2});
  Tensor f = tensor({0.5, 0.25});
  Tensor d = tensor({1, 1}, DType::Float64);
  Tensor r = i + f;
  CHECK(r.dtype() == DType::Float32);
  CHECK(r.to_vector<float>() == std::vector<float>{1.5f, 2.25f});
  CHECK((f * d).dtype() == DType::Float64);
  CHECK((i - i).dtype() == DType::Int64);
  CHECK(i.mul(2.0).dtype() == DType::Int64);   // a whole scalar keeps the integer dtype
  CHECK(i.mul(2.5).dtype() == DType::Float32);  // a fractional one promotes, as in PyTorch
  CHECK(promote_types(DType::Bool, DType::Int64) == DType::Int64);
  CHECK(promote_types(DType::Float32, DType::Float64) == DType::Float64);
  Tensor b = full({2}, 1, DType::Bool);
  CHECK_THROWS_WITH_AS(add(b, b), doctest::Contains("not defined for bool tensors"), Error);
}

// ---- allocator ----------------------------------------------------------------------------------

TEST_CASE("caching allocator reuses freed blocks and empty_cache releases them") {
  Allocator& allocator = cpu_allocator();
  const Shape shape{777'777};  // a size no other test allocates
  {
    size_t held = allocator.stats().allocated_bytes;
    Tensor first = Tensor::empty(shape);
    CHECK(allocator.stats().allocated_bytes - held >= 777'777 * sizeof(float));
  }
  AllocatorStats before = allocator.stats();
  CHECK(before.cached_bytes >= 777'777 * sizeof(float));
  {
    Tensor second = Tensor::empty(shape);
    AllocatorStats during = allocator.stats();
    CHECK(during.system_allocations == before.system_allocations);  // served from the pool
    CHECK(during.cached_bytes < before.cached_bytes);
    CHECK(during.peak_allocated_bytes >= during.allocated_bytes);
  }
  allocator.empty_cache();
  AllocatorStats after = allocator.stats();
  CHECK(after.cached_bytes == 0);
  {
    Tensor third = Tensor::empty(shape);
    CHECK(allocator.stats().system_allocations == after.system_allocations + 1);  // the pool was emptied
  }
}

namespace {

/// A CachingAllocator over malloc (granule 64 bytes) that counts the blocks it holds from the system
/// and can refuse allocations, so that every statistic can be checked against a hand count.
class CountingAllocator final : public CachingAllocator {
 public:
  CountingAllocator() : CachingAllocator("test device", 64) {}
  ~CountingAllocator() override { empty_cache(); }

  size_t live_blocks = 0;  // taken from the system and not given back
  int refusals = 0;        // the next `refusals` system allocations report out of memory

 protected:
  void* system_allocate(size_t size) override {
    if (refusals > 0) {
      --refusals;
      return nullptr;
    }
    ++live_blocks;
    return std::malloc(size);
  }
  void system_free(std::span<void* const> blocks) override {
    for (void* block : blocks) std::free(block);
    live_blocks -= blocks.size();
  }
};

}  // namespace

TEST_CASE("block sizes: four size classes per power of two, rounded up to the granule") {
  CountingAllocator allocator;
  // Up to 4 * 64 bytes the granule decides; above, n in (2^k, 2^(k+1)] rounds up to a multiple of
  // 2^k / 4: 1000 is in (512, 1024] -> multiple of 128 -> 1024; 1025 -> multiple of 256 -> 1280;
  // 1100 and 1280 -> 1280 too; 3,111,108 is in (2^21, 2^22] -> multiple of 2^19 = 524,288 -> 6 * 2^19.
  const std::vector<std::pair<size_t, size_t>> expected = {
      {0, 64},      {1, 64},      {64, 64},     {65, 128},    {150, 192},           {256, 256},
      {257, 320},   {320, 320},   {321, 384},   {1000, 1024}, {1025, 1280},         {1100, 1280},
      {1280, 1280}, {1281, 1536}, {1792, 1792}, {1793, 2048}, {3'111'108, 3'145'728}};
  for (auto [request, block] : expected) {
    CAPTURE(request);
    CHECK(allocator.block_size(request) == block);
  }
}

TEST_CASE("caching allocator statistics match a hand count") {
  CountingAllocator allocator;
  auto check_stats = [&](size_t allocated, size_t cached, size_t peak, size_t allocations, size_t hits) {
    AllocatorStats s = allocator.stats();
    CHECK(s.allocated_bytes == allocated);
    CHECK(s.cached_bytes == cached);
    CHECK(s.reserved_bytes() == allocated + cached);
    CHECK(s.peak_allocated_bytes == peak);
    CHECK(s.allocations == allocations);
    CHECK(s.cache_hits == hits);
    CHECK(s.system_allocations == allocations - hits);
  };
  void* a = allocator.allocate(10);    // a 64-byte block from the system
  void* b = allocator.allocate(1100);  // 1280
  check_stats(1344, 0, 1344, 2, 0);
  allocator.deallocate(a, 10);
  check_stats(1280, 64, 1344, 2, 0);
  void* c = allocator.allocate(60);  // also a 64-byte block: a's, from the pool
  CHECK(c == a);
  check_stats(1344, 0, 1344, 3, 1);
  allocator.deallocate(b, 1100);
  void* e = allocator.allocate(1000);  // a 1024-byte block, but b's 1280 bytes are at most twice that
  CHECK(e == b);
  check_stats(1344, 0, 1344, 4, 2);  // counted as 1280 bytes
  allocator.deallocate(e, 1000);
  allocator.deallocate(c, 60);
  check_stats(0, 1344, 1344, 4, 2);
  allocator.reset_peak_stats();
  check_stats(0, 1344, 0, 4, 2);
  void* d = allocator.allocate(500);  // 512 bytes: the cached 1280 is more than twice that, so from the system
  check_stats(512, 1344, 512, 5, 2);
  CHECK(allocator.live_blocks == 3);

  CHECK(allocator.empty_cache() == 1344);  // the 64- and 1280-byte blocks
  check_stats(512, 0, 512, 5, 2);
  CHECK(allocator.stats().system_frees == 2);
  CHECK(allocator.live_blocks == 1);
  CHECK(allocator.empty_cache() == 0);

  // Out of memory: the cache is given back and the allocation tried again.
  allocator.deallocate(d, 500);
  allocator.refusals = 1;
  void* f = allocator.allocate(50);
  CHECK(allocator.stats().system_frees == 3);
  CHECK(allocator.live_blocks == 1);
  check_stats(64, 0, 512, 6, 2);
  // With nothing cached to give back, out of memory is an error naming the request and the device.
  allocator.refusals = 1;
  CHECK_THROWS_WITH_AS(allocator.allocate(1000),
                       "out of memory: cannot allocate 1000 bytes on test device (64 bytes allocated, 0 cached)",
                       Error);
  check_stats(64, 0, 512, 6, 2);  // a failed allocation counts nothing
  int foreign = 0;
  CHECK_THROWS_WITH_AS(allocator.deallocate(&foreign, sizeof foreign),
                       "test device allocator: freeing a block it did not hand out", Error);
  allocator.deallocate(f, 50);
  check_stats(0, 64, 512, 6, 2);
}

TEST_CASE("empty_cache releases exactly the cached bytes; memory_stats reports the CPU pool") {
  empty_cache();
  AllocatorStats start = memory_stats();
  CHECK(start.cached_bytes == 0);
  {
    Tensor t = Tensor::empty({777'777});  // 3,111,108 bytes: a 3,145,728-byte block (see block sizes)
    CHECK(memory_stats().allocated_bytes == start.allocated_bytes + 3'145'728);
  }
  AllocatorStats freed = memory_stats();
  CHECK(freed.allocated_bytes == start.allocated_bytes);
  CHECK(freed.cached_bytes == 3'145'728);
  CHECK(freed.allocations == start.allocations + 1);
  CHECK(empty_cache(Device::cpu()) == 3'145'728);
  CHECK(memory_stats().cached_bytes == 0);
  CHECK(memory_stats().system_frees == freed.system_frees + 1);
  reset_peak_memory_stats();
  CHECK(memory_stats().peak_allocated_bytes == memory_stats().allocated_bytes);
  if (!cuda::is_available())
    CHECK_THROWS_WITH_AS(empty_cache(Device::cuda()), doctest::Contains("device cuda:0 is not available"), Error);
}

TEST_CASE("data pointers are 64-byte aligned") {
  for (int64_t n : {0, 1, 3, 17, 1000, 100'003}) {
    CAPTURE(n);
    for (DType dtype : {DType::Float32, DType::Float64, DType::Bool}) {
      Tensor t = Tensor::empty({n}, dtype);
      CHECK(reinterpret_cast<uintptr_t>(t.storage()->data()) % kCpuAlignment == 0);
    }
  }
  void* p = cpu_allocator().allocate(0);  // zero bytes still gives a distinct usable pointer
  void* q = cpu_allocator().allocate(0);
  CHECK(p != nullptr);
  CHECK(p != q);
  cpu_allocator().deallocate(p, 0);
  cpu_allocator().deallocate(q, 0);
}

// ---- threads ------------------------------------------------------------------------------------

namespace {

std::set<std::pair<int64_t, int64_t>> chunks_of(int64_t begin, int64_t end, int64_t grain) {
  std::mutex mutex;
  std::set<std::pair<int64_t, int64_t>> chunks;
  parallel_for(begin, end, grain, [&](int64_t lo, int64_t hi) {
    std::lock_guard lock(mutex);
    chunks.insert({lo, hi});
  });
  return chunks;
}

}  // namespace

TEST_CASE("set_num_threads / get_num_threads") {
  ThreadCountGuard guard;
  set_num_threads(3);
  CHECK(get_num_threads() == 3);
  CHECK(intra_op_threads() == 3);
  set_num_threads(1);
  CHECK(get_num_threads() == 1);
  CHECK_THROWS_WITH_AS(set_num_threads(0), doctest::Contains("thread count must be at least 1, got 0"), Error);
}

TEST_CASE("parallel_for covers the range exactly once") {
  ThreadCountGuard guard;
  set_num_threads(4);
  for (auto [begin, end, grain] : {std::tuple<int64_t, int64_t, int64_t>{0, 1000, 1}, {5, 1006, 100}, {0, 7, 1},
                                   {3, 4, 1}, {0, 100'000, 1000}}) {
    CAPTURE(begin);
    CAPTURE(end);
    std::vector<std::atomic<int>> hits(static_cast<size_t>(end));
    parallel_for(begin, end, grain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) hits[static_cast<size_t>(i)]++;
    });
    int64_t wrong = 0;
    for (int64_t i = 0; i < end; ++i) wrong += hits[static_cast<size_t>(i)] != (i >= begin ? 1 : 0);
    CHECK(wrong == 0);
  }
  bool called = false;
  parallel_for(4, 4, 1, [&](int64_t, int64_t) { called = true; });
  CHECK_FALSE(called);  // an empty range runs nothing
}

TEST_CASE("parallel_for chunking is deterministic") {
  ThreadCountGuard guard;
  set_num_threads(4);
  // 1000 items over 4 threads: 4 chunks of 250.
  auto chunks = chunks_of(0, 1000, 1);
  CHECK(chunks == std::set<std::pair<int64_t, int64_t>>{{0, 250}, {250, 500}, {500, 750}, {750, 1000}});
  for (int run = 0; run < 20; ++run) CHECK(chunks_of(0, 1000, 1) == chunks);
  // A grain of 400 allows only ceil(1000 / 400) = 3 chunks of ceil(1000 / 3) = 334.
  CHECK(chunks_of(0, 1000, 400) == std::set<std::pair<int64_t, int64_t>>{{0, 334}, {334, 668}, {668, 1000}});
  // Below one grain the caller runs everything itself.
  CHECK(chunks_of(0, 10, 100) == std::set<std::pair<int64_t, int64_t>>{{0, 10}});
  // Nested calls run serially inside their chunk.
  std::atomic<int> inner_calls = 0;
  parallel_for(0, 4, 1, [&](int64_t, int64_t) { parallel_for(0, 100, 1, [&](int64_t, int64_t) { ++inner_calls; }); });
  CHECK(inner_calls == 4);
}

TEST_CASE("parallel_for runs every chunk once across many back-to-back runs") {
  // Runs of different sizes follow each other with no pause, so workers still finishing (or still
  // spinning from) one run meet the next: a chunk claimed twice or skipped shows up in the count.
  ThreadCountGuard guard;
  for (int threads : {2, 4}) {
    set_num_threads(threads);
    int64_t wrong_runs = 0;
    for (int run = 0; run < 5000; ++run) {
      int64_t end = 1 + run % 7;
      std::atomic<int64_t> covered = 0;
      std::atomic<uint64_t> seen = 0;
      std::atomic<bool> twice = false;
      parallel_for(0, end, 1, [&](int64_t lo, int64_t hi) {
        covered += hi - lo;
        for (int64_t i = lo; i < hi; ++i)
          if (seen.fetch_or(uint64_t{1} << i) & (uint64_t{1} << i)) twice = true;
      });
      wrong_runs += covered != end || twice;
    }
    CHECK(wrong_runs == 0);
  }
}

TEST_CASE("parallel_for from two threads at once: each call runs its own chunks, every one once") {
  // The training thread and another (a user's own, say) may both reach the intra-op pool. Each call
  // must still cover its range exactly once, with its own function, and return only when its chunks
  // are done. Before the pool took one caller at a time this case failed 5 of 5 tries with wrong
  // counts (a throwaway program making the same calls also crashed); a race, so a pass proves less.
  ThreadCountGuard guard;
  set_num_threads(4);
  std::atomic<int64_t> wrong_runs = 0;
  auto hammer = [&](int id) {
    for (int run = 0; run < 20000; ++run) {
      const int64_t end = 1 + (run + id) % 9;
      std::vector<std::atomic<int>> hits(static_cast<size_t>(end));
      parallel_for(0, end, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) hits[static_cast<size_t>(i)] += 1;
      });
      for (const std::atomic<int>& h : hits) wrong_runs += h.load() != 1;
    }
  };
  std::thread other(hammer, 1);
  hammer(0);
  other.join();
  CHECK(wrong_runs == 0);
}

TEST_CASE("parallel_for propagates exceptions and stays usable") {
  ThreadCountGuard guard;
  set_num_threads(4);
  auto failing = [](int64_t lo, int64_t) {
    if (lo >= 500) fail("chunk starting at {} failed", lo);
  };
  CHECK_THROWS_WITH_AS(parallel_for(0, 1000, 1, failing), doctest::Contains("failed"), Error);
  CHECK_THROWS_WITH_AS(parallel_for(0, 1000, 1, [](int64_t lo, int64_t) {
                         if (lo == 0) fail("caller's chunk failed");
                       }),
                       "caller's chunk failed", Error);
  std::atomic<int64_t> total = 0;
  parallel_for(0, 1000, 1, [&](int64_t lo, int64_t hi) { total += hi - lo; });
  CHECK(total == 1000);
}

// ---- random numbers -----------------------------------------------------------------------------

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors") {
  // Random123's kat_vectors: counter words (c0, c1, c2, c3), key words (k0, k1) -> 4 outputs.
  // block(key, counter_hi, counter_lo) packs key = k1:k0, counter_lo = c1:c0, counter_hi = c3:c2.
  CHECK(Philox::block(0, 0, 0) == std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(Philox::block(~0ull, ~0ull, ~0ull) == std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  // counter 243f6a88 85a308d3 13198a2e 03707344, key a4093822 299f31d0 (the digits of pi).
  CHECK(Philox::block(0x299f31d0'a4093822, 0x03707344'13198a2e, 0x85a308d3'243f6a88) ==
        std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
  static_assert(Philox::block(0, 0, 0)[0] == 0x6627e8d5);  // usable at compile time
}

TEST_CASE("philox_fill gives Philox::block's words on every ISA variant") {
  // Block counts around the vector widths (8 and 16) and the AVX-512 variant's four groups of 16
  // run side by side (64), and counter ranges that carry into the high 32-bit word of the counter
  // mid-vector and in a later group.
  auto variants = detail::philox_fill_variants();
  // One variant per level kernel_isa() allows, the widest first: philox_fill never runs a wider one.
  REQUIRE(variants.size() == static_cast<size_t>(kernel_isa()) + 1);
  CHECK(variants.front().isa == (kernel_isa() == Isa::baseline ? "scalar" : isa_name(kernel_isa())));
  for (const auto& variant : variants) {
    CAPTURE(variant.isa);
    for (uint64_t counter : {uint64_t{0}, uint64_t{0xFFFFFFF9}, uint64_t{0xFFFFFFD7}, ~uint64_t{0} - 40})
      for (int64_t blocks : {0, 1, 7, 8, 15, 16, 17, 33, 50, 63, 64, 65, 100, 143}) {
        CAPTURE(counter);
        CAPTURE(blocks);
        std::vector<uint32_t> words(static_cast<size_t>(4 * blocks) + 1, 0xDEADBEEF);
        variant.fill(0x299f31d0'a4093822, counter, blocks, words.data());
        bool same = true;
        for (int64_t i = 0; i < blocks; ++i) {
          auto expected = Philox::block(0x299f31d0'a4093822, 0, counter + static_cast<uint64_t>(i));
          for (int j = 0; j < 4; ++j) same = same && words[static_cast<size_t>(4 * i + j)] == expected[static_cast<size_t>(j)];
        }
        CHECK(same);
        CHECK(words.back() == 0xDEADBEEF);  // nothing written past the last block
      }
  }
}

TEST_CASE("uniform conversions stay in [0, 1)") {
  CHECK(uniform_float(0) == 0.0f);
  CHECK(uniform_float(0xffffffff) < 1.0f);
  CHECK(uniform_double(0, 0) == 0.0);
  CHECK(uniform_double(0xffffffff, 0xffffffff) < 1.0);
  CHECK(uniform_double(0x80000000, 0) == 0.5);
}

TEST_CASE("Generator: same seed, same reserve sequence") {
  Generator a(42), b(42);
  std::vector<uint64_t> first, second;
  for (uint64_t blocks : {3, 1, 10, 0, 5}) {
    first.push_back(a.reserve(blocks));
    second.push_back(b.reserve(blocks));
  }
  CHECK(first == second);
  CHECK(first == std::vector<uint64_t>{0, 3, 4, 14, 14});
  CHECK(a.offset() == 19);

  Generator snapshot = a;  // a copy replays from where it was taken
  CHECK(a.reserve(2) == snapshot.reserve(2));
  a.manual_seed(7);
  CHECK(a.seed() == 7);
  CHECK(a.offset() == 0);
  a.set_offset(100);
  CHECK(a.reserve(1) == 100);

  manual_seed(123);
  CHECK(default_generator().seed() == 123);
  CHECK(default_generator().offset() == 0);
}

TEST_CASE("reference inputs are reproducible from their seed") {
  check_close(reference::randn({3, 4}, 5), reference::randn({3, 4}, 5), 0, 0);
  CHECK(reference::randn({4}, 5).to_vector<double>() != reference::randn({4}, 6).to_vector<double>());
  std::vector<double> u = reference::uniform({1000}, -2, 3, 9).to_vector<double>();
  CHECK(*std::min_element(u.begin(), u.end()) >= -2);
  CHECK(*std::max_element(u.begin(), u.end()) < 3);
}

TEST_CASE("CUDA tensors give a clear error in a build without CUDA") {
  if (mf::cuda::is_built()) return;  // the CUDA suite covers real devices
  CHECK_FALSE(mf::cuda::is_available());
  CHECK(mf::cuda::device_count() == 0);
  CHECK_THROWS_WITH_AS(mf::zeros({2, 3}, mf::DType::Float32, mf::Device::cuda()),
                       "device cuda:0 is not available: miniflow was built without CUDA (rebuild with meson setup "
                       "-Dcuda=enabled)", mf::Error);
  CHECK_THROWS_WITH_AS(mf::Tensor::empty({4}, mf::DType::Int64, mf::Device::cuda(1)),
                       "device cuda:1 is not available: miniflow was built without CUDA (rebuild with meson setup "
                       "-Dcuda=enabled)", mf::Error);
}

TEST_CASE("dtype errors name the op, the dtypes and the call site") {
  mf::Tensor ints = mf::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {2, 2});
  int line = __LINE__ + 1;
  auto multiply = [&] { return mf::matmul(ints, ints); };
  std::string expected = fmt::format(
      "matmul: expects two float32 or two float64 operands, got int64 and int64 at test_tensor.cpp:{}", line);
  CHECK_THROWS_WITH_AS(multiply(), expected.c_str(), mf::Error);
}

namespace {

/// Largest |matmul(a, b) - a b| over float32 [n, k] a and [k, m] b, the product summed naively in double.
double matmul_error_vs_naive(const mf::Tensor& a, const mf::Tensor& b) {
  int64_t n = a.size(0), k = a.size(1), m = b.size(1);
  std::vector<float> c = mf::matmul(a, b).to_vector<float>();
  std::vector<float> as = a.contiguous().to_vector<float>(), bs = b.contiguous().to_vector<float>();
  double worst = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double expected = 0;
      for (int64_t p = 0; p < k; ++p) expected += double{as[i * k + p]} * double{bs[p * m + j]};
      worst = std::max(worst, std::abs(double{c[i * m + j]} - expected));
    }
  return worst;
}

}  // namespace

TEST_CASE("a matmul split across threads by rows or by columns equals the naive product") {
  // Large enough (> 2^18 multiply-adds) for the pool to split each GEMM: n >= m splits the rows of C,
  // n < m its columns. Operands also come as transposed views, which reach BLAS as transpose flags.
  ThreadCountGuard restore_threads;
  mf::set_intra_op_threads(2);
  for (auto [n, k, m] : {std::array<int64_t, 3>{301, 70, 130}, std::array<int64_t, 3>{130, 70, 301}})
    for (bool transposed : {false, true}) {
      CAPTURE(n);
      CAPTURE(transposed);
      mf::Tensor a = transposed ? mf::randn({k, n}).t() : mf::randn({n, k});
      mf::Tensor b = transposed ? mf::randn({m, k}).t() : mf::randn({k, m});
      CHECK(matmul_error_vs_naive(a, b) < 1e-4);
    }
}

TEST_CASE("a linear layer's backward on two threads, one product each, equals the one-thread backward") {
  // Big enough (>= 2^22 multiply-adds) for matmul's backward to run dA and dB side by side; on one
  // thread the same two products run one after the other, through the same GEMM calls, so the
  // gradients match bit for bit. A dB several times taller than wide (a layer of 1,000 outputs from
  // 64 inputs) is cut into blocks of rows that either thread takes, and one several times wider into
  // blocks of columns: each block must be the bits of the whole product. Both the transposed weight
  // of x @ W^T and a plain right operand, with and without a bias, in float32 and under autocast.
  ThreadCountGuard restore_threads;
  for (auto [in, out] : {std::array<int64_t, 2>{256, 300}, std::array<int64_t, 2>{64, 1000},
                         std::array<int64_t, 2>{1000, 70}})
    for (bool transposed : {true, false})
      for (bool autocast : {false, true}) {
        CAPTURE(in);
        CAPTURE(out);
        CAPTURE(transposed);
        CAPTURE(autocast);
        mf::Tensor x = mf::randn({2, 80, in}), weight = transposed ? mf::randn({out, in}) : mf::randn({in, out});
        mf::Tensor bias = mf::randn({out}), upstream = mf::randn({2, 80, out});  // 160 rows: past the skinny kernel
        std::vector<std::vector<float>> grads;
        for (int threads : {1, 2}) {
          mf::set_intra_op_threads(threads);
          mf::AutocastGuard lowered(mf::DeviceType::CPU, mf::DType::BFloat16, autocast);
          mf::Tensor xs = x.clone().set_requires_grad(), ws = weight.clone().set_requires_grad();
          mf::Tensor bs = bias.clone().set_requires_grad();
          mf::Tensor y = transposed ? mf::linear(xs, ws, bs) : mf::matmul(xs, ws);
          (y * upstream).sum().backward();
          grads.push_back(xs.grad().to_vector<float>());
          grads.push_back(ws.grad().to_vector<float>());
          grads.push_back(transposed ? bs.grad().to_vector<float>() : std::vector<float>{});
        }
        CHECK(grads[0] == grads[3]);
        CHECK(grads[1] == grads[4]);
        CHECK(grads[2] == grads[5]);
      }
}

TEST_CASE("a product's input gradient added in place into the gradient summed so far is the plain sum") {
  // x feeds a residual and a big product: on two threads the product's dX GEMM adds itself into the
  // gradient the residual already left for x (beta = 1) instead of a fresh buffer summed afterwards.
  // Both orders of use, a linear layer and a plain matmul, against one thread (no adding in place).
  ThreadCountGuard restore_threads;
  mf::Tensor x = mf::randn({2, 80, 256}), weight = mf::randn({300, 256}), bias = mf::randn({300});
  mf::Tensor back = mf::randn({300, 256}), upstream = mf::randn({2, 80, 256});
  std::vector<std::vector<float>> grads;
  for (int threads : {1, 2})
    for (bool linear_first : {true, false}) {
      mf::set_intra_op_threads(threads);
      mf::Tensor xs = x.clone().set_requires_grad(), ws = weight.clone().set_requires_grad();
      mf::Tensor hidden = xs.tanh();  // not a leaf: its gradient is summed in the engine's slots
      mf::Tensor h = mf::linear(hidden, ws, bias);  // [2, 80, 300]
      mf::Tensor y = linear_first ? mf::matmul(h, back) + hidden : hidden + mf::matmul(h, back);
      (mf::matmul(y.relu(), back.t()) * h + y.sum() * 1e-3).sum().backward();
      grads.push_back(xs.grad().to_vector<float>());
      grads.push_back(ws.grad().to_vector<float>());
    }
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    const std::vector<float> &one = grads[i], &two = grads[i + 4];
    double worst = 0, scale = 0;
    for (size_t j = 0; j < one.size(); ++j) {
      worst = std::max(worst, std::abs(double{one[j]} - double{two[j]}));
      scale = std::max(scale, std::abs(double{one[j]}));
    }
    CHECK(worst <= 1e-5 * scale);
  }
}

TEST_CASE("a linear layer over few rows (the decoding path) equals the naive product") {
  // x @ W^T with W [m, k] contiguous and 8 or 16 (a vector of floats) to 32 rows of x takes a kernel
  // of its own on AVX-512 and AVX2 CPUs (ops/cpu/skinny_gemm_kernel.inc); rows beyond a 16-lane
  // (8-lane) slice, W rows beyond a block of 8 (6), odd k and row counts either side of the kernel's
  // range all occur here, on 1 and 2 threads.
  ThreadCountGuard restore_threads;
  for (int threads : {1, 2})
    for (auto [n, k, m] : {std::array<int64_t, 3>{1, 64, 300}, std::array<int64_t, 3>{17, 33, 19},
                           std::array<int64_t, 3>{32, 256, 1000}, std::array<int64_t, 3>{128, 7, 8},
                           std::array<int64_t, 3>{129, 16, 24}, std::array<int64_t, 3>{9, 40, 13},
                           std::array<int64_t, 3>{33, 16, 24}}) {
      mf::set_intra_op_threads(threads);
      CAPTURE(threads);
      CAPTURE(n);
      CAPTURE(m);
      CHECK(matmul_error_vs_naive(mf::randn({n, k}), mf::randn({m, k}).t()) < 1e-4);
    }
}

TEST_CASE("a row's linear output has the same bits whatever number of rows shares the call") {
  // Decoding runs linear layers over 1 to hundreds of rows, and the row count picks the kernel:
  // the few-rows kernel (8 or 16 to 32 rows), sgemm for the rest. Both sum each element alike (a
  // chain of FMAs per 512 values of k, the bias with the first), so a sentence translates the same
  // alone as in a batch. k = 1100 spans three such blocks; the ReLU variant clamps after the last.
  // OpenBLAS, which takes float products below AVX2, makes no such promise.
  if (mf::kernel_isa() < mf::Isa::avx2) {
    MESSAGE("skipped: kernels " << mf::isa_name(mf::kernel_isa()) << ", so float products go to OpenBLAS");
    return;
  }
  ThreadCountGuard restore_threads;
  mf::Tensor weight = mf::randn({70, 1100}), bias = mf::randn({70}), all = mf::randn({40, 1100});
  for (int threads : {1, 2}) {
    mf::set_intra_op_threads(threads);
    CAPTURE(threads);
    for (bool relu : {false, true}) {
      CAPTURE(relu);
      auto apply = [&](const mf::Tensor& x) { return relu ? mf::linear_relu(x, weight, bias) : mf::linear(x, weight, bias); };
      std::vector<float> whole = apply(all).to_vector<float>();
      for (int64_t rows : {1, 7, 8, 16, 17, 32, 33}) {
        CAPTURE(rows);
        std::vector<float> part = apply(all.narrow(0, 0, rows).contiguous()).to_vector<float>();
        CHECK(std::equal(part.begin(), part.end(), whole.begin()));
      }
    }
  }
}

TEST_CASE("the tensor operators a libtorch user writes: +=, comparisons with numbers, x[i], from_vector<int>") {
  mf::Tensor x = mf::tensor({1, 2, 3, 4}).view({2, 2});
  mf::Tensor flat = x.view({4});  // shares x's storage
  x += mf::ones({2, 2});  // in place, as in PyTorch: the view sees it
  CHECK(flat.to_vector<float>() == std::vector<float>{2, 3, 4, 5});
  x -= 1.0;
  x *= 3.0;
  x /= 6.0;  // (v + 1 - 1) * 3 / 6 = v / 2
  CHECK(flat.to_vector<float>() == std::vector<float>{0.5f, 1, 1.5f, 2});
  x *= mf::tensor({2, 4});  // broadcast along the rows
  x /= mf::tensor({1, 2});
  x -= mf::tensor({0, 1});
  CHECK(flat.to_vector<float>() == std::vector<float>{1, 1, 3, 3});

  // Comparisons give bool tensors, with a number or a tensor on the right.
  mf::Tensor v = mf::tensor({0.25, 0.5, 0.75});
  CHECK((v > 0.5).dtype() == mf::DType::Bool);
  CHECK((v > 0.5).to_vector<bool>() == std::vector<bool>{false, false, true});
  CHECK((v >= 0.5).to_vector<bool>() == std::vector<bool>{false, true, true});
  CHECK((v < 0.5).to_vector<bool>() == std::vector<bool>{true, false, false});
  CHECK((v <= 0.5).to_vector<bool>() == std::vector<bool>{true, true, false});
  CHECK(v.gt(0.5).to_vector<bool>() == std::vector<bool>{false, false, true});
  CHECK(v.le(0.5).to_vector<bool>() == (v <= 0.5).to_vector<bool>());
  mf::Tensor w = mf::tensor({0.5, 0.5, 0.5});
  CHECK((v > w).to_vector<bool>() == std::vector<bool>{false, false, true});
  CHECK((v <= w).to_vector<bool>() == std::vector<bool>{true, true, false});
  CHECK(mf::where(v > 0.5, v, mf::zeros_like(v)).to_vector<float>() == std::vector<float>{0, 0, 0.75f});

  // x[i] is select(0, i): a view, negative counting from the end, chained for x[i][j].
  mf::Tensor m = mf::arange(6, mf::DType::Float32).view({2, 3});
  CHECK(m[1].to_vector<float>() == std::vector<float>{3, 4, 5});
  CHECK(m[-1].to_vector<float>() == std::vector<float>{3, 4, 5});
  CHECK(m[0][2].item<float>() == 2);
  m[0] += 10.0;
  CHECK(m.to_vector<float>() == std::vector<float>{10, 11, 12, 3, 4, 5});
  CHECK_THROWS_WITH_AS(m[2], doctest::Contains("out of range"), mf::Error);
  CHECK_THROWS_WITH_AS(m[2], doctest::Contains("test_tensor.cpp"), mf::Error);  // the user's line

  // A tensor that requires grad refuses in-place operators, as a PyTorch leaf does.
  mf::Tensor leaf = mf::ones({2}).set_requires_grad();
  CHECK_THROWS_WITH_AS(leaf += 1.0, doctest::Contains("in-place operation on a tensor that requires grad"), mf::Error);

  // Integer vectors of any width become int64 tensors (miniflow's integer dtype).
  mf::Tensor ids = mf::from_vector(std::vector<int>{3, -1, 2});
  CHECK(ids.dtype() == mf::DType::Int64);
  CHECK(ids.to_vector<int64_t>() == std::vector<int64_t>{3, -1, 2});
  mf::Tensor bytes = mf::from_vector(std::vector<uint8_t>{255, 0, 7, 1}, {2, 2});
  CHECK(bytes.shape() == mf::Shape{2, 2});
  CHECK(bytes.to_vector<int64_t>() == std::vector<int64_t>{255, 0, 7, 1});
}
