// The corpus files a run has memory-mapped, by address range, so that a bus error (SIGBUS: a page
// of a mapped file that is no longer there, because the file was truncated or replaced while the
// run read it, or its disk failed) can be reported naming the file and the byte instead of ending
// the process without a word. The signal handler lives in app/signals.cpp.
#pragma once

#include <cstddef>
#include <string>

namespace trainer::data {

// Records [data, data + size) as the mapping of `path`; returns a handle for forget_mapping, or -1
// when every slot is taken (the file is then mapped but not named in a report). Any thread.
int remember_mapping(const void* data, size_t size, const std::string& path);
// Drops a handle of remember_mapping (-1 is ignored). Call it before unmapping. Any thread.
void forget_mapping(int handle);

// Async-signal-safe: when `addr` lies in a remembered mapping, writes "deltadeck: bus error reading
// FILE at byte N: ..." with what it means to `fd` and returns true; otherwise writes nothing.
bool report_mapped_fault(const void* addr, int fd);

}  // namespace trainer::data
