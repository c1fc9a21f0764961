/* The rolling window's histogram slot of a figure (ext/serval/window.c):
 * the smallest i with v <= SV_WIN_LOW x 2^(i/2), SV_WIN_BOUNDS above the
 * last bound. Read off the bits of v / SV_WIN_LOW instead of frexp (a libm
 * call per figure, five or six per request); test/c/test_winslot.c checks
 * it against the frexp form. Pure C, no Ruby. */
#ifndef SERVAL_WINSLOT_H
#define SERVAL_WINSLOT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define SV_WIN_BOUNDS 42          /* 10 us x 2^(i/2): 10 us .. 14.8 s */
#define SV_WIN_LOW 1e-5

static inline int sv_win_slot(double v)
{
    if (!(v > SV_WIN_LOW))
        return 0;
    double x = v / SV_WIN_LOW; /* > 1: a normal double, m x 2^e with m in [0.5, 1) as frexp has it */
    uint64_t bits;
    memcpy(&bits, &x, sizeof(bits));
    int biased = (int)((bits >> 52) & 0x7ff);
    if (biased == 0x7ff)
        return SV_WIN_BOUNDS; /* infinity */
    int e = biased - 1022;
    uint64_t frac = bits & ((UINT64_C(1) << 52) - 1); /* m = (2^52 + frac) / 2^53 */
    /* m > 1/sqrt(2) exactly as frexp's m compares with M_SQRT1_2: both sides
     * times 2^53 are integers */
    const uint64_t sqrt_half = (uint64_t)(M_SQRT1_2 * 9007199254740992.0) - (UINT64_C(1) << 52);
    int i = frac > sqrt_half ? 2 * e : (frac > 0 ? 2 * e - 1 : 2 * e - 2);
    return i > SV_WIN_BOUNDS ? SV_WIN_BOUNDS : i;
}

#endif
