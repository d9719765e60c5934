// GNU-style long flags for the tools: `--name value` or `--name=value`, `--help`. Every tool exits 0 on
// success, 2 on bad usage and 1 on any other error; run_tool() does that mapping.
#pragma once

#include "core/device.h"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace mf::tools {

/// Bad command-line usage (exit status 2).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ArgParser {
 public:
  ArgParser(std::string program, std::string summary);

  void add(const std::string& name, int64_t* target, const std::string& help);
  void add(const std::string& name, int* target, const std::string& help);
  void add(const std::string& name, double* target, const std::string& help);
  void add(const std::string& name, std::string* target, const std::string& help);
  void add(const std::string& name, std::filesystem::path* target, const std::string& help);
  /// A device: "cpu", "cuda" or "cuda:N"; anything else is bad usage. Whether the device can be used
  /// is check_device_available's business, after every flag has been checked.
  void add(const std::string& name, Device* target, const std::string& help);
  /// A switch without a value.
  void add_switch(const std::string& name, bool* target, const std::string& help);
  /// The arguments that are not flags, in order (FILE...). Without it, such an argument is bad usage.
  void add_positional(const std::string& name, std::vector<std::filesystem::path>* target, const std::string& help);

  /// Parses argv; returns false when --help or --version was printed (the tool should exit 0).
  /// Throws UsageError.
  bool parse(int argc, char** argv);
  /// The flags, then the CPU and the kernel path its kernels take (see core/isa.h).
  std::string help() const;
  /// The program, miniflow's version, the CPU, its kernel path and whether CUDA is built in.
  std::string version() const;

 private:
  struct Option {
    std::string name, help, default_text;
    bool takes_value = true;
    std::function<void(const std::string&)> set;
  };
  void add_option(Option option);

  std::string program_, summary_;
  std::vector<Option> options_;
  std::string positional_name_, positional_help_;
  std::vector<std::filesystem::path>* positional_ = nullptr;
};

/// Throws mf::Error (exit status 1) when `device`, given by the flag `flag` ("--device"), cannot be
/// used: a build without CUDA, no GPU (mf::cuda::is_available() is false), or an index past the
/// visible GPUs. Every tool calls this for its --device, so they all refuse a device alike.
void check_device_available(Device device, const std::string& flag);

/// Applies a --float32-matmul-precision value (mf::set_float32_matmul_precision); an unknown one is
/// bad usage (UsageError).
void set_matmul_precision_flag(const std::string& value);

/// Reads a --precision value: "fp32" (false) or "bf16" (true: the tool computes under
/// mf::AutocastGuard for `device`, bfloat16 products summed in float32). Any other value is bad
/// usage (UsageError). On a CPU without AVX512-BF16, bf16 prints a note that it runs slower than
/// fp32 there.
bool autocast_from_precision_flag(const std::string& value, Device device);

/// The benchmarks' --profile (the timed work's table, mf::profiler, on stderr) and --profile-trace
/// (a Chrome trace: a file, or one per rank).
struct ProfileFlags {
  bool table = false;
  std::string trace;
  bool wanted() const { return table || !trace.empty(); }
};

/// Runs body() and maps its outcome to an exit status, printing errors to stderr.
int run_tool(const std::string& program, const std::function<int()>& body);

}  // namespace mf::tools
