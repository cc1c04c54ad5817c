/* sqlite-files.h — removing a SQLite queue's files (the database, its WAL
 * and shared-memory files, and the "-lock" file a gateway serving it keeps
 * beside it: server.c, lock_db) when a test or benchmark is done with it;
 * used by the queue tests and tests/bench/job-bench.c. */
#ifndef SPINDLE_TEST_SQLITE_FILES_H
#define SPINDLE_TEST_SQLITE_FILES_H

#include <stddef.h>
#include <stdio.h>
#include <unistd.h>

static inline void remove_sqlite_files(const char *path) {
  static const char *const sfx[] = {"", "-wal", "-shm", "-lock"};
  for (size_t i = 0; i < sizeof sfx / sizeof *sfx; i++) {
    char p[512];
    snprintf(p, sizeof p, "%s%s", path, sfx[i]);
    unlink(p);
  }
}

#endif
