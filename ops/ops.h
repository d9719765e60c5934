// Deprecated: renamed to ops/functional.h. This forwarding header goes in the next release.
#pragma once
#pragma GCC warning "ops/ops.h is deprecated: include ops/functional.h"

#include "ops/functional.h"
