// simverbs self test: the device model regcore's tests rely on, exercised
// through the plain verbs API (no regcore).
#include <infiniband/mlx5dv.h>
#include <simverbs/simverbs.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "check.hpp"
#include "env.hpp"

using testenv::open_device;

namespace {

// A device, a PD, one CQ and an RC QP connected to a fresh peer.
struct Raw {
  ibv_context *ctx;
  ibv_pd *pd;
  ibv_cq *cq;
  ibv_qp *qp = nullptr;
  simverbs_peer *peer;
  std::vector<uint8_t> remote = std::vector<uint8_t>(4096);
  uint32_t remote_rkey = 0;

  explicit Raw(simverbs_profile p, uint32_t max_send_wr = 16, int cqe = 64, bool qpx = false) {
    simverbs_reset_stats();
    simverbs_fault_clear();
    simverbs_set_flush_unsignaled(1);
    ctx = open_device(p);
    pd = ibv_alloc_pd(ctx);
    cq = ibv_create_cq(ctx, cqe, nullptr, nullptr, 0);
    peer = simverbs_peer_create(ctx);
    ibv_qp_init_attr_ex a{};
    a.send_cq = a.recv_cq = cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = max_send_wr;
    a.cap.max_recv_wr = 16;
    a.cap.max_send_sge = 2;
    a.cap.max_recv_sge = 1;
    a.comp_mask = IBV_QP_INIT_ATTR_PD;
    a.pd = pd;
    if (qpx) {
      a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
      a.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_SEND;
      a.cap.max_inline_data = 256;
      mlx5dv_qp_init_attr dv{};
      dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
      dv.send_ops_flags = MLX5DV_QP_EX_WITH_MR_LIST;
      qp = mlx5dv_create_qp(ctx, &a, &dv);
    } else {
      qp = ibv_create_qp_ex(ctx, &a);
    }
    if (!qp || simverbs_peer_connect(peer, qp)) testenv::die("Raw setup");
    simverbs_peer_expose(peer, remote.data(), remote.size(),
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE,
                         &remote_rkey);
  }
  ~Raw() {
    ibv_destroy_qp(qp);
    simverbs_peer_destroy(peer);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    simverbs_fault_clear();
  }

  int post_write(ibv_mr *mr, void *buf, uint32_t len, uint64_t wr_id, bool signaled, uint64_t roff = 0) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf), len, mr->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(remote.data()) + roff;
    wr.wr.rdma.rkey = remote_rkey;
    return ibv_post_send(qp, &wr, &bad);
  }

  int post_recv(ibv_mr *mr, void *buf, uint32_t len, uint64_t wr_id) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf), len, mr->lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    return ibv_post_recv(qp, &wr, &bad);
  }

  int post_bind(ibv_mw *mw, uint32_t rkey, ibv_mr *mr, void *addr, size_t len, unsigned access) {
    ibv_send_wr wr{}, *bad = nullptr;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = rkey;
    wr.bind_mw.bind_info = {mr, reinterpret_cast<uintptr_t>(addr), len, access};
    return ibv_post_send(qp, &wr, &bad);
  }

  int post_local_inv(uint32_t rkey, uint64_t wr_id = 0) {
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_LOCAL_INV;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.invalidate_rkey = rkey;
    return ibv_post_send(qp, &wr, &bad);
  }

  int poll(ibv_wc *wc, int n = 1) { return ibv_poll_cq(cq, n, wc); }
};

}  // namespace

TEST(device_profiles) {
  for (simverbs_profile p : testenv::kAllProfiles) {
    ibv_context *ctx = open_device(p);
    ibv_device_attr_ex a{};
    CHECK_EQ(ibv_query_device_ex(ctx, nullptr, &a), 0);
    ibv_port_attr port{};
    CHECK_EQ(ibv_query_port(ctx, 1, &port), 0);
    CHECK_EQ(port.state, IBV_PORT_ACTIVE);
    bool iwarp = p == SIMVERBS_PROFILE_IWARP;
    CHECK_EQ(ctx->device->transport_type, iwarp ? IBV_TRANSPORT_IWARP : IBV_TRANSPORT_IB);
    CHECK_EQ(mlx5dv_is_supported(ctx->device), p == SIMVERBS_PROFILE_MLX5);
    if (p == SIMVERBS_PROFILE_MTHCA) CHECK(a.orig_attr.max_sge_rd < a.orig_attr.max_sge);
    if (iwarp) CHECK_EQ(a.orig_attr.max_sge_rd, 1);
    std::printf("  %s: %s vendor=%#x part=%u max_sge=%d max_sge_rd=%d max_qp_wr=%d mw2=%d\n",
                simverbs_profile_name(p), ibv_get_device_name(ctx->device), a.orig_attr.vendor_id,
                a.orig_attr.vendor_part_id, a.orig_attr.max_sge, a.orig_attr.max_sge_rd,
                a.orig_attr.max_qp_wr,
                !!(a.orig_attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B));
    CHECK_EQ(ibv_close_device(ctx), 0);
  }
}

