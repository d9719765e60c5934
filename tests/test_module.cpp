// nn::Module: registration, dotted names, traversal, modes, placement and state dicts.
#include <doctest/doctest.h>

#include "helpers.h"

using namespace mf;
using mf::testing::check_close;

namespace {

/// y = x @ w^T + b with hand-set values, enough to exercise the Module machinery without nn layers.
class Affine : public nn::Module {
 public:
  Affine(int64_t in, int64_t out) : Module("Affine") {
    weight = register_parameter("weight", zeros({out, in}));
    bias = register_parameter("bias", zeros({out}));
    register_buffer("calls", zeros({}, DType::Int64));
  }
  Tensor forward(const Tensor& x) override { return matmul(x, weight.t()) + bias; }
  std::string extra_repr() const override { return fmt::format("{}, {}", weight.size(1), weight.size(0)); }
  Tensor weight, bias;
};

class Net : public nn::Module {
 public:
  Net() : Module("Net") {
    body = register_module("body", std::make_shared<nn::SequentialImpl>(std::vector<std::shared_ptr<nn::Module>>{
                                       std::make_shared<Affine>(3, 4), std::make_shared<Affine>(4, 2)}));
    head = register_module("head", std::make_shared<Affine>(2, 1));
  }
  Tensor forward(const Tensor& x) override { return head->forward(body->forward(x)); }
  std::shared_ptr<nn::SequentialImpl> body;
  std::shared_ptr<Affine> head;
};

std::vector<std::string> names(const std::vector<nn::NamedTensor>& tensors) {
  std::vector<std::string> out;
  for (const auto& t : tensors) out.push_back(t.name);
  return out;
}

}  // namespace

TEST_CASE("parameters get dotted paths in registration order") {
  Net net;
  CHECK(names(net.named_parameters()) == std::vector<std::string>{"body.0.weight", "body.0.bias", "body.1.weight",
                                                                   "body.1.bias", "head.weight", "head.bias"});
  CHECK(names(net.named_buffers()) == std::vector<std::string>{"body.0.calls", "body.1.calls", "head.calls"});
  CHECK(net.parameter_count() == 3 * 4 + 4 + 4 * 2 + 2 + 2 + 1);
  std::vector<std::string> paths;
  for (auto& [path, module] : net.named_modules()) paths.push_back(path);
  CHECK(paths == std::vector<std::string>{"", "body", "body.0", "body.1", "head"});
  for (const Tensor& p : net.parameters()) CHECK(p.requires_grad());
}

TEST_CASE("the same name twice, an empty name or a dotted name is refused") {
  struct Bad : nn::Module {
    explicit Bad(const std::string& second) : Module("Bad") {
      register_parameter("w", zeros({1}));
      register_buffer(second, zeros({1}));
    }
  };
  CHECK_THROWS_WITH_AS(Bad("w"), "Bad: the name 'w' is registered twice", Error);
  CHECK_THROWS_WITH_AS(Bad("a.b"), "Bad: 'a.b' is not a valid name (non-empty, without dots)", Error);
}

TEST_CASE("train/eval propagate to every descendant") {
  Net net;
  net.eval();
  for (auto& [path, module] : net.named_modules()) CHECK_FALSE(module->is_training());
  net.train();
  for (auto& [path, module] : net.named_modules()) CHECK(module->is_training());
}

TEST_CASE("to(dtype) converts in place, so held handles see it") {
  Net net;
  Tensor held = net.head->weight;
  net.to(DType::Float64);
  CHECK(held.dtype() == DType::Float64);
  CHECK(net.head->weight.dtype() == DType::Float64);
  CHECK(held.requires_grad());
  CHECK(find(net.state_dict(), "head.calls")->dtype() == DType::Int64);  // integer buffers stay
}

TEST_CASE("state_dict round trip and strict / non-strict loading") {
  Net a, b;
  {
    NoGradGuard no_grad;
    for (Tensor& p : a.parameters()) p.copy_(uniform(p.shape(), -1, 1));
  }
  b.load_state_dict(a.state_dict());
  Tensor x = randn({5, 3});
  check_close(b.forward(x), a.forward(x), 0, 0);
}

