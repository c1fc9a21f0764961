/* The serving core's hooks (hooks.h): the table, empty until an optional
 * module attaches. */
#include "hooks.h"

sv_hook_table sv_hooks;
__thread int sv_gvl_yielding;
