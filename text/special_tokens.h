// The special tokens every vocabulary holds at fixed ids, defined once: Vocab builds around them,
// decoding starts, stops and pads with them, and the Transformer's masks and loss skip the padding.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace mf::text {

/// Padding: fills batches to a common length; masks and the loss ignore it.
inline constexpr int64_t kPadId = 0;
/// Start of sequence: the decoder's first input.
inline constexpr int64_t kSosId = 1;
/// End of sequence: ends every source and target, and stops decoding.
inline constexpr int64_t kEosId = 2;
/// Unknown: stands for every token the vocabulary does not hold.
inline constexpr int64_t kUnkId = 3;
/// How many ids the specials take: a vocabulary's own tokens start here.
inline constexpr int64_t kSpecialTokenCount = 4;
/// The special tokens' text, indexed by id.
inline constexpr std::array<std::string_view, kSpecialTokenCount> kSpecialTokenTexts{"<pad>", "<sos>", "<eos>",
                                                                                     "<unk>"};

}  // namespace mf::text
