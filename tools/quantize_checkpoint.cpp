// tools/quantize_checkpoint: a translation checkpoint with int8 weights (models::Translator::
// quantize_int8), as CTranslate2's converters write with --quantization int8: every Linear and
// Embedding weight becomes int8 values with one float32 scale per output channel, about a quarter of
// the float32 file, still one safetensors file.
//
//   quantize_checkpoint --checkpoint model.safetensors --output model.int8.safetensors
//   translate --checkpoint model.int8.safetensors < input.de
//
// The output, written atomically, translates with `translate` on the CPU but holds no optimizer
// state, so it cannot be resumed or averaged. A checkpoint whose weights are int8 already is copied
// as it is, and the tool says so. Exit status: 0 on success, 2 on bad usage (no --checkpoint or
// --output), 1 on any other error (a missing or corrupt checkpoint, an unwritable output).
#include "miniflow.h"
#include "tools/cli.h"

#include <fmt/format.h>

#include <filesystem>

namespace {

int run(int argc, char** argv) {
  std::filesystem::path input, output;
  mf::tools::ArgParser args("quantize_checkpoint",
                            "Writes --checkpoint's model with int8 weights (one float32 scale per output channel) "
                            "to --output:\na model to translate with on the CPU, not to resume training from.");
  args.add("checkpoint", &input, "the translation checkpoint to quantize (train_transformer's)");
  args.add("output", &output, "the int8 checkpoint to write, atomically");
  if (!args.parse(argc, argv)) return 0;
  if (input.empty()) throw mf::tools::UsageError("--checkpoint is required");
  if (output.empty()) throw mf::tools::UsageError("--output is required");
  mf::models::Translator translator = mf::models::Translator::load(input);
  if (translator.is_quantized()) {
    translator.save(output);
    fmt::print("'{}' holds int8 weights already: copied to '{}'\n", input.string(), output.string());
    return 0;
  }
  translator.quantize_int8();
  translator.save(output);
  fmt::print("quantized '{}' to int8 in '{}' ({} -> {} bytes)\n", input.string(), output.string(),
             std::filesystem::file_size(input), std::filesystem::file_size(output));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return mf::tools::run_tool("quantize_checkpoint", [&] { return run(argc, argv); });
}
