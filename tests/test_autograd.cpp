// The autograd engine: accumulation, graph shapes (shared nodes, diamonds), retain_graph, grad mode,
// detach, in-place safety, error messages with call sites, autograd::grad, gradcheck, and the
// engine's un-broadcasting and dtype handling.
#include <doctest/doctest.h>

#include "helpers.h"
#include "ops/reference.h"

#include <string>
#include <thread>

using namespace mf;
using mf::testing::check_close;
using mf::testing::f64;

namespace {

/// A float64 leaf that requires grad.
Tensor leaf(const std::vector<double>& values, const Shape& shape = {}) {
  return f64(values, shape).set_requires_grad();
}

std::string at_line(int line) { return fmt::format("test_autograd.cpp:{}", line); }

}  // namespace

// ---- accumulation and graph shapes --------------------------------------------------------------

TEST_CASE("gradients accumulate across backward calls") {
  Tensor x = leaf({1, -2, 3});
  sum(x * x).backward();
  check_close(x.grad(), f64({2, -4, 6}), 0, 0);  // d/dx sum x^2 = 2x
  sum(x * x).backward();
  check_close(x.grad(), f64({4, -8, 12}), 0, 0);  // a fresh graph adds another 2x
  x.set_grad(Tensor());
  sum(x).backward();
  check_close(x.grad(), f64({1, 1, 1}), 0, 0);
}

TEST_CASE("shared subexpressions sum their contributions") {
  Tensor x = leaf({1, 2, 3});
  sum(x * x + x * x).backward();  // 2 x^2 -> 4x
  check_close(x.grad(), f64({4, 8, 12}), 0, 0);

  Tensor z = leaf({1, 2, 3});
  Tensor a = z * z;
  sum(a + a).backward();  // one node reached along two edges: still 4z
  check_close(z.grad(), f64({4, 8, 12}), 0, 0);
}

TEST_CASE("diamond graph") {
  // x -> a = 2x, x -> b = x^2, c = a * b = 2x^3: dc/dx = 6x^2.
  Tensor x = leaf({1, -2, 0.5});
  Tensor a = x * 2.0;
  Tensor b = x * x;
  sum(a * b).backward();
  check_close(x.grad(), f64({6, 24, 1.5}), 1e-15, 0);
}

TEST_CASE("gradients through views reach the right elements") {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  // x.t() is [3, 2]; its row 1 is x[:, 1] = {2, 5}; the slice keeps column 1 of x.t() -> x[1][1].
  Tensor picked = x.t().select(0, 1);
  Tensor y = picked * picked.slice(0, 1, 2);  // {2 * 5, 5 * 5}
  sum(y).backward();
  // d/dx01 (x01 x11) = x11 = 5; d/dx11 (x01 x11 + x11^2) = x01 + 2 x11 = 12.
  check_close(x.grad(), f64({0, 5, 0, 0, 12, 0}, {2, 3}), 0, 0);
}

TEST_CASE("broadcasting: gradients are summed back to the input shapes") {
  Tensor x = leaf({1, 2, 3}, {3, 1});
  Tensor y = leaf({1, 10, 100, 1000}, {1, 4});
  Tensor z = x * y;  // [3, 4]
  CHECK(z.shape() == Shape{3, 4});
  sum(z).backward();
  // dz/dx_i = sum_j y_j = 1111; dz/dy_j = sum_i x_i = 6.
  check_close(x.grad(), f64({1111, 1111, 1111}, {3, 1}), 0, 0);
  check_close(y.grad(), f64({6, 6, 6, 6}, {1, 4}), 0, 0);

  Tensor s = leaf({2});  // a scalar broadcast against a matrix
  sum(s + zeros({2, 3}, DType::Float64)).backward();
  check_close(s.grad(), f64({6}), 0, 0);
}

TEST_CASE("gradients keep the input's dtype through casts") {
  Tensor x = from_vector(std::vector<float>{1, 2}).set_requires_grad();
  Tensor y = x.to(DType::Float64);
  sum(y * y).backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().dtype() == DType::Float32);
  check_close(x.grad(), from_vector(std::vector<float>{2, 4}), 0, 0);

  Tensor i = from_vector(std::vector<int64_t>{3, 4});
  Tensor w = leaf({0.5, 0.5});
  sum(i * w).backward();  // the int64 operand is cast to float64 and gets no gradient
  check_close(w.grad(), f64({3, 4}), 0, 0);
}

