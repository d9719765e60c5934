// miniflow: a deep learning framework in C++20. This one header reaches everything a user needs.
#pragma once

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "models/batching.h"
#include "models/bleu.h"
#include "models/corpus.h"
#include "models/tokenizer.h"
#include "models/vocab.h"
