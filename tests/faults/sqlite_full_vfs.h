// A SQLite VFS for tests that fills up: it wraps the default VFS and, once armed, fails every write
// beyond a byte budget with SQLITE_FULL (what the unix VFS returns on ENOSPC), on the database, its
// WAL and its journal alike. Registered as the default VFS, so RunStore and MetricsWriter use it
// unchanged.
#pragma once

#include <cstdint>

namespace faults {

// Registers the VFS as the process default (once). Any thread.
void install_full_vfs();
// From now on, allow `bytes` more bytes of writes, then fail each write with SQLITE_FULL; < 0
// disarms (writes succeed again, as when space is freed).
void set_full_vfs_budget(int64_t bytes);
// Writes failed so far.
int64_t full_vfs_failures();

}  // namespace faults