// ---- backward's contract ------------------------------------------------------------------------

TEST_CASE("retain_graph allows a second backward; without it the second one throws") {
  Tensor x = leaf({1, 2});
  Tensor y = sum(x * x);
  y.backward({}, /*retain_graph=*/true);
  y.backward();
  check_close(x.grad(), f64({4, 8}), 0, 0);

  Tensor z = sum(x * x);
  z.backward();
  CHECK_THROWS_WITH_AS(z.backward(), doctest::Contains("retain_graph"), Error);
}

TEST_CASE("backward needs a scalar or an explicit gradient, and a graph") {
  Tensor x = leaf({1, 2, 3});
  Tensor y = x * x;
  CHECK_THROWS_WITH_AS(y.backward(), doctest::Contains("only for a one-element tensor, got shape [3]"), Error);
  CHECK_THROWS_WITH_AS(y.backward(f64({1, 1})), doctest::Contains("gradient of shape [2] does not match"), Error);
  y.backward(f64({1, 0, -1}));
  check_close(x.grad(), f64({2, 0, -6}), 0, 0);  // 2x * gradient

  CHECK_THROWS_WITH_AS(sum(f64({1, 2})).backward(), doctest::Contains("does not require grad"), Error);
  CHECK_THROWS_WITH_AS(Tensor().backward(), doctest::Contains("undefined"), Error);

  Tensor s = leaf({3});  // a scalar leaf is its own root
  s.backward();
  check_close(s.grad(), f64({1}), 0, 0);
}

TEST_CASE("requires_grad is for floating leaves") {
  CHECK_THROWS_WITH_AS(ones({2}, DType::Int64).set_requires_grad(), doctest::Contains("only floating tensors"),
                       Error);
  Tensor x = leaf({1});
  Tensor y = x * x;
  CHECK_FALSE(y.is_leaf());
  CHECK(y.requires_grad());
  CHECK_THROWS_WITH_AS(y.set_requires_grad(false), doctest::Contains("only leaves"), Error);
  CHECK_FALSE((f64({1}) * f64({2})).requires_grad());
}

// ---- grad mode and detach -----------------------------------------------------------------------

TEST_CASE("NoGradGuard stops recording for its scope, on its thread only") {
  Tensor x = leaf({1, 2});
  {
    NoGradGuard no_grad;
    CHECK_FALSE(grad_mode_enabled());
    Tensor y = x * x;
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
    {
      NoGradGuard nested;
    }
    CHECK_FALSE(grad_mode_enabled());  // the nested guard restores "off", not "on"

    bool other_thread_records = false;
    std::thread([&] { other_thread_records = grad_mode_enabled() && (x * x).requires_grad(); }).join();
    CHECK(other_thread_records);
  }
  CHECK(grad_mode_enabled());
  CHECK((x * x).requires_grad());

  std::thread([] { NoGradGuard off_elsewhere; }).join();
  CHECK(grad_mode_enabled());
}

TEST_CASE("detach cuts the graph and shares the data") {
  Tensor x = leaf({1, 2, 3});
  Tensor d = (x * x).detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.is_leaf());
  sum(d * x).backward();  // d counts as a constant: the gradient is d = x^2, not 3x^2
  check_close(x.grad(), f64({1, 4, 9}), 0, 0);

  Tensor e = x.detach();
  CHECK(e.storage() == x.storage());
  e.fill_(7);  // no longer tracked, so writing is allowed, and x sees it
  CHECK(x.to_vector<double>() == std::vector<double>{7, 7, 7});
}

// ---- in-place safety ----------------------------------------------------------------------------

