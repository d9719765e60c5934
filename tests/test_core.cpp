#include <doctest/doctest.h>

#include "miniflow.h"

TEST_CASE("device names parse and print") {
  CHECK(mf::Device::parse("cpu") == mf::Device::cpu());
  CHECK(mf::Device::parse("cuda:1").str() == "cuda:1");
  CHECK_THROWS_WITH_AS(mf::Device::parse("tpu"), "unknown device 'tpu' (expected cpu, cuda or cuda:N)", mf::Error);
}
