/* The ULP's own header: it brings in the verbs. */
#ifndef ULP_H
#define ULP_H
#include <infiniband/verbs.h>
#include "util.h"
#endif
