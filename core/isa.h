// Which instruction set miniflow's CPU kernels use. Each kernel that has several paths (AVX-512, AVX2 +
// FMA, the x86-64 baseline) asks kernel_isa() and takes the widest it allows. That is the widest the
// CPU runs unless the environment variable MINIFLOW_ISA narrows it, so that every narrower path can be
// run, tested and timed on a wider CPU:
//
//   MINIFLOW_ISA=avx2 build/tools/train_transformer     # as on an AVX2-only CPU (AMD Zen 3)
//
// A request wider than the CPU runs, or a name that is not a level, is reported once on stderr and
// narrowed to what the CPU runs: a kernel never executes an instruction the CPU lacks.
#pragma once

#include <iosfwd>
#include <string>
#include <string_view>

namespace mf {

/// Kernel paths, narrowest first. `baseline` is what every x86-64 CPU runs (SSE2 vectors, and the
/// scalar code of kernels that have no SSE2 variant).
enum class Isa { baseline, avx2, avx512 };

/// "baseline", "avx2" or "avx512": the names MINIFLOW_ISA takes.
std::string_view isa_name(Isa isa);

/// The widest level this CPU runs (AVX2 counts only with FMA).
Isa cpu_isa();

/// The level kernels use: cpu_isa(), narrowed by MINIFLOW_ISA when it is set. Read once per process.
Isa kernel_isa();

/// One line for --help, --version and benchmarks, e.g. "kernels avx2 (MINIFLOW_ISA=avx2; this CPU
/// runs avx512)" or "kernels avx512 (the widest this CPU runs; MINIFLOW_ISA=avx2|baseline narrows it)".
std::string describe_kernel_isa();

/// Whether the CPU has AVX-512 with its bfloat16 instructions (AVX512-BF16 and AVX512-BW: Intel Cooper
/// Lake, AMD Zen 4), which the bfloat16 GEMM uses.
bool cpu_has_avx512_bf16();

/// Whether the CPU has AVX512-BF16 and its cores run vdpbf16ps faster than the float32 FMA, so that the
/// bfloat16 GEMM gains by it. AMD's do: Zen 4 and Zen 5 at twice the float32 FMA's rate. Intel's
/// Emerald Rapids runs it at half that rate (BENCHMARKS.md; `bench_gemm --float32-matmul-precision
/// medium` prints both), and its bfloat16-rounded operands go faster through the float32 GEMM, so
/// Intel's CPUs take that path; its others with AVX512-BF16 (Cooper Lake, Sapphire Rapids) are not
/// measured.
bool cpu_has_fast_avx512_bf16();

/// Why the bfloat16 GEMM does not run on vdpbf16ps here, for messages ("this CPU lacks AVX512-BF16",
/// "MINIFLOW_ISA narrows the kernels below AVX512-BF16", "this CPU runs vdpbf16ps slower than its
/// float32 FMA"), or empty where it does: kernel_isa() is avx512 and cpu_has_fast_avx512_bf16().
std::string_view why_no_bfloat16_dot_products();

/// Whether the CPU has AVX-512 with its int8 dot product (AVX512-VNNI and AVX512-BW: Intel Cascade Lake
/// and later, AMD Zen 4), which the int8 GEMM uses.
bool cpu_has_avx512_vnni();

/// The CPU's model name from /proc/cpuinfo with its family and model numbers, which tell generations
/// apart where a virtual machine's name does not ("AMD EPYC (family 26, model 2)": AMD's family 26 is
/// Zen 5, family 25 Zen 3 or Zen 4 by model), or "unknown CPU".
std::string cpu_model_name();

namespace detail {
/// What MINIFLOW_ISA's value asks of a CPU that runs `cpu`: the level to use and, when the value is
/// not honoured as given (an unknown name, or wider than the CPU), a warning saying why. An empty
/// value asks for nothing.
struct IsaRequest {
  Isa isa;
  std::string warning;
};
IsaRequest resolve_isa_request(std::string_view value, Isa cpu);

/// cpu_model_name() of a /proc/cpuinfo text.
std::string cpu_model_name_from(std::istream& cpuinfo);
}  // namespace detail

}  // namespace mf
