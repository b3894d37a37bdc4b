// Faults on purpose, for the tests that check how a run fails (a rank throwing, crashing or hanging
// mid-run, a signal arriving inside a step, a loss turning NaN). Armed only by the environment
// variable DELTADECK_FAULT, never by a config:
//
//   DELTADECK_FAULT="<action>@<point>[,rank=R][,step=S][;<action>@<point>...]"
//     action: throw (a C++ exception) | crash (the process dies at once, like SIGKILL) |
//             hang (the rank sleeps forever) | sigterm | sigint | sighup (the signal is raised at
//             the point; the run goes on until its next step boundary) | sigterm2 (two SIGTERMs in a row:
//             the second one exits at once) |
//             nan (the loss becomes NaN before backward) | inf (one gradient element becomes +inf,
//             the reported loss stays finite) | spike (the loss is multiplied by 20)
//     point:  a name passed to fault_point() / fault_fires(): "start" (after the rank joined its
//             group), "step" (the start of a training step), "forward", "backward", "optimizer"
//             (before each of those parts of a step), "loss" and "grad" (for nan, inf and spike)
//
// step=S: at the point "step", S steps are complete (the boundary before step S+1); at every other
// point, S is the number of the step being computed, as it is logged and checkpointed.
// With rank/step left out the fault fires on every rank / at every step it reaches (the process
// actions throw, crash, hang and signals end that anyway). Several faults are separated by ';'.
#pragma once

#include <cstdint>

namespace trainer {

// Fires an armed process fault (throw, crash, hang, sigterm, sigint, sighup, sigterm2) when point, rank and
// step match. Cheap when nothing is armed: one getenv and a string compare. Rank threads.
void fault_point(const char* point, int rank, int64_t step);

// True when a data fault `action` (nan, inf, spike) is armed for this point, rank and step; the
// caller applies it. Rank threads.
bool fault_fires(const char* action, const char* point, int rank, int64_t step);

}  // namespace trainer
