// Training on a GPU end to end: train_transformer's toy corpus, model and schedule, trained through the
// tool's own loop (train/train_loop: batches, Adam + Noam, clipping, loss) on every device present, must
// give every toy translation right; and CPU and CUDA runs from the same initial weights (dropout 0)
// must have the same losses over their first steps, up to the rounding of another summation order.
// The trained model's checkpoint must load back onto its device and translate the same.
// Without a GPU the CUDA runs are reported as skipped and the CPU run checks the harness.
#include <doctest/doctest.h>

#include "miniflow.h"

#include <cmath>
#include <filesystem>
#include <memory>
#include <vector>

using namespace mf;

namespace {

/// The devices the test runs on: the CPU, and the first GPU when one is present.
std::vector<Device> devices() {
  std::vector<Device> out{Device::cpu()};
  if (cuda::is_available()) out.push_back(Device::cuda(0));
  return out;
}

/// What one run gave: the trained translator, the loss of each step and the toy translations afterwards.
struct ToyRun {
  std::shared_ptr<models::Translator> translator;
  std::vector<double> losses;
  std::vector<train::ToyTranslation> translations;
};

/// train_transformer without arguments, on `device`: the toy corpus and the tool's toy options (with
/// `dropout`), the model initialised on the CPU from the seed and then moved, trained for the whole
/// epoch (max_steps 0) or its first `max_steps` steps.
ToyRun train_toy(Device device, int64_t max_steps, double dropout = train::toy_options().model.dropout) {
  ToyRun run;
  train::TrainingOptions options = train::toy_options();
  options.model.dropout = dropout;
  options.max_steps = max_steps;
  options.on_step = [&](int64_t, double loss) { run.losses.push_back(loss); };
  manual_seed(static_cast<uint64_t>(options.optim.seed));
  text::Corpus corpus = train::make_toy_corpus(
      train::kToyRepeats,
      {.tokenizer = options.tokenizer, .max_length = options.model.max_len - 1, .skip_empty = true});
  run.translator = std::make_shared<models::Translator>(train::build_translator(corpus, options));
  models::Translator& translator = *run.translator;
  translator.model().to(device);
  train::ParallelData data = train::encode_corpus(translator, corpus, 0);
  REQUIRE(train::train_translator(translator, data, {}, options) == 0);
  run.translations = train::translate_toy(translator);
  return run;
}

}  // namespace

TEST_CASE("train_transformer's toy corpus trains to correct translations through its loop on every device") {
  for (Device device : devices()) {
    CAPTURE(device.str());
    ToyRun run = train_toy(device, 0);
    CHECK(run.translator->model().device() == device);
    CHECK(run.losses.size() > 200);  // one epoch of the toy corpus is several hundred steps
    for (const train::ToyTranslation& t : run.translations) {
      CAPTURE(t.source);
      CHECK(t.greedy == t.expected);
      CHECK(t.beam == t.expected);
    }
    // The checkpoint goes through the host and comes back onto the device translating the same.
    std::filesystem::path path = std::filesystem::temp_directory_path() / "mf_test_cuda_training.safetensors";
    run.translator->save(path);
    models::Translator loaded = models::Translator::load(path);
    std::filesystem::remove(path);
    loaded.model().to(device);
    std::vector<train::ToyTranslation> again = train::translate_toy(loaded);
    REQUIRE(again.size() == run.translations.size());
    for (size_t i = 0; i < again.size(); ++i) {
      CHECK(again[i].greedy == run.translations[i].greedy);
      CHECK(again[i].beam == run.translations[i].beam);
    }
  }
  if (!cuda::is_available()) MESSAGE("SKIPPED: no GPU: the toy corpus was trained on the CPU only, not on CUDA");
}

TEST_CASE("CPU and CUDA training losses agree over the first steps (dropout 0, and 0.1 with the same masks)") {
  if (!cuda::is_available()) {
    MESSAGE("SKIPPED: no GPU: CPU and CUDA training losses not compared");
    return;
  }
  constexpr int64_t kSteps = 30;
  // Dropout draws its masks from the generator's Philox stream on both devices, so 0.1 must agree too.
  for (double dropout : {0.0, 0.1}) {
    CAPTURE(dropout);
    ToyRun cpu = train_toy(Device::cpu(), kSteps, dropout), gpu = train_toy(Device::cuda(0), kSteps, dropout);
    REQUIRE(cpu.losses.size() == kSteps);
    REQUIRE(gpu.losses.size() == kSteps);
    for (size_t s = 0; s < cpu.losses.size(); ++s) {
      CAPTURE(s);
      // The first loss comes from the same weights and batch: only float32 summation order differs.
      // Adam then carries such differences into the weights, so later steps get a looser bound.
      double tolerance = s == 0 ? 1e-5 : 2e-3;
      CHECK(std::abs(gpu.losses[s] - cpu.losses[s]) <= tolerance * std::abs(cpu.losses[s]));
    }
  }
}
