// Deprecated: moved to text/tokenizer.h, namespace mf::text. This forwarding header goes in the next release.
#pragma once
#pragma GCC warning "models/tokenizer.h is deprecated: include text/tokenizer.h (namespace mf::text)"

#include "text/tokenizer.h"

namespace mf {
using text::TokenizerOptions;
using text::Tokenizer;
using text::find_invalid_utf8;
}  // namespace mf
