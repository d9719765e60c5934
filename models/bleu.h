// Deprecated: moved to text/bleu.h, namespace mf::text. This forwarding header goes in the next release.
#pragma once
#pragma GCC warning "models/bleu.h is deprecated: include text/bleu.h (namespace mf::text)"

#include "text/bleu.h"

namespace mf {
using text::BleuSmoothing;
using text::BleuScore;
using text::corpus_bleu;
using text::sentence_bleu;
}  // namespace mf
