// The wrapper holds the real file right after its own header (szOsFile covers both) and forwards
// every method to it; only xWrite checks the budget.
#include "tests/faults/sqlite_full_vfs.h"

#include <sqlite3.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace faults {
namespace {

std::atomic<int64_t> g_budget{-1};
std::atomic<int64_t> g_failures{0};
sqlite3_vfs* g_real = nullptr;
sqlite3_vfs g_vfs;

struct File {
  sqlite3_file base;
  sqlite3_file* real() { return reinterpret_cast<sqlite3_file*>(this + 1); }
};

sqlite3_file* real_of(sqlite3_file* f) { return reinterpret_cast<File*>(f)->real(); }

int x_close(sqlite3_file* f) { return real_of(f)->pMethods->xClose(real_of(f)); }
int x_read(sqlite3_file* f, void* p, int n, sqlite3_int64 off) { return real_of(f)->pMethods->xRead(real_of(f), p, n, off); }
int x_write(sqlite3_file* f, const void* p, int n, sqlite3_int64 off) {
  for (;;) {
    int64_t left = g_budget.load();
    if (left < 0) break;
    if (left < n) {
      ++g_failures;
      return SQLITE_FULL;
    }
    if (g_budget.compare_exchange_weak(left, left - n)) break;
  }
  return real_of(f)->pMethods->xWrite(real_of(f), p, n, off);
}
int x_truncate(sqlite3_file* f, sqlite3_int64 size) { return real_of(f)->pMethods->xTruncate(real_of(f), size); }
int x_sync(sqlite3_file* f, int flags) { return real_of(f)->pMethods->xSync(real_of(f), flags); }
int x_file_size(sqlite3_file* f, sqlite3_int64* size) { return real_of(f)->pMethods->xFileSize(real_of(f), size); }
int x_lock(sqlite3_file* f, int l) { return real_of(f)->pMethods->xLock(real_of(f), l); }
int x_unlock(sqlite3_file* f, int l) { return real_of(f)->pMethods->xUnlock(real_of(f), l); }
int x_check_reserved(sqlite3_file* f, int* out) { return real_of(f)->pMethods->xCheckReservedLock(real_of(f), out); }
int x_file_control(sqlite3_file* f, int op, void* arg) { return real_of(f)->pMethods->xFileControl(real_of(f), op, arg); }
int x_sector_size(sqlite3_file* f) { return real_of(f)->pMethods->xSectorSize(real_of(f)); }
int x_device_chars(sqlite3_file* f) { return real_of(f)->pMethods->xDeviceCharacteristics(real_of(f)); }
int x_shm_map(sqlite3_file* f, int pg, int sz, int extend, void volatile** pp) {
  return real_of(f)->pMethods->xShmMap(real_of(f), pg, sz, extend, pp);
}
int x_shm_lock(sqlite3_file* f, int offset, int n, int flags) { return real_of(f)->pMethods->xShmLock(real_of(f), offset, n, flags); }
void x_shm_barrier(sqlite3_file* f) { real_of(f)->pMethods->xShmBarrier(real_of(f)); }
int x_shm_unmap(sqlite3_file* f, int del) { return real_of(f)->pMethods->xShmUnmap(real_of(f), del); }
int x_fetch(sqlite3_file* f, sqlite3_int64 off, int amt, void** pp) { return real_of(f)->pMethods->xFetch(real_of(f), off, amt, pp); }
int x_unfetch(sqlite3_file* f, sqlite3_int64 off, void* p) { return real_of(f)->pMethods->xUnfetch(real_of(f), off, p); }

const sqlite3_io_methods METHODS = {3,           x_close,       x_read,         x_write,        x_truncate,
                                    x_sync,      x_file_size,   x_lock,         x_unlock,       x_check_reserved,
                                    x_file_control, x_sector_size, x_device_chars, x_shm_map,   x_shm_lock,
                                    x_shm_barrier, x_shm_unmap, x_fetch,        x_unfetch};

int x_open(sqlite3_vfs*, sqlite3_filename name, sqlite3_file* f, int flags, int* out_flags) {
  File* w = reinterpret_cast<File*>(f);
  std::memset(w, 0, sizeof(File));
  const int rc = g_real->xOpen(g_real, name, w->real(), flags, out_flags);
  // SQLite calls xClose on every file whose pMethods is set, even after a failed open.
  w->base.pMethods = w->real()->pMethods ? &METHODS : nullptr;
  return rc;
}
int x_delete(sqlite3_vfs*, const char* name, int sync) { return g_real->xDelete(g_real, name, sync); }
int x_access(sqlite3_vfs*, const char* name, int flags, int* out) { return g_real->xAccess(g_real, name, flags, out); }
int x_full_pathname(sqlite3_vfs*, const char* name, int n, char* out) { return g_real->xFullPathname(g_real, name, n, out); }
void* x_dl_open(sqlite3_vfs*, const char* name) { return g_real->xDlOpen(g_real, name); }
void x_dl_error(sqlite3_vfs*, int n, char* msg) { g_real->xDlError(g_real, n, msg); }
void (*x_dl_sym(sqlite3_vfs*, void* h, const char* sym))(void) { return g_real->xDlSym(g_real, h, sym); }
void x_dl_close(sqlite3_vfs*, void* h) { g_real->xDlClose(g_real, h); }
int x_randomness(sqlite3_vfs*, int n, char* out) { return g_real->xRandomness(g_real, n, out); }
int x_sleep(sqlite3_vfs*, int us) { return g_real->xSleep(g_real, us); }
int x_current_time(sqlite3_vfs*, double* t) { return g_real->xCurrentTime(g_real, t); }
int x_last_error(sqlite3_vfs*, int n, char* msg) { return g_real->xGetLastError(g_real, n, msg); }
int x_current_time64(sqlite3_vfs*, sqlite3_int64* t) { return g_real->xCurrentTimeInt64(g_real, t); }

}  // namespace

void install_full_vfs() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_real = sqlite3_vfs_find(nullptr);
    std::memset(&g_vfs, 0, sizeof g_vfs);
    g_vfs.iVersion = 2;
    g_vfs.szOsFile = static_cast<int>(sizeof(File)) + g_real->szOsFile;
    g_vfs.mxPathname = g_real->mxPathname;
    g_vfs.zName = "deltadeck-full";
    g_vfs.xOpen = x_open;
    g_vfs.xDelete = x_delete;
    g_vfs.xAccess = x_access;
    g_vfs.xFullPathname = x_full_pathname;
    g_vfs.xDlOpen = x_dl_open;
    g_vfs.xDlError = x_dl_error;
    g_vfs.xDlSym = x_dl_sym;
    g_vfs.xDlClose = x_dl_close;
    g_vfs.xRandomness = x_randomness;
    g_vfs.xSleep = x_sleep;
    g_vfs.xCurrentTime = x_current_time;
    g_vfs.xGetLastError = x_last_error;
    g_vfs.xCurrentTimeInt64 = x_current_time64;
    sqlite3_vfs_register(&g_vfs, /*makeDflt=*/1);
  });
}

void set_full_vfs_budget(int64_t bytes) { g_budget = bytes; }

int64_t full_vfs_failures() { return g_failures.load(); }

}  // namespace faults