TEST_CASE("strict loading lists every missing, unexpected and mismatched key and changes nothing") {
  Net net;
  nn::StateDict state = net.state_dict();
  state.erase(state.begin());                                // body.0.weight missing
  state.push_back({"extra.weight", zeros({1})});            // unexpected
  for (auto& entry : state)
    if (entry.name == "head.bias") entry.tensor = zeros({3});  // mismatched shape
  Tensor before = net.head->weight.clone();
  CHECK_THROWS_WITH_AS(net.load_state_dict(state), doctest::Contains("missing key: body.0.weight"), Error);
  CHECK_THROWS_WITH_AS(net.load_state_dict(state), doctest::Contains("unexpected key: extra.weight"), Error);
  CHECK_THROWS_WITH_AS(net.load_state_dict(state),
                       doctest::Contains("mismatched: head.bias: checkpoint has [3] float32, model has [1] float32"),
                       Error);
  nn::LoadReport report = net.load_state_dict(state, false);
  CHECK(report.missing == std::vector<std::string>{"body.0.weight"});
  CHECK(report.unexpected == std::vector<std::string>{"extra.weight"});
  CHECK(report.mismatched.size() == 1);
  check_close(net.head->weight, before, 0, 0);
}

TEST_CASE("zero_grad drops gradients; printing shows the tree") {
  Net net;
  net.forward(ones({2, 3})).sum().backward();
  CHECK(net.head->weight.grad().defined());
  net.zero_grad();
  for (const Tensor& p : net.parameters()) CHECK_FALSE(p.grad().defined());
  CHECK(net.to_string() ==
        "Net(\n  (body): Sequential(\n    (0): Affine(3, 4)\n    (1): Affine(4, 2)\n  )\n  (head): Affine(2, 1)\n)");
}

TEST_CASE("layers built from positional arguments and a ModuleList in a range-for, as libtorch code writes them") {
  nn::Linear fc(2, 3);  // torch::nn::Linear(2, 3): a holder, called like a function
  CHECK(fc->weight.shape() == Shape{3, 2});
  CHECK(fc->bias.shape() == Shape{3});
  nn::Linear no_bias(2, 3, false);
  CHECK_FALSE(no_bias->bias.defined());
  CHECK(no_bias->parameters().size() == 1);
  nn::Embedding embedding(10, 4);
  CHECK(embedding->weight.shape() == Shape{10, 4});
  CHECK_FALSE(embedding->options().padding_idx.has_value());
  nn::Dropout dropout(0.25);
  CHECK(dropout->options().p == 0.25);
  CHECK(nn::Dropout()->options().p == 0.5);  // torch's default
  nn::LayerNorm norm(4);  // torch.nn.LayerNorm(4)
  CHECK(norm->options().normalized_shape == Shape{4});
  CHECK(norm->options().eps == 1e-5);
  nn::MultiHeadAttention attention(8, 2);  // torch.nn.MultiheadAttention(8, 2)
  CHECK(attention->head_dim() == 4);
  CHECK_FALSE(attention->options().causal);

  nn::ModuleList layers(fc, nn::ReLU(), nn::Linear(3, 1));
  Tensor x = randn({5, 2}), h = x;
  int visited = 0;
  for (const auto& layer : *layers) {  // std::shared_ptr<nn::Module>, in registration order
    h = (*layer)(h);
    ++visited;
  }
  CHECK(visited == 3);
  Tensor expected = layers->at<nn::LinearImpl>(2)->forward(fc(x).relu());
  CHECK(h.to_vector<float>() == expected.to_vector<float>());
}

namespace {

/// A user's module as libtorch code writes one: an Impl class with holder members, and MF_MODULE.
struct TwoLayerImpl : nn::Module {
  TwoLayerImpl(int64_t in, int64_t hidden, int64_t out) : Module("TwoLayer") {
    fc1 = register_module("fc1", nn::Linear(in, hidden));
    fc2 = register_module("fc2", nn::Linear(hidden, out));
  }
  static constexpr int kForwardLine = __LINE__ + 1;
  Tensor forward(const Tensor& x) override { return fc2(fc1(x).relu()); }
  nn::Linear fc1{nullptr}, fc2{nullptr};
};
MF_MODULE(TwoLayer);

/// A module whose own code (not a child's) makes the bad call.
struct BadProductImpl : nn::Module {
  BadProductImpl() : Module("BadProduct") {}
  static constexpr int kForwardLine = __LINE__ + 1;
  Tensor forward(const Tensor& x) override { return matmul(x, x); }
};
MF_MODULE(BadProduct);

std::string at_line(int line) { return fmt::format("test_module.cpp:{}", line); }

}  // namespace

