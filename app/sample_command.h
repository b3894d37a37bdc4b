// `deltadeck sample`: generate text from a checkpoint with cached token-by-token decoding.
#pragma once

#include "trainer/sample.h"

namespace app {

// Streams the text to stdout and a summary line to stderr; returns the exit code
// (1 when the checkpoint cannot be used, 2 for bad options). Main thread.
int run_sample(const trainer::SampleOptions& opts);

}  // namespace app
