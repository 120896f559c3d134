/* No RDMA here: skipped by the pre-scan without being parsed. The
 * declaration below would not compile if it were parsed. */
#include <stdio.h>
#include "util.h"

this is not C;

int main(void) { printf("%zu\n", round_up(3, 4)); return 0; }
