// A user's program that includes miniflow's umbrella header, built with -Wall -Wextra
// -Woverloaded-virtual -Wmissing-field-initializers -Werror (tests/meson.build): a warning from
// miniflow's own headers fails the build, since it would land in every user's build log.
#include "miniflow.h"

struct NetImpl : mf::nn::Module {
  NetImpl() : Module("Net") { fc = register_module("fc", mf::nn::Linear(2, 3)); }
  mf::Tensor forward(const mf::Tensor& x) override { return fc(x); }
  mf::nn::Linear fc{nullptr};
};
MF_MODULE(Net);

int main() {
  Net net;
  mf::nn::Sequential stack(mf::nn::Linear(3, 3), mf::nn::GELU({.approximate = "tanh"}));
  mf::Tensor y = stack(net(mf::ones({1, 2})));
  return y.shape() == mf::Shape{1, 3} ? 0 : 1;
}