TEST_CASE("module holders: made from positional arguments or options, called as layer(x), registered as children") {
  manual_seed(3);
  TwoLayer net(4, 8, 2);
  CHECK(names(net->named_parameters()) == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
  Tensor x = randn({3, 4});
  Tensor y = net(x);
  // The same arithmetic written out with the functional API on the registered parameters.
  Tensor expected = linear(linear(x, net->fc1->weight, net->fc1->bias).relu(), net->fc2->weight, net->fc2->bias);
  CHECK(y.to_vector<float>() == expected.to_vector<float>());

  // A copy of a holder shares the module, as a shared_ptr does.
  TwoLayer same = net;
  CHECK(same.get() == net.get());
  CHECK(net->children().size() == 2);
  CHECK(net->children()[0].get() == net->fc1.get());

  // Holders from options (designated initializers) and into a Sequential, which is a holder too.
  nn::GELU gelu({.approximate = "tanh"});
  CHECK(gelu->options().approximate == "tanh");
  nn::Sequential stack(nn::Linear(4, 3), nn::ReLU(), nn::Linear(3, 1));
  stack->push_back(nn::Dropout(0.0));
  CHECK(stack->size() == 4);
  CHECK(stack(x).shape() == Shape{3, 1});

  // An empty holder (a member before its constructor registers it) says so when used.
  nn::Linear empty{nullptr};
  CHECK(empty.is_empty());
  CHECK_FALSE(static_cast<bool>(empty));
  CHECK_THROWS_WITH_AS(empty->weight, doctest::Contains("empty module holder"), Error);
}

TEST_CASE("an error inside a module names the line of the user's code that called it") {
  TwoLayer net(4, 8, 2);
  // The bad input reaches fc1's linear inside miniflow; the message ends with the layer's type and
  // the line in TwoLayer's forward that called it, added once (not again for net(...) below).
  std::string message;
  try {
    net(randn({3, 5}));
  } catch (const Error& error) {
    message = error.what();
  }
  CHECK(message.find("linear: ") == 0);
  CHECK(message.ends_with(fmt::format("(in Linear called at {})", at_line(TwoLayerImpl::kForwardLine))));
  CHECK(message.find("TwoLayer") == std::string::npos);

  // The same through the plain Module call operator and a shared_ptr.
  auto embedding = std::make_shared<nn::EmbeddingImpl>(10, 4);
  int call_line = __LINE__ + 1;
  CHECK_THROWS_WITH_AS((*embedding)(zeros({2, 3})),
                       doctest::Contains(fmt::format("(in Embedding called at {})", at_line(call_line)).c_str()), Error);

  // An error from the module's own code keeps its own line and gains the caller's.
  BadProduct bad;
  call_line = __LINE__ + 1;
  CHECK_THROWS_WITH_AS(bad(randn({2, 3})),
                       doctest::Contains(fmt::format("at {} (in BadProduct called at {})",
                                                     at_line(BadProductImpl::kForwardLine), at_line(call_line))
                                             .c_str()),
                       Error);

  // Losses take the caller's line directly, as the functional form does.
  nn::CrossEntropyLoss criterion;
  call_line = __LINE__ + 1;
  CHECK_THROWS_WITH_AS(criterion(randn({2, 3}), zeros({3}, DType::Int64)),
                       doctest::Contains(fmt::format("at {}", at_line(call_line)).c_str()), Error);
}

namespace {

/// A language model's embedding and output head tied, as GPT-2 ties them.
struct TiedImpl : nn::Module {
  TiedImpl() : Module("Tied") {
    wte = register_module("wte", nn::Embedding(5, 3));
    head = register_module("head", nn::Linear(3, 5, false));
    nn::tie_weights(*head, *wte);
  }
  Tensor forward(const Tensor& tokens) override { return head(wte(tokens)); }
  nn::Embedding wte{nullptr};
  nn::Linear head{nullptr};
};
MF_MODULE(Tied);

}  // namespace

TEST_CASE("tie_weights leaves one parameter, trained through both uses and saved under both names") {
  manual_seed(11);
  Tied model;
  CHECK(model->head->weight.is_same(model->wte->weight));
  CHECK(names(model->named_parameters()) == std::vector<std::string>{"wte.weight"});
  CHECK(model->parameter_count() == 15);
  CHECK(names(model->state_dict()) == std::vector<std::string>{"wte.weight", "head.weight"});

  // The gradient is the sum over both uses: the same loss written with one tensor W in both places.
  Tensor tokens = from_vector(std::vector<int>{0, 3, 3, 1}, {4});
  Tensor weights = randn({4, 5});
  (model(tokens) * weights).sum().backward();
  Tensor w = model->wte->weight.detach().clone().set_requires_grad(true);
  (linear(embedding(w, tokens), w) * weights).sum().backward();
  check_close(model->wte->weight.grad(), w.grad(), 1e-6, 1e-6);

  nn::Linear wrong(3, 4, false);
  CHECK_THROWS_WITH_AS(nn::tie_weights(*wrong, *model->wte),
                       doctest::Contains("tie_weights: the Linear's weight is [4, 3] float32 on cpu, the Embedding's is [5, 3]"),
                       Error);
}
