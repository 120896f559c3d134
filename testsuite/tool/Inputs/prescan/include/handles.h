/* Declares a verbs type itself: naming it is RDMA code. */
struct ibv_mr;
struct ibv_mr *lookup_mr(int key);
