/* Entry point of the extension: Serval::Native. Each module's init defines
 * its own classes and methods and looks up the Ruby classes it uses. */
#include "serval_ruby.h"
#include "balance.h"
#include "core.h"
#include "env.h"
#include "fairness.h"
#include "gvl.h"
#include "request.h"
#include "shed_core.h"
#include "sim.h"
#include "steadiness.h"
#include "timing.h"
#include "tls.h"

void Init_serval_ext(void)
{
    rb_require("serval/errors"); /* the exception classes request.c raises */
    VALUE mServal = rb_define_module("Serval");
    VALUE mNative = rb_define_module_under(mServal, "Native");
    sv_init_strcache();
    sv_init_env();
    sv_define_env_fill(mNative);
    VALUE cCore = sv_init_core(mNative);
    sv_init_balance(cCore);
    sv_init_shed_core();
    sv_init_head();
    sv_init_request(mNative);
    sv_init_tls(mNative);
    sv_init_gvl(mNative);
    sv_init_steadiness(mNative);
    sv_init_fairness(mNative);
    sv_init_sim(mNative);
    sv_init_timing(mServal);
    rb_define_const(mNative, "HEADERS_CAP", INT2NUM(SV_HEADERS_CAP));
}
