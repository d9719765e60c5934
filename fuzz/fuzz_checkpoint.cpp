// Fuzz target: a translation checkpoint file -> what `translate` and `train_transformer --resume` do
// with it: Translator::load, then load_training_state into Adam, a Noam schedule, a plateau
// scheduler and a generator, then one greedy translation and one training step with what was loaded
// (so restored counters and buffers get used, not just parsed).
//
// These readers take a path, so each input is written to a scratch file first (which also puts the
// file-reading path of read_safetensors under the fuzzer).
#include "fuzz/fuzz.h"
#include "miniflow.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace {

const std::filesystem::path& scratch_file() {
  static const std::filesystem::path path = [] {
    std::filesystem::path p = std::filesystem::temp_directory_path() / fmt::format("mf_fuzz_checkpoint.{}", ::getpid());
    std::atexit([] { std::remove(scratch_file().c_str()); });
    return p;
  }();
  return path;
}

void resume(const std::filesystem::path& path) {
  mf::models::Translator translator = mf::models::Translator::load(path);
  mf::models::Transformer& model = translator.model();
  mf::optim::Adam adam(model.parameters(), {.lr = 1.0, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9});
  mf::optim::NoamLR schedule(adam, model.config().d_model, 4000, 1.0);
  mf::optim::ReduceLROnPlateau plateau(adam);
  mf::Generator generator;
  mf::optim::load_training_state(
      path, {.model = &model, .optimizer = &adam, .scheduler = &schedule, .plateau = &plateau, .generator = &generator});
  translator.translate_greedy({"ein kleiner test"}, 4);

  const std::vector<std::vector<int64_t>> unknown{{mf::text::kUnkId}};  // an id every vocabulary has
  const std::vector<int64_t> rows{0};
  mf::models::TranslationBatch batch = mf::models::make_translation_batch(unknown, unknown, rows);
  model.train();
  model.loss(model.forward(batch.src, batch.tgt_in), batch.tgt_out, 0.1).backward();
  adam.step();
  schedule.step();
  plateau.step(1.0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::ofstream out(scratch_file(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    mf::fuzz::require(static_cast<bool>(out), "the scratch file can be written");
  }
  mf::fuzz::expect_only_mf_errors([] { resume(scratch_file()); });
  return 0;
}
