// Fuzz target: vocabulary JSON (what Vocab::load reads from a file) -> Vocab::from_json.
//
// A vocabulary that loads must keep the specials at their ids, map every token back to its id, and
// survive to_json / from_json unchanged.
#include "fuzz/fuzz.h"
#include "miniflow.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mf::fuzz::expect_only_mf_errors([&] {
    mf::text::Vocab vocab = mf::text::Vocab::from_json(mf::fuzz::as_text(data, size), "fuzz input");
    mf::fuzz::require(vocab.size() >= mf::text::kSpecialTokenCount, "a vocabulary holds the specials");
    for (int64_t id = 0; id < vocab.size(); ++id) {
      if (id < mf::text::kSpecialTokenCount)
        mf::fuzz::require(vocab.token(id) == mf::text::kSpecialTokenTexts[static_cast<size_t>(id)],
                          "the specials sit at ids 0..3");
      mf::fuzz::require(!vocab.token(id).empty() && vocab.id(vocab.token(id)) == id, "each token maps to its own id");
    }
    mf::fuzz::require(mf::text::Vocab::from_json(vocab.to_json()) == vocab, "to_json / from_json round-trips");
  });
  return 0;
}
