// A user's program that includes miniflow's umbrella header, built with -Wall -Wextra
// -Woverloaded-virtual -Wmissing-field-initializers -Werror (tests/meson.build): a warning from
// miniflow's own headers fails the build, since it would land in every user's build log.
#include "miniflow.h"

int main() {
  mf::nn::Linear layer(2, 3);
  mf::Tensor y = layer(mf::ones({1, 2}));
  return y.shape() == mf::Shape{1, 3} ? 0 : 1;
}
