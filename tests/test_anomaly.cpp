// Anomaly detection (autograd::set_detect_anomaly): off by default; when on, the first op whose
// output holds NaN from NaN-free inputs (or inf from finite inputs) is named with the line that
// called it, in forward and in backward; finite computations give the same bits with it on.
#include <doctest/doctest.h>

#include "helpers.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

using namespace mf;
using mf::testing::f64;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string at_line(int line) { return fmt::format("test_anomaly.cpp:{}", line); }

/// The message of the mf::Error `fn` throws ("" when it throws none).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

/// Loss and every gradient of a small Transformer (dropout on, seed fixed) as raw values.
std::vector<std::vector<float>> transformer_step() {
  manual_seed(5);
  models::TransformerConfig config{.src_vocab = 9, .tgt_vocab = 9, .d_model = 8, .heads = 2, .encoder_layers = 1,
                                   .decoder_layers = 1, .d_ff = 16, .dropout = 0.2, .max_len = 8};
  models::Transformer model(config);
  Tensor src = from_vector(std::vector<int64_t>{3, 4, 8, 2, 0, 0}, {2, 3});  // padded: -1e9 mask entries
  Tensor tgt = from_vector(std::vector<int64_t>{1, 5, 6, 1, 7, 0}, {2, 3});
  Tensor loss = model.loss(model.forward(src, tgt), tgt, 0.1);
  loss.backward();
  std::vector<std::vector<float>> values{loss.to_vector<float>()};
  for (const Tensor& p : model.parameters()) values.push_back(p.grad().to_vector<float>());
  return values;
}

}  // namespace

TEST_CASE("anomaly mode is off by default, and NaN then flows silently") {
  CHECK_FALSE(autograd::is_anomaly_enabled());
  Tensor y = log(tensor({1, -1}));
  CHECK(std::isnan(y.to_vector<double>()[1]));
}

TEST_CASE("the guard turns anomaly mode on for its scope and restores it, also after a throw") {
  {
    autograd::DetectAnomalyGuard guard;
    CHECK(autograd::is_anomaly_enabled());
    {
      autograd::DetectAnomalyGuard off(false);
      CHECK_FALSE(autograd::is_anomaly_enabled());
    }
    CHECK(autograd::is_anomaly_enabled());
  }
  CHECK_FALSE(autograd::is_anomaly_enabled());
  CHECK_THROWS_AS(([] {
                    autograd::DetectAnomalyGuard guard;
                    log(tensor({-1}));
                  }()),
                  Error);
  CHECK_FALSE(autograd::is_anomaly_enabled());
  autograd::set_detect_anomaly(true);
  CHECK(autograd::is_anomaly_enabled());
  autograd::set_detect_anomaly(false);
}

TEST_CASE("forward: the first op producing NaN or inf is named with its line, shape, dtype and position") {
  autograd::DetectAnomalyGuard guard;
  Tensor x = tensor({4, -1, 9, -2});  // float32
  const int line = __LINE__; auto bad_log = [&] { return log(x); };
  std::string message = error_of(bad_log);
  // log(-1) is NaN: 2 of them, the first at index 1
  CHECK(message == "log: anomaly detected: output 0 ([4], float32) has 2 NaN values (first at [1]) although no input "
                   "had NaN at " + at_line(line));

  // exp(100) overflows float32 (max ~3.4e38, e^100 ~ 2.7e43): inf from finite inputs; a method call
  // names its own line too.
  Tensor big = from_vector(std::vector<float>{0, 1, 100, 2, 3, 100}, {2, 3});
  const int line_exp = __LINE__; auto bad_exp = [&] { return big.exp(); };
  message = error_of(bad_exp);
  CHECK(message.starts_with("exp: anomaly detected: output 0 ([2, 3], float32) has 2 inf values (first at [0, 2]) "
                            "although every input was finite"));
  CHECK(message.ends_with(at_line(line_exp)));

  // An operator: inf - inf is NaN although no input held NaN (inf inputs may still make NaN).
  Tensor inf = f64({kInf, 1});
  const int line_sub = __LINE__; auto bad_sub = [&] { return inf - inf; };
  message = error_of(bad_sub);
  CHECK(message.starts_with("sub: anomaly detected: output 0 ([2], float64) has 1 NaN value (first at [0])"));
  CHECK(message.ends_with(at_line(line_sub)));

  // In place: 3e38 * 2 overflows float32; self is also an input, counted before it is overwritten.
  Tensor y = tensor({3e38f, 1});
  const int line_mul = __LINE__; auto bad_mul = [&] { y.mul_(2.0); };
  message = error_of(bad_mul);
  CHECK(message.starts_with("mul: anomaly detected: output 0 ([2], float32) has 1 inf value (first at [0])"));
  CHECK(message.ends_with(at_line(line_mul)));
}

