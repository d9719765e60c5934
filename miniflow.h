// miniflow: a deep learning framework in C++20. This one header reaches everything a user needs.
#pragma once

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/safetensors.h"
