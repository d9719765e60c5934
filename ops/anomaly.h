// Anomaly detection's scan (autograd::set_detect_anomaly in core/graph.h): the dispatcher runs it on
// each op's outputs, the backward engine on each node's gradients.
#pragma once

#include "core/tensor.h"

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace mf {

/// How many NaN and infinite elements some tensors hold together.
struct NonFiniteCount {
  int64_t nan = 0, inf = 0;
};

/// Counts NaN and inf over the floating tensors of `tensors` (other dtypes and undefined ones count 0).
NonFiniteCount count_nonfinite(const std::vector<Tensor>& tensors);

/// Describes the first of `results` that holds NaN although its sources hold none, or inf although
/// its sources are all finite; empty when there is none. `sources` counts what the results were
/// computed from, and is called only when some result is non-finite. The nouns name a result
/// ("output" -> "output 1") and a source ("input") in the message.
std::string find_anomaly(const std::vector<Tensor>& results, const std::function<NonFiniteCount()>& sources,
                         std::string_view result_noun, std::string_view source_noun);

}  // namespace mf
