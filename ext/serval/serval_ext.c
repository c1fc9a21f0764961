/* Entry point of the extension: Serval::Native. */
#include "serval_ruby.h"

VALUE sv_eConnectionError, sv_eWriteTimeout, sv_eBadResponse;

void sv_init_gvl(VALUE mNative); /* gvl.c */
void sv_init_fairness(VALUE mNative); /* fairness.c */

void Init_serval_ext(void)
{
    rb_require("serval/errors");
    VALUE mServal = rb_define_module("Serval");
    VALUE mNative = rb_define_module_under(mServal, "Native");
    sv_eConnectionError = rb_const_get(mServal, rb_intern("ConnectionError"));
    sv_eWriteTimeout = rb_const_get(mServal, rb_intern("WriteTimeout"));
    sv_eBadResponse = rb_const_get(mServal, rb_intern("BadResponse"));
    rb_gc_register_mark_object(sv_eConnectionError);
    rb_gc_register_mark_object(sv_eWriteTimeout);
    rb_gc_register_mark_object(sv_eBadResponse);
    sv_init_strcache();
    sv_init_env();
    sv_define_env_fill(mNative);
    sv_init_core(mNative);
    sv_init_balance();
    sv_init_request(mNative);
    sv_init_tls(mNative);
    sv_init_gvl(mNative);
    sv_init_fairness(mNative);
    sv_init_timing(mServal);
    rb_define_const(mNative, "HEADERS_CAP", INT2NUM(SV_HEADERS_CAP));
}