TEST_CASE("forward: ops fed NaN or inf, and ops told to write inf, are not blamed") {
  autograd::DetectAnomalyGuard guard;
  Tensor nan_in = f64({std::nan(""), 1});
  CHECK(std::isnan((nan_in * 2).to_vector<double>()[0]));  // the NaN was made elsewhere
  Tensor inf_in = f64({kInf, 1});
  CHECK((inf_in + 1).to_vector<double>()[0] == kInf);  // inf from inf
  Tensor mask = from_vector(std::vector<bool>{true, false});
  CHECK(f64({1, 2}).masked_fill(mask, -kInf).to_vector<double>()[0] == -kInf);  // an additive mask
  CHECK(full({2}, kInf).to_vector<double>()[1] == kInf);
  // softmax over -inf entries (masked positions) stays finite: nothing to report
  mf::testing::check_close(softmax(f64({-kInf, 0, 0}), 0), f64({0, 0.5, 0.5}), 1e-15, 0);
}

TEST_CASE("backward: the node whose rule makes inf or NaN is named with its forward op and line") {
  autograd::DetectAnomalyGuard guard;
  // d sqrt(x)/dx = 1 / (2 sqrt(x)): at x = 0 the forward is finite (0) but the gradient is 1/0 = inf.
  Tensor x = f64({0, 4}).set_requires_grad();
  const int line = __LINE__; Tensor y = x.sqrt();
  std::string message = error_of([&] { y.sum().backward(); });
  CHECK(message == "backward of sqrt (created at " + at_line(line) + ", inputs [2]): anomaly detected: the gradient "
                   "for input 0 ([2], float64) has 1 inf value (first at [0]) although every incoming gradient was "
                   "finite");

  // 0 * sqrt(x) at x = 0: mul's backward passes 0 to sqrt, whose rule gives 0 * inf = NaN.
  Tensor x2 = f64({1, 0}).set_requires_grad();
  const int line2 = __LINE__; Tensor z = (x2.sqrt() * 0.0).sum();
  message = error_of([&] { z.backward(); });
  CHECK(message.starts_with("backward of sqrt (created at " + at_line(line2)));
  CHECK(message.find("has 1 NaN value (first at [1]) although no incoming gradient had NaN") != std::string::npos);

  // Without anomaly mode the same backward runs through: grad = [inf, 1/4] (hand-worked).
  autograd::DetectAnomalyGuard off(false);
  Tensor x3 = f64({0, 4}).set_requires_grad();
  x3.sqrt().sum().backward();
  CHECK(x3.grad().to_vector<double>() == std::vector<double>{kInf, 0.25});
}

TEST_CASE("backward: a node that only passes on the NaN or inf it was given is not blamed") {
  // y = 2 x with an incoming gradient [NaN, inf]: mul's rule gives [NaN, inf], which it received.
  autograd::DetectAnomalyGuard guard;
  Tensor x = f64({1, 2}).set_requires_grad();
  Tensor y = x * 2.0;
  y.backward(f64({std::nan(""), kInf}));
  std::vector<double> grad = x.grad().to_vector<double>();
  CHECK(std::isnan(grad[0]));
  CHECK(grad[1] == kInf);
}

TEST_CASE("turning anomaly mode on does not change a finite computation, bit for bit") {
  // A Transformer step exercises masks (-1e9), dropout, softmax, layer norm and cross-entropy: no
  // false alarm, and the loss and every gradient are identical with the checks on.
  std::vector<std::vector<float>> plain = transformer_step();
  std::vector<std::vector<float>> checked;
  {
    autograd::DetectAnomalyGuard guard;
    checked = transformer_step();
  }
  REQUIRE(plain.size() == checked.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    CAPTURE(i);
    REQUIRE(plain[i].size() == checked[i].size());
    CHECK(std::memcmp(plain[i].data(), checked[i].data(), plain[i].size() * sizeof(float)) == 0);
  }
}
