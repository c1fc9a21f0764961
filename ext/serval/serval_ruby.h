/* What the Ruby-facing C files share: Ruby's headers and how a typed
 * object's struct is allocated. Their functions are in their own headers. */
#ifndef SERVAL_RUBY_H
#define SERVAL_RUBY_H

#include <ruby.h>
#include <ruby/version.h>

/* Ruby 3.3+: a typed object's struct can live inside the object's own slot
 * (RUBY_TYPED_EMBEDDABLE): no calloc and no free per object. */
#if defined(RUBY_API_VERSION_CODE) && RUBY_API_VERSION_CODE >= 30300
#define SV_EMBED 1
#define SV_TYPED_EMBEDDABLE RUBY_TYPED_EMBEDDABLE
#else
#define SV_EMBED 0
#define SV_TYPED_EMBEDDABLE 0
#endif
#include "serval.h"

#endif
