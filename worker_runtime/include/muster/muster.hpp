// Everything libmuster offers C++ training code.
#pragma once

#include "muster/process_group.hpp"
#include "muster/sampler.hpp"
