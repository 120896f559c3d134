/* Only c.c includes this. */
#include <infiniband/verbs.h>
