// The agent's command line: torchrun's options parsed the way its argparse
// parser parses them (argparse.hpp, torchrun_options.hpp), then given their
// meaning the way torchrun's config_from_args gives it (config_from_args.hpp).
#pragma once

#include "config_from_args.hpp"
#include "torchrun_options.hpp"
