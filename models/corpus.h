// Deprecated: moved to text/corpus.h, namespace mf::text. This forwarding header goes in the next release.
#pragma once
#pragma GCC warning "models/corpus.h is deprecated: include text/corpus.h (namespace mf::text)"

#include "text/corpus.h"

namespace mf {
using text::CorpusOptions;
using text::CorpusStats;
using text::Corpus;
using text::read_parallel_corpus;
using text::make_corpus;
}  // namespace mf
