// miniflow: a deep learning framework in C++20. This one header reaches everything a user needs.
#pragma once

#include "core/allocator.h"
#include "core/atomic_file.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/format.h"
#include "core/generator.h"
#include "core/graph.h"
#include "core/isa.h"
#include "core/parallel.h"
#include "core/safetensors.h"
#include "core/shape.h"
#include "core/tensor.h"

#include "ops/registry.h"
#include "ops/functional.h"

#include "cuda/cuda.h"

#include "autograd/autograd.h"

#include "nn/checkpoint.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/attention.h"
#include "nn/feed_forward.h"
#include "nn/positional_encoding.h"

#include "optim/adam.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"
#include "optim/sgd.h"
#include "optim/training_state.h"

#include "text/batching.h"
#include "text/bleu.h"
#include "text/corpus.h"
#include "text/special_tokens.h"
#include "models/generation.h"
#include "text/tokenizer.h"
#include "models/transformer.h"
#include "models/translation.h"
#include "text/vocab.h"

#include "train/svg.h"
#include "train/toy_corpus.h"
#include "train/train_loop.h"
