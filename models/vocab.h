// Deprecated: moved to text/vocab.h, namespace mf::text. This forwarding header goes in the next release.
#pragma once
#pragma GCC warning "models/vocab.h is deprecated: include text/vocab.h (namespace mf::text)"

#include "text/vocab.h"

namespace mf {
using text::TokenCounts;
using text::count_tokens;
using text::VocabOptions;
using text::EncodeOptions;
using text::Vocab;
}  // namespace mf
