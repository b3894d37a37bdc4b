// Faults on purpose, for the tests that check how a run fails (a rank throwing, crashing or hanging
// mid-run). Armed only by the environment variable DELTADECK_FAULT, never by a config:
//
//   DELTADECK_FAULT="<action>@<point>[,rank=R][,step=S]"
//     action: throw (a C++ exception) | crash (the process dies at once, like SIGKILL) |
//             hang (the rank sleeps forever)
//     point:  a name passed to fault_point() (e.g. "step": the start of a training step,
//             "start": after the rank joined its group, before the first collective)
//
// With rank/step left out the fault fires on every rank / at the first step it reaches.
#pragma once

#include <cstdint>

namespace trainer {

// Fires the armed fault when point, rank and step match. Cheap when nothing is armed.
void fault_point(const char* point, int rank, int64_t step);

}  // namespace trainer