TEST_CASE("in-place writes to tensors autograd tracks are refused") {
  Tensor x = leaf({1, 2});
  CHECK_THROWS_WITH_AS(x.add_(1.0), doctest::Contains("in-place operation on a tensor that requires grad"), Error);
  Tensor w = f64({1, 1});
  CHECK_THROWS_WITH_AS(w.add_(x), doctest::Contains("in-place operation on a tensor that requires grad"), Error);
  CHECK_THROWS_WITH_AS((x * x).mul_(2.0), doctest::Contains("requires grad"), Error);
  {
    NoGradGuard no_grad;  // the way optimizers update parameters
    x.sub_(f64({1, 1}));
  }
  CHECK(x.to_vector<double>() == std::vector<double>{0, 1});
}

TEST_CASE("modifying a saved tensor in place makes backward fail, naming the op and its line") {
  Tensor x = leaf({1, 2});
  Tensor w = f64({3, 4});
  const int line = __LINE__; Tensor y = sum(mul(x, w));  // mul saves w for dx = g * w
  w.add_(1.0);  // w does not require grad, so the write itself is allowed
  CHECK_THROWS_WITH_AS(y.backward(), doctest::Contains("modified in place"), Error);
  CHECK_THROWS_WITH_AS(y.backward(), doctest::Contains(at_line(line).c_str()), Error);

  Tensor v = leaf({1, 2});
  const int line_v = __LINE__; Tensor z = sum(v * v);
  {
    NoGradGuard no_grad;
    v.mul_(2.0);
  }
  try {
    z.backward();
    FAIL("backward should have thrown");
  } catch (const Error& error) {
    std::string message = error.what();
    CHECK(message.find("backward of mul") != std::string::npos);
    CHECK(message.find(at_line(line_v)) != std::string::npos);
    CHECK(message.find("modified in place") != std::string::npos);
  }
}

// ---- call sites in forward errors ---------------------------------------------------------------

TEST_CASE("forward errors name the op and the caller's line") {
  Tensor a = zeros({2, 3}), b = zeros({4, 5});
  const int line = __LINE__; auto bad_matmul = [&] { return mf::matmul(a, b); };
  std::string expected = "matmul: cannot multiply [2, 3] by [4, 5] (3 != 4) at " + at_line(line);
  CHECK_THROWS_WITH_AS(bad_matmul(), expected.c_str(), Error);

  Tensor c = zeros({4});
  const int line_add = __LINE__; auto bad_add = [&] { return a + c; };
  expected = "add: shapes [2, 3] and [4] do not broadcast (dim 1: 3 vs 4) at " + at_line(line_add);
  CHECK_THROWS_WITH_AS(bad_add(), expected.c_str(), Error);
  const int line_mul = __LINE__; auto bad_method = [&] { return a.mul(c); };
  CHECK_THROWS_WITH_AS(bad_method(), doctest::Contains("mul: shapes [2, 3] and [4]"), Error);
  CHECK_THROWS_WITH_AS(bad_method(), doctest::Contains(at_line(line_mul).c_str()), Error);
}

// ---- autograd::grad and gradcheck ---------------------------------------------------------------

TEST_CASE("autograd::grad returns gradients without touching .grad") {
  Tensor x = leaf({1, 2, 3});
  Tensor y = leaf({4, 5, 6});
  std::vector<Tensor> grads = autograd::grad({sum(x * y)}, {x, y});
  REQUIRE(grads.size() == 2);
  check_close(grads[0], f64({4, 5, 6}), 0, 0);
  check_close(grads[1], f64({1, 2, 3}), 0, 0);
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(y.grad().defined());

  Tensor unused = leaf({1});
  CHECK_THROWS_WITH_AS(autograd::grad({sum(x * x)}, {x, unused}), doctest::Contains("is not connected"), Error);
  std::vector<Tensor> partial = autograd::grad({sum(x * x)}, {x, unused}, {}, false, /*allow_unused=*/true);
  check_close(partial[0], f64({2, 4, 6}), 0, 0);
  CHECK_FALSE(partial[1].defined());
  CHECK_THROWS_WITH_AS(autograd::grad({sum(x * x)}, {x * x}), doctest::Contains("must be a leaf"), Error);
}

// ---- post-accumulate-grad hooks ------------------------------------------------------------------

