// Training resumes exactly: N steps, save, load into fresh objects, N more steps gives bit for bit the
// losses of 2N uninterrupted steps (model, Adam state, scheduler and the dropout generator all saved).
#include <doctest/doctest.h>

#include "helpers.h"

#include <filesystem>

using namespace mf;

namespace {

struct Run {
  std::shared_ptr<nn::SequentialImpl> model;
  std::unique_ptr<optim::Adam> optimizer;
  std::unique_ptr<optim::NoamLR> scheduler;

  explicit Run(uint64_t init_seed) {
    manual_seed(init_seed);
    model = std::make_shared<nn::SequentialImpl>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::LinearImpl>(nn::LinearOptions{.in_features = 4, .out_features = 16}),
        std::make_shared<nn::ReLUImpl>(), std::make_shared<nn::DropoutImpl>(nn::DropoutOptions{.p = 0.3}),
        std::make_shared<nn::LinearImpl>(nn::LinearOptions{.in_features = 16, .out_features = 3})});
    optimizer = std::make_unique<optim::Adam>(model->parameters(), optim::AdamOptions{.lr = 1.0, .beta2 = 0.98});
    scheduler = std::make_unique<optim::NoamLR>(*optimizer, 16, 4);
  }

  optim::TrainingState state() { return {model.get(), optimizer.get(), scheduler.get(), nullptr, &default_generator()}; }

  /// One step on a fixed batch; dropout draws from the default generator. Returns the loss bits.
  double step(const Tensor& x, const Tensor& y) {
    optimizer->zero_grad();
    Tensor loss = nn::cross_entropy(model->forward(x), y);
    loss.backward();
    optimizer->step();
    scheduler->step();
    return loss.item<double>();
  }
};

}  // namespace

TEST_CASE("N steps, save, load into fresh objects, N more = 2N uninterrupted steps, bit for bit") {
  Generator data_generator(7);
  Tensor x = randn({32, 4}, DType::Float32, Device::cpu(), &data_generator);
  Tensor y = randint(0, 3, {32}, Device::cpu(), &data_generator);
  const int steps = 6;

  Run uninterrupted(1);
  std::vector<double> expected;
  for (int i = 0; i < 2 * steps; ++i) expected.push_back(uninterrupted.step(x, y));

  std::filesystem::path path = std::filesystem::temp_directory_path() / "miniflow_test_resume.safetensors";
  std::vector<double> resumed;
  {
    Run first(1);
    for (int i = 0; i < steps; ++i) resumed.push_back(first.step(x, y));
    optim::save_training_state(path, first.state(), {{"epoch", "3"}});
  }
  manual_seed(999);  // a different generator position, which the load must undo
  Run second(2);     // different initial weights, which the load must replace
  SafetensorsMetadata extra = optim::load_training_state(path, second.state());
  CHECK(extra.at("epoch") == "3");
  for (int i = 0; i < steps; ++i) resumed.push_back(second.step(x, y));
  std::filesystem::remove(path);

  REQUIRE(resumed.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(i);
    CHECK(resumed[i] == expected[i]);  // exact: same operations on the same bits
  }
  CHECK(expected.back() < expected.front());  // and it did train
}

TEST_CASE("a training state missing a piece, or of another model, is refused with the file named") {
  std::filesystem::path path = std::filesystem::temp_directory_path() / "miniflow_test_resume_bad.safetensors";
  Run run(1);
  optim::save_training_state(path, {run.model.get(), nullptr, nullptr, nullptr, nullptr});
  CHECK_THROWS_WITH_AS(optim::load_training_state(path, run.state()),
                       doctest::Contains("has no 'miniflow.optimizer' entry"), Error);
  nn::LinearImpl other({.in_features = 2, .out_features = 2});
  CHECK_THROWS_WITH_AS(optim::load_training_state(path, {&other}),
                       doctest::Contains(doctest::String(("cannot resume from '" + path.string() + "'").c_str())),
                       Error);
  CHECK_THROWS_WITH_AS(optim::save_training_state(path, run.state(), {{"miniflow.x", "1"}}),
                       doctest::Contains("metadata key 'miniflow.x' is reserved"), Error);
  std::filesystem::remove(path);
}
