// CPU loops over tensors of any strides, walked as ops/layout.h's LoopPlan: operands are broadcast to
// the output's shape, dims that are contiguous in every operand are merged, and the innermost run
// goes to a loop the compiler can vectorise when every operand is contiguous there. Outer rows are
// split over the thread pool.
#pragma once

#include "core/parallel.h"
#include "core/tensor.h"
#include "ops/cpu/simd.h"
#include "ops/layout.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <tuple>
#include <utility>

namespace mf::cpu {

/// Work below this many elements stays on one thread (thread wake-up costs more).
inline constexpr int64_t kParallelGrain = 32768;

/// Calls run(ptrs, inner_strides, length) for every innermost run, rows split across threads. When
/// there are fewer rows than threads (a contiguous tensor is a single run), each run is cut into
/// pieces as well, so that every thread gets a share.
template <size_t N, typename Run>
void for_each_run(const LoopPlan<N>& plan, Run&& run) {
  int64_t n = plan.inner(), rows = plan.outer();
  int64_t threads = intra_op_threads();
  int64_t pieces = rows >= threads ? 1 : std::clamp<int64_t>(n / kParallelGrain, 1, threads);
  constexpr int64_t kPieceAlign = 64;  // elements: pieces start on cache-line and vector boundaries
  int64_t piece = pieces == 1 ? n : ((n + pieces - 1) / pieces + kPieceAlign - 1) & ~(kPieceAlign - 1);
  if (piece > 0) pieces = (n + piece - 1) / piece;  // rounding up may leave fewer pieces
  std::array<int64_t, N> inner_strides;
  for (size_t k = 0; k < N; ++k) inner_strides[k] = plan.strides[k].back();
  size_t outer_dims = plan.shape.size() - 1;
  parallel_for(0, rows * pieces, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(piece, 1)),
               [&](int64_t item_begin, int64_t item_end) {
                 Shape index(outer_dims, 0);
                 int64_t rest = item_begin / pieces;
                 for (size_t d = outer_dims; d-- > 0;) {
                   index[d] = rest % plan.shape[d];
                   rest /= plan.shape[d];
                 }
                 for (int64_t item = item_begin, part = item_begin % pieces; item < item_end; ++item) {
                   int64_t start = part * piece;
                   std::array<char*, N> ptrs = plan.base;
                   for (size_t k = 0; k < N; ++k) ptrs[k] += start * inner_strides[k];
                   for (size_t d = 0; d < outer_dims; ++d)
                     for (size_t k = 0; k < N; ++k) ptrs[k] += index[d] * plan.strides[k][d];
                   run(ptrs, inner_strides, std::min(piece, n - start));
                   if (++part < pieces) continue;
                   part = 0;
                   for (size_t d = outer_dims; d-- > 0;) {
                     if (++index[d] < plan.shape[d]) break;
                     index[d] = 0;
                   }
                 }
               });
}

/// out[i] = fn(in_0[i], in_1[i], ...) with inputs broadcast to out's shape. Out and In are the C++
/// element types of the operands, which the caller has checked.
template <typename Out, typename... In, typename Fn>
void map(Tensor& out, const std::array<const Tensor*, sizeof...(In)>& inputs, Fn fn) {
  constexpr size_t N = sizeof...(In) + 1;
  std::array<const Tensor*, N> operands;
  operands[0] = &out;
  for (size_t k = 0; k < sizeof...(In); ++k) operands[k + 1] = inputs[k];
  LoopPlan<N> plan(out.shape(), operands);
  for_each_run(plan, [&](const std::array<char*, N>& ptrs, const std::array<int64_t, N>& strides, int64_t n) {
    [&]<size_t... I>(std::index_sequence<I...>) {
      Out* o = reinterpret_cast<Out*>(ptrs[0]);
      std::tuple<const In*...> in{reinterpret_cast<const In*>(ptrs[I + 1])...};
      // Inputs contiguous along the run, or one of them a single value broadcast over it (a scalar
      // operand, a row statistic): bit k of Broadcast marks input k as that value, so the loop
      // keeps it in a register. Compiled for the widest vectors the CPU has.
      auto vector_loop = [&]<unsigned Broadcast>() {
        with_widest_isa([&]<int>() MF_LAMBDA_INLINE {
          for (int64_t i = 0; i < n; ++i) o[i] = fn(std::get<I>(in)[(Broadcast >> I & 1) ? 0 : i]...);
        });
      };
      unsigned broadcast = 0;
      bool vectorisable = strides[0] == sizeof(Out);
      ((strides[I + 1] == 0 ? void(broadcast |= 1u << I) : void(vectorisable &= strides[I + 1] == sizeof(In))), ...);
      if (vectorisable && broadcast == 0) {
        vector_loop.template operator()<0>();
      } else if (vectorisable && (broadcast & (broadcast - 1)) == 0) {  // exactly one broadcast input
        ((broadcast == 1u << I ? vector_loop.template operator()<1u << I>() : void()), ...);
      } else {
        for (int64_t i = 0; i < n; ++i)
          *reinterpret_cast<Out*>(ptrs[0] + i * strides[0]) =
              fn(*reinterpret_cast<const In*>(ptrs[I + 1] + i * strides[I + 1])...);
      }
    }(std::index_sequence_for<In...>{});
  });
}

}  // namespace mf::cpu
