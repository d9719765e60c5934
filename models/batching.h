// Deprecated: moved to text/batching.h, namespace mf::text. This forwarding header goes in the next release.
#pragma once
#pragma GCC warning "models/batching.h is deprecated: include text/batching.h (namespace mf::text)"

#include "text/batching.h"

namespace mf {
using text::BatchingOptions;
using text::Batch;
using text::uniform_below;
using text::fisher_yates_shuffle;
using text::make_batches;
}  // namespace mf
