/* files.c — file identity (files-internal.h). */
#include "files-internal.h"

#include <string.h>
#include <sys/stat.h>

bool spn__same_file(const char *a, const char *b) {
  struct stat sa, sb;
  if (!strcmp(a, b))
    return true;
  return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}
