/* The system headers rdma-cm-sys binds (Debian: libibverbs-dev, librdmacm-dev). */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
