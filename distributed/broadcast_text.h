// A string from one rank to all (not installed): what error messages and sharded state need to name.
#pragma once

#include "distributed/process_group.h"

#include <string>

namespace mf::distributed::detail {

/// Rank `from`'s `text` (its first 512 bytes), on every rank; the others' `text` is ignored. Collective.
std::string broadcast_text(ProcessGroup& group, const std::string& text, int from);

}  // namespace mf::distributed::detail
