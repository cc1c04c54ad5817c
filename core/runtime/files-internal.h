/* files-internal.h — file identity, shared by the runtime and the job
 * service (compiled into both, as log.c is). */
#ifndef SPN_FILES_INTERNAL_H
#define SPN_FILES_INTERNAL_H

#include <stdbool.h>

/* Whether paths a and b name one file: the same string, or two existing
 * files with one device and inode (a hard link, or a path through a
 * symbolic link). Thread: any. */
bool spn__same_file(const char *a, const char *b);

#endif
