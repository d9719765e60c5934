#include <doctest/doctest.h>

#include "helpers.h"
