#include "distributed/broadcast_text.h"

#include "ops/functional.h"

#include <algorithm>
#include <vector>

namespace mf::distributed::detail {

std::string broadcast_text(ProcessGroup& group, const std::string& text, int from) {
  constexpr int64_t kMaxChars = 512;
  std::vector<int64_t> codes(kMaxChars, 0);
  if (group.rank() == from)
    for (size_t i = 0; i < std::min<size_t>(text.size(), kMaxChars); ++i)
      codes[i] = static_cast<unsigned char>(text[i]);
  Tensor t = from_vector(codes, {kMaxChars}).to(group.device());
  group.broadcast(t, from);
  std::string out;
  for (int64_t code : t.to(Device::cpu()).to_vector<int64_t>()) {
    if (code == 0) break;
    out.push_back(static_cast<char>(code));
  }
  return out;
}

}  // namespace mf::distributed::detail