TEST_CASE("a post-accumulate-grad hook sees the leaf's whole gradient, once per backward") {
  Tensor x = leaf({1, -2, 3});
  Tensor seen;
  int calls = 0;
  autograd::HookHandle handle = autograd::register_post_accumulate_grad_hook(x, [&](Tensor& grad_leaf) {
    ++calls;
    CHECK(grad_leaf.is_same(x));
    seen = grad_leaf.grad().clone();
  });
  // x reaches the loss by three paths (x * x uses it twice): d/dx sum(x * x + x) = 2x + 1.
  sum(x * x + x).backward();
  CHECK(calls == 1);
  check_close(seen, f64({3, -3, 7}), 0, 0);
  sum(x).backward();  // the second backward adds 1 to what the first left in .grad
  CHECK(calls == 2);
  check_close(seen, f64({4, -2, 8}), 0, 0);
  handle.remove();
  sum(x).backward();
  CHECK(calls == 2);
}

TEST_CASE("hooks fire as each leaf's gradient is final: the last layer's first") {
  Tensor w1 = leaf({0.5, -1}, {2, 1}), w2 = leaf({2, 3}, {1, 2}), x = f64({1, 2, 3}, {1, 3});
  std::vector<std::string> order;
  auto h1 = autograd::register_post_accumulate_grad_hook(w1, [&](Tensor&) { order.push_back("w1"); });
  auto h2 = autograd::register_post_accumulate_grad_hook(w2, [&](Tensor&) {
    order.push_back("w2");
    CHECK(!w1.grad().defined());  // w1's gradient comes later, from the node below w2's
  });
  sum(matmul(w2, matmul(w1, x))).backward();
  CHECK(order == std::vector<std::string>{"w2", "w1"});
}

TEST_CASE("hooks: a leaf backward does not reach is not called; grad() calls none; a root leaf is") {
  Tensor x = leaf({1, 2}), unused = leaf({5});
  int x_calls = 0, unused_calls = 0;
  auto hx = autograd::register_post_accumulate_grad_hook(x, [&](Tensor&) { ++x_calls; });
  auto hu = autograd::register_post_accumulate_grad_hook(unused, [&](Tensor&) { ++unused_calls; });
  autograd::grad({sum(x * x)}, {x});
  CHECK(x_calls == 0);
  x.backward(f64({1, 1}));  // the root is the leaf itself
  CHECK(x_calls == 1);
  sum(x * x).backward();
  CHECK((x_calls == 2 && unused_calls == 0));
  CHECK_THROWS_WITH_AS(autograd::register_post_accumulate_grad_hook(f64({1}), [](Tensor&) {}),
                       doctest::Contains("expects a leaf tensor that requires grad"), Error);
}

TEST_CASE("gradcheck agrees on a composite function and catches a wrong gradient") {
  Tensor a = reference::randn({2, 3}, 101).set_requires_grad();
  Tensor b = reference::randn({3, 4}, 102).set_requires_grad();
  Tensor c = reference::randn({2, 4}, 103).set_requires_grad();
  auto composite = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{sum(mul(matmul(in[0], in[1]), in[2]))};
  };
  CHECK(autograd::gradcheck(composite, {a, b, c}) == "");
  // (a - row 0 of m) / (rows 1:3 of m ^2 + 1), with m a transposed (non-contiguous) leaf [4, 3].
  Tensor m = reference::randn({3, 4}, 104).t().set_requires_grad();
  auto broadcasting = [](const std::vector<Tensor>& in) {
    Tensor rows = in[1].slice(0, 1, 3);
    return std::vector<Tensor>{div(in[0] - in[1].slice(0, 0, 1), rows * rows + 1.0)};
  };
  CHECK(autograd::gradcheck(broadcasting, {a, m}) == "");

  // Treating one factor as a constant halves the true derivative of x^2.
  auto wrong = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * in[0].detach()}; };
  CHECK(autograd::gradcheck(wrong, {a}).find("analytic") != std::string::npos);
  CHECK_THROWS_WITH_AS(autograd::gradcheck(wrong, {ones({2}).set_requires_grad()}),
                       doctest::Contains("must be float64"), Error);
}
