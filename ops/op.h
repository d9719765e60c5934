// Deprecated: renamed to ops/registry.h. This forwarding header goes in the next release.
#pragma once
#pragma GCC warning "ops/op.h is deprecated: include ops/registry.h"

#include "ops/registry.h"