TEST(reg_mr_access_rules) {
  Raw r(SIMVERBS_PROFILE_MLX5);
  char buf[64];
  errno = 0;
  CHECK(ibv_reg_mr(r.pd, buf, sizeof buf, IBV_ACCESS_REMOTE_WRITE) == nullptr);
  CHECK_EQ(errno, EINVAL);
  ibv_mr *mr = ibv_reg_mr(r.pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  CHECK(mr && mr->lkey != 0 && mr->lkey == mr->rkey);
  CHECK_EQ(ibv_dereg_mr(mr), 0);
}

TEST(send_queue_full_is_enomem) {
  Raw r(SIMVERBS_PROFILE_MLX4, 4);
  char buf[16] = "abc";
  ibv_mr *mr = ibv_reg_mr(r.pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  for (int i = 0; i < 4; i++) CHECK_EQ(r.post_write(mr, buf, 4, i, false), 0);
  CHECK_EQ(r.post_write(mr, buf, 4, 9, true), ENOMEM);
  // Executed but unsignaled WQEs keep their slots: nothing retires them.
  ibv_wc wc;
  CHECK_EQ(r.poll(&wc), 0);
  CHECK_EQ(simverbs_qp_sq_outstanding(r.qp), 4u);
  CHECK_EQ(r.post_write(mr, buf, 4, 9, true), ENOMEM);
  simverbs_stats st;
  simverbs_get_stats(&st);
  CHECK_EQ(st.post_enomem, 2u);
  ibv_dereg_mr(mr);
}

TEST(signaled_completion_retires_earlier_unsignaled) {
  Raw r(SIMVERBS_PROFILE_MLX4, 4);
  char buf[16];
  ibv_mr *mr = ibv_reg_mr(r.pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  for (int i = 0; i < 3; i++) CHECK_EQ(r.post_write(mr, buf, 4, i, false), 0);
  CHECK_EQ(r.post_write(mr, buf, 4, 77, true), 0);
  CHECK_EQ(simverbs_qp_sq_outstanding(r.qp), 4u);
  ibv_wc wc;
  CHECK_EQ(r.poll(&wc), 1);
  CHECK_EQ(wc.wr_id, 77u);
  CHECK_EQ(wc.status, IBV_WC_SUCCESS);
  CHECK_EQ(simverbs_qp_sq_outstanding(r.qp), 0u);
  CHECK_EQ(r.post_write(mr, buf, 4, 1, true), 0);
  ibv_dereg_mr(mr);
}

TEST(completions_in_post_order) {
  Raw r(SIMVERBS_PROFILE_MLX5, 32);
  char buf[16];
  ibv_mr *mr = ibv_reg_mr(r.pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  for (uint64_t i = 1; i <= 20; i++) CHECK_EQ(r.post_write(mr, buf, 8, i, i % 3 == 0), 0);
  ibv_wc wc[8];
  uint64_t expect = 3;
  int n;
  while ((n = r.poll(wc, 8)) > 0)
    for (int i = 0; i < n; i++, expect += 3) CHECK_EQ(wc[i].wr_id, expect);
  CHECK_EQ(expect, 21u);
  ibv_dereg_mr(mr);
}

TEST(rdma_write_then_read_moves_data) {
  Raw r(SIMVERBS_PROFILE_MTHCA);
  char out[32] = "hello, simulated peer", in[32] = {};
  ibv_mr *mo = ibv_reg_mr(r.pd, out, sizeof out, 0);
  ibv_mr *mi = ibv_reg_mr(r.pd, in, sizeof in, IBV_ACCESS_LOCAL_WRITE);
  CHECK_EQ(r.post_write(mo, out, sizeof out, 1, true, 100), 0);
  ibv_sge sge{reinterpret_cast<uintptr_t>(in), sizeof in, mi->lkey};
  ibv_send_wr wr{}, *bad;
  wr.wr_id = 2;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(r.remote.data()) + 100;
  wr.wr.rdma.rkey = r.remote_rkey;
  CHECK_EQ(ibv_post_send(r.qp, &wr, &bad), 0);
  ibv_wc wc[2];
  CHECK_EQ(r.poll(wc, 2), 2);
  CHECK_EQ(wc[1].opcode, IBV_WC_RDMA_READ);
  CHECK_EQ(wc[1].byte_len, sizeof in);
  CHECK(std::memcmp(in, out, sizeof in) == 0);
  // A READ sink without LOCAL_WRITE is a local protection error.
  wr.sg_list[0].lkey = mo->lkey;
  wr.sg_list[0].addr = reinterpret_cast<uintptr_t>(out);
  CHECK_EQ(ibv_post_send(r.qp, &wr, &bad), 0);
  CHECK_EQ(r.poll(wc), 1);
  CHECK_EQ(wc[0].status, IBV_WC_LOC_PROT_ERR);
  CHECK_EQ(r.qp->state, IBV_QPS_ERR);
  ibv_dereg_mr(mo);
  ibv_dereg_mr(mi);
}

TEST(peer_access_checks_key_rights_bounds) {
  Raw r(SIMVERBS_PROFILE_MLX4);
  std::vector<uint8_t> buf(256, 0);
  ibv_mr *ro = ibv_reg_mr(r.pd, buf.data(), 128, IBV_ACCESS_REMOTE_READ);
  uint8_t x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
  uint64_t base = reinterpret_cast<uintptr_t>(buf.data());
  CHECK_EQ(simverbs_peer_rdma_read(r.peer, ro->rkey, base, y, 8), 0);
  CHECK_EQ(simverbs_peer_rdma_write(r.peer, ro->rkey, base, x, 8), -EACCES);
  CHECK_EQ(simverbs_peer_rdma_read(r.peer, ro->rkey, base + 125, y, 8), -ERANGE);
  CHECK_EQ(simverbs_peer_rdma_read(r.peer, ro->rkey + 1, base, y, 8), -ENOKEY);
  uint32_t dead = ro->rkey;
  CHECK_EQ(ibv_dereg_mr(ro), 0);
  CHECK_EQ(simverbs_peer_rdma_read(r.peer, dead, base, y, 8), -ENOKEY);
  CHECK_EQ(simverbs_key_query(r.pd, dead, nullptr), -ENOKEY);
  // A reused key index gets a new tag: the old key stays dead.
  ibv_mr *again = ibv_reg_mr(r.pd, buf.data(), 128, IBV_ACCESS_REMOTE_READ);
  CHECK(again->rkey != dead);
  CHECK_EQ(simverbs_peer_rdma_read(r.peer, dead, base, y, 8), -ENOKEY);
  ibv_dereg_mr(again);
  // Rejected peer accesses do not break the local QP.
  CHECK_EQ(r.qp->state, IBV_QPS_RTS);
}

TEST(window_bind_invalidate_and_rotate) {
  Raw r(SIMVERBS_PROFILE_MLX5);
  std::vector<uint8_t> buf(4096, 0);
  ibv_mr *mr = ibv_reg_mr(r.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
  ibv_mw *mw = ibv_alloc_mw(r.pd, IBV_MW_TYPE_2);
  CHECK(mw != nullptr);
  uint32_t k1 = ibv_inc_rkey(mw->rkey);
  CHECK_EQ(r.post_bind(mw, k1, mr, buf.data() + 512, 1024, IBV_ACCESS_REMOTE_WRITE), 0);
  ibv_wc wc;
  CHECK_EQ(r.poll(&wc), 1);
  CHECK_EQ(wc.status, IBV_WC_SUCCESS);
  CHECK_EQ(wc.opcode, IBV_WC_BIND_MW);
  uint64_t base = reinterpret_cast<uintptr_t>(buf.data());
  uint8_t data[4] = {9, 9, 9, 9};
  CHECK_EQ(simverbs_peer_rdma_write(r.peer, k1, base + 600, data, 4), 0);
  CHECK_EQ(buf[600], 9);
  CHECK_EQ(simverbs_peer_rdma_write(r.peer, k1, base + 100, data, 4), -ERANGE);
  CHECK_EQ(simverbs_peer_rdma_read(r.peer, k1, base + 600, data, 4), -EACCES);
  CHECK_EQ(ibv_dereg_mr(mr), EBUSY);  // still bound
  CHECK_EQ(r.post_local_inv(k1, 5), 0);
  CHECK_EQ(r.poll(&wc), 1);
  CHECK_EQ(wc.status, IBV_WC_SUCCESS);
  CHECK_EQ(simverbs_peer_rdma_write(r.peer, k1, base + 600, data, 4), -ENOKEY);
  // Rebinding with a rotated key: the old one stays dead.
  uint32_t k2 = ibv_inc_rkey(k1);
  CHECK_EQ(r.post_bind(mw, k2, mr, buf.data(), 64, IBV_ACCESS_REMOTE_WRITE), 0);
  CHECK_EQ(r.poll(&wc), 1);
  CHECK_EQ(simverbs_peer_rdma_write(r.peer, k1, base, data, 4), -ENOKEY);
  CHECK_EQ(simverbs_peer_rdma_write(r.peer, k2, base, data, 4), 0);
  // SEND_WITH_INV from the peer invalidates it and reports the key.
  char rbuf[32];
  ibv_mr *rmr = ibv_reg_mr(r.pd, rbuf, sizeof rbuf, IBV_ACCESS_LOCAL_WRITE);
  CHECK_EQ(r.post_recv(rmr, rbuf, sizeof rbuf, 42), 0);
  CHECK_EQ(simverbs_peer_send(r.peer, "done", 5, k2), 0);
  CHECK_EQ(r.poll(&wc), 1);
  CHECK_EQ(wc.wr_id, 42u);
  CHECK(wc.wc_flags & IBV_WC_WITH_INV);
  CHECK_EQ(wc.invalidated_rkey, k2);
  CHECK_EQ(simverbs_peer_rdma_write(r.peer, k2, base, data, 4), -ENOKEY);
  // Invalidating a dead key is a local protection error.
  CHECK_EQ(r.post_local_inv(k2, 6), 0);
  CHECK_EQ(r.poll(&wc), 1);
  CHECK_EQ(wc.status, IBV_WC_LOC_PROT_ERR);
  CHECK_EQ(ibv_dealloc_mw(mw), 0);
  CHECK_EQ(ibv_dereg_mr(mr), 0);
  ibv_dereg_mr(rmr);
}

TEST(window_is_tied_to_its_qp) {
  Raw a(SIMVERBS_PROFILE_MLX4);
  std::vector<uint8_t> buf(256);
  ibv_mr *mr = ibv_reg_mr(a.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
  ibv_mw *mw = ibv_alloc_mw(a.pd, IBV_MW_TYPE_2);
  uint32_t k = ibv_inc_rkey(mw->rkey);
  CHECK_EQ(a.post_bind(mw, k, mr, buf.data(), buf.size(), IBV_ACCESS_REMOTE_READ), 0);
  ibv_wc wc;
  CHECK_EQ(a.poll(&wc), 1);
  // A second QP of the same PD, connected to another peer.
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = a.cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = 4;
  ia.cap.max_recv_wr = 4;
  ia.cap.max_recv_sge = 1;
  ibv_qp *qp2 = ibv_create_qp(a.pd, &ia);
  simverbs_peer *p2 = simverbs_peer_create(a.ctx);
  CHECK_EQ(simverbs_peer_connect(p2, qp2), 0);
  uint8_t y[4];
  uint64_t base = reinterpret_cast<uintptr_t>(buf.data());
  CHECK_EQ(simverbs_peer_rdma_read(p2, k, base, y, 4), -EPERM);
  CHECK_EQ(simverbs_peer_rdma_read(a.peer, k, base, y, 4), 0);
  CHECK_EQ(simverbs_key_query(a.pd, k, nullptr), 0);
  simverbs_peer_destroy(p2);
  ibv_destroy_qp(qp2);
  ibv_dealloc_mw(mw);
  ibv_dereg_mr(mr);
}

TEST(error_state_flushes_everything) {
  for (int flush_unsignaled = 1; flush_unsignaled >= 0; flush_unsignaled--) {
    Raw r(SIMVERBS_PROFILE_MLX5, 16);
    simverbs_set_flush_unsignaled(flush_unsignaled);
    simverbs_set_exec_budget(1);
    char buf[16];
    ibv_mr *mr = ibv_reg_mr(r.pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    char rb[16];
    CHECK_EQ(r.post_recv(mr, rb, sizeof rb, 100), 0);
    for (uint64_t i = 1; i <= 6; i++) CHECK_EQ(r.post_write(mr, buf, 4, i, i % 2 == 0), 0);
    ibv_wc wc[16];
    CHECK_EQ(r.poll(wc, 16), 0);  // WR 1 ran (unsignaled): nothing to report
    ibv_qp_attr qa{};
    qa.qp_state = IBV_QPS_ERR;
    CHECK_EQ(ibv_modify_qp(r.qp, &qa, IBV_QP_STATE), 0);
    simverbs_set_exec_budget(0);
    int n = r.poll(wc, 16);
    // WRs 2..6 flush (only 2, 4, 6 when unsignaled flushes are off) + the receive.
    CHECK_EQ(n, flush_unsignaled ? 6 : 4);
    for (int i = 0; i < n; i++) CHECK_EQ(wc[i].status, IBV_WC_WR_FLUSH_ERR);
    CHECK_EQ(simverbs_qp_sq_outstanding(r.qp), 0u);
    // Posting to an errored QP completes with flush, like hardware.
    CHECK_EQ(r.post_write(mr, buf, 4, 50, true), 0);
    CHECK_EQ(r.poll(wc, 16), 1);
    CHECK_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
    ibv_dereg_mr(mr);
  }
  simverbs_set_flush_unsignaled(1);
}

TEST(fault_post_failure_is_partial_like_hardware) {
  Raw r(SIMVERBS_PROFILE_MLX4, 16);
  char buf[16];
  ibv_mr *mr = ibv_reg_mr(r.pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf), 4, mr->lkey};
  ibv_send_wr wr[3]{}, *bad = nullptr;
  for (int i = 0; i < 3; i++) {
    wr[i].wr_id = i;
    wr[i].sg_list = &sge;
    wr[i].num_sge = 1;
    wr[i].opcode = IBV_WR_RDMA_WRITE;
    wr[i].send_flags = IBV_SEND_SIGNALED;
    wr[i].wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(r.remote.data());
    wr[i].wr.rdma.rkey = r.remote_rkey;
    wr[i].next = i < 2 ? &wr[i + 1] : nullptr;
  }
  CHECK_EQ(simverbs_fault_inject(SIMVERBS_FAULT_POST_FAIL, 2, EIO), 0);
  CHECK_EQ(ibv_post_send(r.qp, wr, &bad), EIO);
  CHECK(bad == &wr[1]);
  ibv_wc wc[4];
  CHECK_EQ(r.poll(wc, 4), 1);
  CHECK_EQ(wc[0].wr_id, 0u);
  simverbs_stats st;
  simverbs_get_stats(&st);
  CHECK_EQ(st.injected_post_failures, 1u);
  ibv_dereg_mr(mr);
}

TEST(fault_error_cqe_and_qp_error) {
  Raw r(SIMVERBS_PROFILE_MTHCA, 16);
  char buf[16];
  ibv_mr *mr = ibv_reg_mr(r.pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  CHECK_EQ(simverbs_fault_inject(SIMVERBS_FAULT_ERROR_CQE, 2, IBV_WC_REM_ACCESS_ERR), 0);
  for (uint64_t i = 1; i <= 4; i++) CHECK_EQ(r.post_write(mr, buf, 4, i, i != 2), 0);
  ibv_wc wc[8];
  CHECK_EQ(r.poll(wc, 8), 4);
  CHECK_EQ(wc[0].status, IBV_WC_SUCCESS);
  CHECK_EQ(wc[1].wr_id, 2u);  // unsignaled, but errors always complete
  CHECK_EQ(wc[1].status, IBV_WC_REM_ACCESS_ERR);
  CHECK_EQ(wc[2].status, IBV_WC_WR_FLUSH_ERR);
  CHECK_EQ(r.qp->state, IBV_QPS_ERR);
  ibv_dereg_mr(mr);

  Raw q(SIMVERBS_PROFILE_MTHCA, 16);
  mr = ibv_reg_mr(q.pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  CHECK_EQ(simverbs_fault_inject(SIMVERBS_FAULT_QP_ERROR, 3, 0), 0);
  for (uint64_t i = 1; i <= 4; i++) CHECK_EQ(q.post_write(mr, buf, 4, i, true), 0);
  CHECK_EQ(q.poll(wc, 8), 4);
  CHECK_EQ(wc[1].status, IBV_WC_SUCCESS);
  CHECK_EQ(wc[2].status, IBV_WC_WR_FLUSH_ERR);
  CHECK_EQ(wc[3].status, IBV_WC_WR_FLUSH_ERR);
  ibv_dereg_mr(mr);
}

TEST(iwarp_read_sink_needs_remote_write) {
  Raw r(SIMVERBS_PROFILE_IWARP);
  char in[16], in2[16];
  ibv_mr *lw = ibv_reg_mr(r.pd, in, sizeof in, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *rw = ibv_reg_mr(r.pd, in2, sizeof in2, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_sge sge[2] = {{reinterpret_cast<uintptr_t>(in), 8, lw->lkey},
                    {reinterpret_cast<uintptr_t>(in2), 8, rw->lkey}};
  ibv_send_wr wr{}, *bad;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(r.remote.data());
  wr.wr.rdma.rkey = r.remote_rkey;
  wr.sg_list = sge;
  wr.num_sge = 2;
  CHECK_EQ(ibv_post_send(r.qp, &wr, &bad), EINVAL);  // max_sge_rd = 1
  wr.sg_list = &sge[1];
  wr.num_sge = 1;
  wr.wr_id = 1;
  CHECK_EQ(ibv_post_send(r.qp, &wr, &bad), 0);
  wr.sg_list = &sge[0];
  wr.wr_id = 2;
  CHECK_EQ(ibv_post_send(r.qp, &wr, &bad), 0);
  ibv_wc wc[2];
  CHECK_EQ(r.poll(wc, 2), 2);
  CHECK_EQ(wc[0].status, IBV_WC_SUCCESS);
  CHECK_EQ(wc[1].status, IBV_WC_LOC_PROT_ERR);
  ibv_dereg_mr(lw);
  ibv_dereg_mr(rw);
}

TEST(mlx5_indirect_mkey_umr) {
  Raw r(SIMVERBS_PROFILE_MLX5, 16, 64, true);
  char a[8] = "AAAAAAA", b[8] = "BBBBBBB", c[8] = "CCCCCCC";
  ibv_mr *ma = ibv_reg_mr(r.pd, a, 8, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *mb = ibv_reg_mr(r.pd, b, 8, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *mc = ibv_reg_mr(r.pd, c, 8, IBV_ACCESS_LOCAL_WRITE);
  mlx5dv_mkey_init_attr ma_attr{r.pd, MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT, 8};
  mlx5dv_mkey *mk = mlx5dv_create_mkey(&ma_attr);
  CHECK(mk != nullptr);
  ibv_qp_ex *qx = ibv_qp_to_qp_ex(r.qp);
  mlx5dv_qp_ex *mqx = mlx5dv_qp_ex_from_ibv_qp_ex(qx);
  CHECK(qx && mqx);
  ibv_sge list[3] = {{reinterpret_cast<uintptr_t>(a), 4, ma->lkey},
                     {reinterpret_cast<uintptr_t>(b), 4, mb->lkey},
                     {reinterpret_cast<uintptr_t>(c), 4, mc->lkey}};
  auto umr_and_write = [&](unsigned flags, uint64_t id) {
    ibv_wr_start(qx);
    qx->wr_id = id;
    qx->wr_flags = flags;
    mlx5dv_wr_mr_list(mqx, mk, IBV_ACCESS_LOCAL_WRITE, 3, list);
    qx->wr_id = id + 1;
    qx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(qx, r.remote_rkey, reinterpret_cast<uintptr_t>(r.remote.data()));
    ibv_wr_set_sge(qx, mk->lkey, 0, 12);  // zero based
    return ibv_wr_complete(qx);
  };
  CHECK_EQ(umr_and_write(0, 1), EINVAL);  // mlx5 needs IBV_SEND_INLINE
  CHECK_EQ(simverbs_qp_sq_outstanding(r.qp), 0u);
  CHECK_EQ(umr_and_write(IBV_SEND_INLINE, 1), 0);
  ibv_wc wc;
  CHECK_EQ(r.poll(&wc), 1);
  CHECK_EQ(wc.status, IBV_WC_SUCCESS);
  CHECK(std::memcmp(r.remote.data(), "AAAABBBBCCCC", 12) == 0);
  // A configured mkey must be invalidated before the next UMR.
  CHECK_EQ(umr_and_write(IBV_SEND_INLINE, 3), 0);
  CHECK_EQ(r.poll(&wc), 1);
  CHECK_EQ(wc.status, IBV_WC_MW_BIND_ERR);
  for (simverbs_profile p : {SIMVERBS_PROFILE_MTHCA, SIMVERBS_PROFILE_IWARP}) {
    ibv_context *ctx = open_device(p);
    ibv_pd *pd = ibv_alloc_pd(ctx);
    mlx5dv_mkey_init_attr other{pd, MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT, 8};
    CHECK(mlx5dv_create_mkey(&other) == nullptr);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
  }
  mlx5dv_destroy_mkey(mk);
  ibv_dereg_mr(ma);
  ibv_dereg_mr(mb);
  ibv_dereg_mr(mc);
}

TEST(cq_overrun_is_detected) {
  Raw r(SIMVERBS_PROFILE_MLX4, 16, 2);
  char buf[8];
  ibv_mr *mr = ibv_reg_mr(r.pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  for (uint64_t i = 0; i < 3; i++) CHECK_EQ(r.post_write(mr, buf, 4, i, true), 0);
  simverbs_progress(r.ctx, 0);
  simverbs_stats st;
  simverbs_get_stats(&st);
  CHECK_EQ(st.cq_overflows, 1u);
  CHECK_EQ(r.qp->state, IBV_QPS_ERR);
  ibv_dereg_mr(mr);
}

TEST(qp_to_qp_and_rnr_wait) {
  ibv_context *ctx = open_device(SIMVERBS_PROFILE_MLX5);
  ibv_pd *pd = ibv_alloc_pd(ctx);
  ibv_cq *cq = ibv_create_cq(ctx, 32, nullptr, nullptr, 0);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = 8;
  ia.cap.max_recv_wr = 8;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ibv_qp *a = ibv_create_qp(pd, &ia), *b = ibv_create_qp(pd, &ia);
  CHECK_EQ(simverbs_qp_connect(a, b->qp_num), 0);
  CHECK_EQ(simverbs_qp_connect(b, a->qp_num), 0);
  char msg[16] = "ping", rb[16] = {};
  ibv_mr *m = ibv_reg_mr(pd, msg, sizeof msg, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr *rm = ibv_reg_mr(pd, rb, sizeof rb, IBV_ACCESS_LOCAL_WRITE);
  ibv_sge s{reinterpret_cast<uintptr_t>(msg), 5, m->lkey};
  ibv_send_wr wr{}, *bad;
  wr.wr_id = 1;
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  CHECK_EQ(ibv_post_send(a, &wr, &bad), 0);
  ibv_wc wc[2];
  CHECK_EQ(ibv_poll_cq(cq, 2, wc), 0);  // receiver not ready: RNR, retried
  ibv_sge rs{reinterpret_cast<uintptr_t>(rb), sizeof rb, rm->lkey};
  ibv_recv_wr rwr{}, *rbad;
  rwr.wr_id = 2;
  rwr.sg_list = &rs;
  rwr.num_sge = 1;
  CHECK_EQ(ibv_post_recv(b, &rwr, &rbad), 0);
  CHECK_EQ(ibv_poll_cq(cq, 2, wc), 2);
  // The receiver's completion comes first: the sender's waits for the ACK.
  CHECK_EQ(wc[0].wr_id, 2u);
  CHECK_EQ(wc[0].opcode, IBV_WC_RECV);
  CHECK_EQ(wc[0].byte_len, 5u);
  CHECK_EQ(wc[0].src_qp, a->qp_num);
  CHECK_EQ(wc[1].wr_id, 1u);
  CHECK_EQ(wc[1].opcode, IBV_WC_SEND);
  CHECK(std::strcmp(rb, "ping") == 0);
  ibv_destroy_qp(a);
  ibv_destroy_qp(b);
  ibv_dereg_mr(m);
  ibv_dereg_mr(rm);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
}

int main(int argc, char **argv) { return check::run_all(argc, argv); }
