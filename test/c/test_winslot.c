/*
 * ext/serval/winslot.h's slot of a figure against the frexp form it
 * replaced (standalone, no Ruby): every bound and its neighbours, powers of
 * two, and a million random figures from 1 ns to 100 s.
 * Build: gcc -std=gnu11 -Wall -Wextra -Werror -fsanitize=address,undefined \
 *          -Iext/serval test/c/test_winslot.c -lm -o tmp/test_winslot
 */
#include "winslot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int passed, failed;

static int slot_frexp(double v)
{
    if (!(v > SV_WIN_LOW))
        return 0;
    int e;
    double m = frexp(v / SV_WIN_LOW, &e);
    int i = m > M_SQRT1_2 ? 2 * e : (m > 0.5 ? 2 * e - 1 : 2 * e - 2);
    return i > SV_WIN_BOUNDS ? SV_WIN_BOUNDS : i;
}

static void check(double v)
{
    int a = sv_win_slot(v), b = slot_frexp(v);
    if (a == b) {
        passed++;
    } else {
        failed++;
        if (failed < 20)
            fprintf(stderr, "slot of %.17g: %d, frexp form %d\n", v, a, b);
    }
}

int main(void)
{
    for (int i = 0; i <= SV_WIN_BOUNDS + 2; i++) {
        double bound = SV_WIN_LOW * pow(2.0, i / 2.0);
        check(bound);
        check(nextafter(bound, 0));
        check(nextafter(bound, INFINITY));
    }
    for (int e = -40; e < 20; e++) {
        double p = ldexp(1.0, e);
        check(p);
        check(nextafter(p, 0));
        check(nextafter(p, INFINITY));
        check(p * M_SQRT2);
        check(nextafter(p * M_SQRT2, 0));
        check(nextafter(p * M_SQRT2, INFINITY));
    }
    check(0.0);
    check(-1.0);
    check(NAN);
    /* infinity (no figure is one): the top slot; the frexp form said 0 */
    if (sv_win_slot(INFINITY) == SV_WIN_BOUNDS)
        passed++;
    else
        failed++;
    check(SV_WIN_LOW);
    srand(12345);
    for (int i = 0; i < 1000000; i++) {
        double u = (double)rand() / RAND_MAX;
        check(pow(10.0, -9.0 + 11.0 * u)); /* 1 ns .. 100 s */
    }
    printf("test_winslot: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
