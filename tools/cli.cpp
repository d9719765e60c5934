#include "tools/cli.h"

#include "core/error.h"
#include "core/isa.h"
#include "cuda/cuda.h"
#include "ops/functional.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdio>

namespace mf::tools {
namespace {

template <typename T>
T parse_number(const std::string& name, const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) throw UsageError(fmt::format("--{}: '{}' is not a valid number", name, text));
  return value;
}

}  // namespace

ArgParser::ArgParser(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

void ArgParser::add_option(Option option) { options_.push_back(std::move(option)); }

void ArgParser::add(const std::string& name, int64_t* target, const std::string& help) {
  add_option({name, help, std::to_string(*target), true, [=](const std::string& v) {
                *target = parse_number<int64_t>(name, v);
              }});
}

void ArgParser::add(const std::string& name, int* target, const std::string& help) {
  add_option({name, help, std::to_string(*target), true, [=](const std::string& v) {
                *target = parse_number<int>(name, v);
              }});
}

void ArgParser::add(const std::string& name, double* target, const std::string& help) {
  add_option({name, help, fmt::format("{}", *target), true, [=](const std::string& v) {
                *target = parse_number<double>(name, v);
              }});
}

void ArgParser::add(const std::string& name, std::string* target, const std::string& help) {
  add_option({name, help, *target, true, [=](const std::string& v) { *target = v; }});
}

void ArgParser::add(const std::string& name, std::filesystem::path* target, const std::string& help) {
  add_option({name, help, target->string(), true, [=](const std::string& v) { *target = v; }});
}

void ArgParser::add(const std::string& name, Device* target, const std::string& help) {
  add_option({name, help, target->str(), true, [=](const std::string& v) {
                try {
                  *target = Device::parse(v);
                } catch (const Error&) {
                  throw UsageError(fmt::format("--{}: unknown device '{}' (expected cpu, cuda or cuda:N)", name, v));
                }
              }});
}

void ArgParser::add_switch(const std::string& name, bool* target, const std::string& help) {
  add_option({name, help, "", false, [=](const std::string&) { *target = true; }});
}

void ArgParser::add_positional(const std::string& name, std::vector<std::filesystem::path>* target,
                               const std::string& help) {
  positional_name_ = name;
  positional_help_ = help;
  positional_ = target;
}

bool ArgParser::parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    if (arg == "--version") {
      std::fputs(version().c_str(), stdout);
      return false;
    }
    if (!arg.starts_with("--")) {
      if (positional_ == nullptr) throw UsageError(fmt::format("unexpected argument '{}'", arg));
      positional_->push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    bool inline_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    auto it = std::find_if(options_.begin(), options_.end(), [&](const Option& o) { return o.name == name; });
    if (it == options_.end()) throw UsageError(fmt::format("unknown option '--{}'", name));
    if (it->takes_value && !inline_value) {
      if (i + 1 >= argc) throw UsageError(fmt::format("--{} needs a value", name));
      value = argv[++i];
    } else if (!it->takes_value && inline_value) {
      throw UsageError(fmt::format("--{} takes no value", name));
    }
    it->set(value);
  }
  return true;
}

std::string ArgParser::help() const {
  std::string text = fmt::format("usage: {} [options]{}\n\n{}\n\n", program_,
                                 positional_ ? fmt::format(" {}...", positional_name_) : "", summary_);
  if (positional_) text += fmt::format("  {:<24} {}\n\n", positional_name_ + "...", positional_help_);
  text += "options:\n";
  for (const Option& o : options_) {
    std::string left = o.takes_value ? fmt::format("--{} VALUE", o.name) : fmt::format("--{}", o.name);
    std::string right = o.help;
    if (o.takes_value && !o.default_text.empty()) right += fmt::format(" (default {})", o.default_text);
    text += fmt::format("  {:<24} {}\n", left, right);
  }
  text += fmt::format("  {:<24} {}\n", "--help", "print this help and exit");
  text += fmt::format("  {:<24} {}\n", "--version", "print miniflow's version, kernel path and CUDA support, and exit");
  text += fmt::format("\nCPU {}: {}\n", cpu_model_name(), describe_kernel_isa());
  return text;
}

std::string ArgParser::version() const {
  return fmt::format("{} (miniflow {})\nCPU {}: {}\nCUDA: {}\n", program_, MINIFLOW_VERSION, cpu_model_name(),
                     describe_kernel_isa(), cuda::is_built() ? "built in (use with --device cuda)" : "not built");
}

void check_device_available(Device device, const std::string& flag) {
  if (device.is_cpu()) return;
  const std::string text = device.str() == "cuda:0" ? "cuda" : device.str();
  MF_CHECK(cuda::is_built(), "{} {}: this miniflow was built without CUDA (rebuild with meson setup -Dcuda=enabled)",
           flag, text);
  MF_CHECK(cuda::is_available(), "{} {}: no CUDA device is available: {}", flag, text, cuda::unavailable_reason());
  MF_CHECK(device.index < cuda::device_count(), "{} {}: only {} CUDA device(s) are visible (cuda:0 to cuda:{})", flag,
           text, cuda::device_count(), cuda::device_count() - 1);
}

void set_matmul_precision_flag(const std::string& value) {
  try {
    mf::set_float32_matmul_precision(value);
  } catch (const Error& error) {
    throw UsageError(fmt::format("--float32-matmul-precision: {}", error.what()));
  }
}

bool autocast_from_precision_flag(const std::string& value, Device device) {
  if (value == "fp32") return false;
  if (value != "bf16") throw UsageError(fmt::format("--precision: expected fp32 or bf16, got '{}'", value));
  const std::string_view why = why_no_bfloat16_dot_products();
  if (device.is_cpu() && !why.empty())
    fmt::print(stderr, "note: --precision bf16: {}, so the bfloat16-rounded operands go through the float32 GEMM, "
               "slower than fp32\n", why);
  return true;
}

int run_tool(const std::string& program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const UsageError& error) {
    fmt::print(stderr, "{}: {}\ntry '{} --help'\n", program, error.what(), program);
    return 2;
  } catch (const std::exception& error) {
    fmt::print(stderr, "{}: error: {}\n", program, error.what());
    return 1;
  }
}

}  // namespace mf::tools
