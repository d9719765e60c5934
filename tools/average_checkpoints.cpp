// tools/average_checkpoints: one checkpoint whose weights are the mean of several (models::
// Translator::average), the way fairseq's average_checkpoints.py and Marian's checkpoint averaging
// are used: the last few epochs of a run average into a model that usually translates better than
// the last alone.
//
//   average_checkpoints --output averaged.safetensors epoch8.safetensors epoch9.safetensors epoch10.safetensors
//
// The checkpoints must come from one model (config, vocabularies and tokenizer); the output, written
// atomically, translates with `translate` but holds no optimizer state, so it cannot be resumed.
// Exit status: 0 on success, 2 on bad usage (no checkpoint, no --output), 1 on any other error
// (a missing, corrupt or mismatched checkpoint, an unwritable output).
#include "miniflow.h"
#include "tools/cli.h"

#include <fmt/format.h>

#include <vector>

namespace {

int run(int argc, char** argv) {
  std::vector<std::filesystem::path> inputs;
  std::filesystem::path output;
  mf::tools::ArgParser args("average_checkpoints",
                            "Writes the element-wise mean of the given translation checkpoints' weights (summed in "
                            "float64)\nto --output: a model to translate with, not to resume training from.");
  args.add_positional("CHECKPOINT", &inputs, "translation checkpoints of one model (train_transformer's)");
  args.add("output", &output, "the averaged checkpoint to write, atomically");
  if (!args.parse(argc, argv)) return 0;
  if (inputs.empty()) throw mf::tools::UsageError("give the checkpoints to average");
  if (output.empty()) throw mf::tools::UsageError("--output is required");
  const mf::models::Translator mean = mf::models::Translator::average(inputs);
  mean.save(output);
  fmt::print("averaged {} checkpoint{} of {} parameters into '{}'\n", inputs.size(), inputs.size() == 1 ? "" : "s",
             mean.model_ptr()->config().parameter_count(), output.string());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return mf::tools::run_tool("average_checkpoints", [&] { return run(argc, argv); });
}
