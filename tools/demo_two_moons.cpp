// A small end-to-end demo of the core: a 2-64-64-2 MLP learns the two-moons classification problem
// with hand-written SGD (nn/ and optim/ will make this shorter), printing loss and accuracy.
#include "miniflow.h"
#include "tools/cli.h"

#include <fmt/format.h>

#include <cmath>
#include <numbers>

namespace {

struct Dataset {
  mf::Tensor points;  // [N, 2] float32
  mf::Tensor labels;  // [N] int64
};

/// Two interleaving half circles with Gaussian noise (scikit-learn's make_moons).
Dataset make_moons(int64_t count, double noise, mf::Generator& generator) {
  std::vector<double> t = mf::rand({count}, mf::DType::Float64, mf::Device::cpu(), &generator).to_vector<double>();
  std::vector<double> jitter = mf::randn({count, 2}, mf::DType::Float64, mf::Device::cpu(), &generator).to_vector<double>();
  std::vector<float> xy;
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < count; ++i) {
    double theta = std::numbers::pi * t[i];
    bool upper = i % 2 == 0;
    double x = upper ? std::cos(theta) : 1 - std::cos(theta);
    double y = upper ? std::sin(theta) : 0.5 - std::sin(theta);
    xy.push_back(static_cast<float>(x + noise * jitter[2 * i]));
    xy.push_back(static_cast<float>(y + noise * jitter[2 * i + 1]));
    labels.push_back(upper ? 0 : 1);
  }
  return {mf::from_vector(xy, {count, 2}), mf::from_vector(labels)};
}

/// A weight [in, out] and bias [out] with PyTorch's Linear initialisation, U(-1/sqrt(in), 1/sqrt(in)).
std::pair<mf::Tensor, mf::Tensor> linear_params(int64_t in, int64_t out, mf::Generator& generator) {
  double bound = 1.0 / std::sqrt(static_cast<double>(in));
  mf::Tensor weight = mf::uniform({in, out}, -bound, bound, mf::DType::Float32, mf::Device::cpu(), &generator);
  mf::Tensor bias = mf::uniform({out}, -bound, bound, mf::DType::Float32, mf::Device::cpu(), &generator);
  weight.set_requires_grad();
  bias.set_requires_grad();
  return {weight, bias};
}

}  // namespace

int main(int argc, char** argv) {
  return mf::tools::run_tool("demo_two_moons", [&] {
    int64_t steps = 1000, points = 1000, hidden = 64, seed = 0;
    int threads = mf::get_num_threads();
    double lr = 0.1, noise = 0.1;
    mf::tools::ArgParser args("demo_two_moons", "Trains an MLP on the two-moons problem and reports its accuracy.");
    args.add("steps", &steps, "full-batch SGD steps");
    args.add("points", &points, "dataset size");
    args.add("hidden", &hidden, "hidden layer width");
    args.add("lr", &lr, "learning rate (SGD with momentum 0.9)");
    args.add("noise", &noise, "standard deviation of the noise added to the points");
    args.add("seed", &seed, "random seed");
    args.add("threads", &threads, "intra-op threads");
    if (!args.parse(argc, argv)) return 0;
    if (steps < 1 || points < 2 || hidden < 1) throw mf::tools::UsageError("--steps, --points and --hidden must be positive");
    mf::set_num_threads(threads);

    mf::Generator generator(static_cast<uint64_t>(seed));
    Dataset data = make_moons(points, noise, generator);
    std::vector<std::pair<mf::Tensor, mf::Tensor>> layers = {
        linear_params(2, hidden, generator), linear_params(hidden, hidden, generator),
        linear_params(hidden, 2, generator)};
    std::vector<mf::Tensor> velocity;
    for (auto& [w, b] : layers) {
      velocity.push_back(mf::zeros_like(w));
      velocity.push_back(mf::zeros_like(b));
    }

    auto forward = [&](const mf::Tensor& x) {
      mf::Tensor h = x;
      for (size_t i = 0; i < layers.size(); ++i) {
        h = mf::matmul(h, layers[i].first) + layers[i].second;
        if (i + 1 < layers.size()) h = mf::relu(h);
      }
      return h;  // logits [N, 2]
    };
    auto accuracy = [&](const mf::Tensor& logits) {
      return logits.argmax(1).eq(data.labels).to(mf::DType::Float32).mean().item<double>();
    };

    fmt::print("two moons: {} points, MLP 2-{}-{}-2, {} threads\n", points, hidden, hidden, threads);
    double final_loss = 0;
    for (int64_t step = 1; step <= steps; ++step) {
      mf::Tensor logits = forward(data.points);
      mf::Tensor loss = mf::cross_entropy(logits, data.labels);
      loss.backward();
      mf::NoGradGuard no_grad;
      size_t k = 0;
      for (auto& [w, b] : layers)
        for (mf::Tensor* p : {&w, &b}) {
          mf::Tensor& v = velocity[k++];
          v.mul_(0.9).add_(p->grad());
          p->sub_(v * lr);
          p->set_grad({});
        }
      final_loss = loss.item<double>();
      if (step == 1 || step % (steps / 10 > 0 ? steps / 10 : 1) == 0)
        fmt::print("{}\n", mf::format_message("step {:5d}  loss {:.4f}  accuracy {:.1f}%", step, final_loss, 100 * accuracy(logits)));
    }
    mf::NoGradGuard no_grad;
    double final_accuracy = accuracy(forward(data.points));
    fmt::print("{}\n", mf::format_message("final: loss {:.4f}, training accuracy {:.1f}%", final_loss, 100 * final_accuracy));
    return 0;
  });
}
