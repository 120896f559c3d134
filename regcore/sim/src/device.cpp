// simverbs: device list, contexts, and the resource verbs (PD, MR, MW,
// mkey, CQ, QP). Execution of work requests lives in engine.cpp.
#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <endian.h>
#include <new>
#include <sys/mman.h>
#include <unistd.h>

#include <rdma/rdma_cma.h>

#include "sim_internal.hpp"

// The header turns these into macros around the real symbols we define.
#undef ibv_reg_mr
#undef ibv_reg_mr_iova
#undef ibv_query_port

namespace simverbs {

namespace {

constexpr unsigned kMwCaps =
    IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B | IBV_DEVICE_MEM_MGT_EXTENSIONS;

// Limits are in the range of the real devices but smaller where that makes
// the interesting cases (split READs, full queues) cheap to reach.
const Profile kProfiles[SIMVERBS_PROFILE_COUNT] = {
    {"mthca", "mthca0", 0x02c9, 25208, IBV_TRANSPORT_IB, IBV_NODE_CA, IBV_LINK_LAYER_INFINIBAND,
     16384, 16, 2, 65535, 0, 0, false, 0, false, 64},
    {"mlx4", "mlx4_0", 0x02c9, 4099, IBV_TRANSPORT_IB, IBV_NODE_CA, IBV_LINK_LAYER_INFINIBAND,
     16351, 16, 16, 4194303, 65536, kMwCaps, false, 0, false, 256},
    {"mlx5", "mlx5_0", 0x02c9, 4119, IBV_TRANSPORT_IB, IBV_NODE_CA, IBV_LINK_LAYER_INFINIBAND,
     32768, 16, 16, 4194303, 65536, kMwCaps, true, 256, false, 1024},
    {"iwarp", "iwp0", 0x1425, 0x6408, IBV_TRANSPORT_IWARP, IBV_NODE_RNIC,
     IBV_LINK_LAYER_ETHERNET, 4096, 4, 1, 65535, 0, IBV_DEVICE_MEM_MGT_EXTENSIONS, false, 0, true,
     128},
};

void choose_profile_from_env_locked(Sim &s) {
  if (s.profile_chosen) return;
  s.profile_chosen = true;
  const char *env = getenv("SIMVERBS_PROFILE");
  if (!env || !*env) return;
  if (strcmp(env, "all") == 0) {
    s.list_all = true;
    return;
  }
  int p = simverbs_profile_from_name(env);
  if (p >= 0) s.active = static_cast<simverbs_profile>(p);
}

void init_devices(Sim &s) {
  for (int i = 0; i < SIMVERBS_PROFILE_COUNT; i++) {
    SimDevice &d = s.devices[i];
    const Profile &p = kProfiles[i];
    d.box.self = &d;
    d.profile = static_cast<simverbs_profile>(i);
    d.box.ibv.node_type = p.node_type;
    d.box.ibv.transport_type = p.transport;
    snprintf(d.box.ibv.name, sizeof d.box.ibv.name, "%s", p.dev_name);
    snprintf(d.box.ibv.dev_name, sizeof d.box.ibv.dev_name, "uverbs%d", i);
    snprintf(d.box.ibv.dev_path, sizeof d.box.ibv.dev_path, "/sim/uverbs%d", i);
    snprintf(d.box.ibv.ibdev_path, sizeof d.box.ibv.ibdev_path, "/sim/%s", p.dev_name);
  }
}

int set_errno_null(int err) {
  errno = err;
  return err;
}

}  // namespace

const Profile &profile(enum simverbs_profile p) { return kProfiles[p]; }

Sim &sim() {
  static Sim *s = [] {
    auto *n = new Sim();
    init_devices(*n);
    n->endpoints.push_back(nullptr);
    return n;
  }();
  return *s;
}

SimContext *ctx_of(ibv_context *ctx) {
  if (!ctx) return nullptr;
  return owner_of<SimContext>(verbs_get_ctx(ctx));
}

const Profile &profile_of(const SimContext *ctx) { return kProfiles[ctx->dev->profile]; }

void set_error_locked(const std::string &msg) { sim().last_error = msg; }

// ---- keys ----

uint32_t key_make(uint32_t index, uint8_t tag) { return (index << 8) | tag; }

uint32_t key_alloc_locked(KeyKind kind, void *obj) {
  Sim &s = sim();
  uint32_t index;
  if (!s.free_keys.empty()) {
    index = s.free_keys.back();
    s.free_keys.pop_back();
  } else {
    index = static_cast<uint32_t>(s.keys.size());
    s.keys.emplace_back();
  }
  KeySlot &slot = s.keys[index];
  slot.tag = static_cast<uint8_t>(slot.tag + 1);  // a reused index gets a new key
  slot.kind = kind;
  slot.obj = obj;
  return index;
}

void key_free_locked(uint32_t index) {
  Sim &s = sim();
  s.keys[index].kind = KeyKind::kNone;
  s.keys[index].obj = nullptr;
  s.free_keys.push_back(index);
}

KeySlot *key_lookup_locked(uint32_t key) {
  Sim &s = sim();
  uint32_t index = key_index(key);
  if (index == 0 || index >= s.keys.size()) return nullptr;
  KeySlot &slot = s.keys[index];
  if (slot.kind == KeyKind::kNone || slot.tag != (key & 0xff)) return nullptr;
  return &slot;
}

// ---- endpoints (QP numbers) ----

uint32_t endpoint_register_locked(Endpoint *ep) {
  Sim &s = sim();
  s.endpoints.push_back(ep);
  ep->qpn = static_cast<uint32_t>(s.endpoints.size() - 1);
  return ep->qpn;
}

void endpoint_unregister_locked(uint32_t qpn) {
  Sim &s = sim();
  if (qpn < s.endpoints.size()) s.endpoints[qpn] = nullptr;
}

Endpoint *endpoint_lookup_locked(uint32_t qpn) {
  Sim &s = sim();
  return qpn < s.endpoints.size() ? s.endpoints[qpn] : nullptr;
}

}  // namespace simverbs

using namespace simverbs;

// ======================= profile / stats API ============================

extern "C" {

const char *simverbs_profile_name(enum simverbs_profile p) {
  return p >= 0 && p < SIMVERBS_PROFILE_COUNT ? kProfiles[p].name : "unknown";
}

int simverbs_profile_from_name(const char *name) {
  for (int i = 0; i < SIMVERBS_PROFILE_COUNT; i++)
    if (name && strcmp(name, kProfiles[i].name) == 0) return i;
  return -EINVAL;
}

int simverbs_set_profile(enum simverbs_profile p) {
  if (p < 0 || p >= SIMVERBS_PROFILE_COUNT) return -EINVAL;
  Sim &s = sim();
  std::lock_guard<std::mutex> lock(s.mu);
  s.profile_chosen = true;
  s.list_all = false;
  s.active = p;
  return 0;
}

int simverbs_set_profile_by_name(const char *name) {
  if (name && strcmp(name, "all") == 0) {
    Sim &s = sim();
    std::lock_guard<std::mutex> lock(s.mu);
    s.profile_chosen = true;
    s.list_all = true;
    return 0;
  }
  int p = simverbs_profile_from_name(name);
  return p < 0 ? p : simverbs_set_profile(static_cast<simverbs_profile>(p));
}

void simverbs_get_stats(struct simverbs_stats *out) {
  Sim &s = sim();
  std::lock_guard<std::mutex> lock(s.mu);
  *out = s.stats;
}

void simverbs_reset_stats(void) {
  Sim &s = sim();
  std::lock_guard<std::mutex> lock(s.mu);
  s.stats = simverbs_stats{};
}

const char *simverbs_last_error(void) { return sim().last_error.c_str(); }

int simverbs_key_query(struct ibv_pd *pd, uint32_t key, unsigned *access) {
  Sim &s = sim();
  std::lock_guard<std::mutex> lock(s.mu);
  KeySlot *slot = key_lookup_locked(key);
  if (!slot) return -ENOKEY;
  SimPd *want = pd_of(pd);
  unsigned rights = 0;
  switch (slot->kind) {
    case KeyKind::kMr: {
      auto *mr = static_cast<SimMr *>(slot->obj);
      if (mr->pd != want) return -ENOKEY;
      rights = mr->access;
      break;
    }
    case KeyKind::kMw: {
      auto *mw = static_cast<SimMw *>(slot->obj);
      if (mw->pd != want || !mw->bound) return -ENOKEY;
      rights = mw->access;
      break;
    }
    case KeyKind::kMkey: {
      auto *mk = static_cast<SimMkey *>(slot->obj);
      if (mk->pd != want || !mk->configured) return -ENOKEY;
      rights = mk->access;
      break;
    }
    default:
      return -ENOKEY;
  }
  if (access) *access = rights;
  return 0;
}

// ======================= device list and context ==========================

struct ibv_device **ibv_get_device_list(int *num_devices) {
  Sim &s = sim();
  std::lock_guard<std::mutex> lock(s.mu);
  choose_profile_from_env_locked(s);
  int n = s.list_all ? SIMVERBS_PROFILE_COUNT : 1;
  auto **list = new (std::nothrow) ibv_device *[n + 1];
  if (!list) {
    errno = ENOMEM;
    return nullptr;
  }
  for (int i = 0; i < n; i++) list[i] = &s.devices[s.list_all ? i : s.active].box.ibv;
  list[n] = nullptr;
  if (num_devices) *num_devices = n;
  return list;
}

void ibv_free_device_list(struct ibv_device **list) { delete[] list; }

const char *ibv_get_device_name(struct ibv_device *device) { return device->name; }

__be64 ibv_get_device_guid(struct ibv_device *device) {
  auto *d = owner_of<SimDevice>(device);
  return htobe64(0x0002c90300000000ULL + static_cast<uint64_t>(d->profile));
}

int ibv_get_device_index(struct ibv_device *device) {
  return static_cast<int>(owner_of<SimDevice>(device)->profile);
}

static int sim_query_port(struct ibv_context *context, uint8_t port_num,
                          struct ibv_port_attr *attr, size_t attr_len);
static int sim_query_device_ex(struct ibv_context *context,
                               const struct ibv_query_device_ex_input *input,
                               struct ibv_device_attr_ex *attr, size_t attr_size);
static struct ibv_qp *sim_create_qp_ex(struct ibv_context *context,
                                       struct ibv_qp_init_attr_ex *attr);
static struct ibv_mw *sim_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
static int sim_dealloc_mw(struct ibv_mw *mw);
static int sim_bind_mw(struct ibv_qp *, struct ibv_mw *, struct ibv_mw_bind *) {
  return EOPNOTSUPP;  // type-1 windows are not simulated
}
static int sim_req_notify_cq(struct ibv_cq *, int) { return 0; }
static int sim_post_srq_recv(struct ibv_srq *, struct ibv_recv_wr *, struct ibv_recv_wr **bad) {
  *bad = nullptr;
  return EOPNOTSUPP;
}

struct ibv_context *ibv_open_device(struct ibv_device *device) {
  auto *dev = owner_of<SimDevice>(device);
  if (!dev) {
    errno = EINVAL;
    return nullptr;
  }
  auto *ctx = new (std::nothrow) SimContext();
  if (!ctx) {
    errno = ENOMEM;
    return nullptr;
  }
  ctx->box.self = ctx;
  ctx->dev = dev;
  verbs_context &v = ctx->box.ibv;
  v.sz = sizeof(verbs_context);
  v.query_port = sim_query_port;
  v.query_device_ex = sim_query_device_ex;
  v.create_qp_ex = sim_create_qp_ex;
  ibv_context &c = v.context;
  c.device = device;
  c.cmd_fd = -1;
  c.async_fd = -1;
  c.num_comp_vectors = 1;
  c.abi_compat = __VERBS_ABI_IS_EXTENDED;
  pthread_mutex_init(&c.mutex, nullptr);
  c.ops.alloc_mw = sim_alloc_mw;
  c.ops.dealloc_mw = sim_dealloc_mw;
  c.ops.bind_mw = sim_bind_mw;
  c.ops.poll_cq = simverbs::poll_cq;
  c.ops.req_notify_cq = sim_req_notify_cq;
  c.ops.post_srq_recv = sim_post_srq_recv;
  c.ops.post_send = simverbs::post_send;
  c.ops.post_recv = simverbs::post_recv;
  return &c;
}

int ibv_close_device(struct ibv_context *context) {
  SimContext *ctx = ctx_of(context);
  if (!ctx) return EINVAL;
  {
    std::lock_guard<std::mutex> lock(sim().mu);
    if (!ctx->qps.empty()) return EBUSY;
  }
  pthread_mutex_destroy(&context->mutex);
  delete ctx;
  return 0;
}

static void fill_device_attr(const Profile &p, struct ibv_device_attr *a) {
  memset(a, 0, sizeof *a);
  snprintf(a->fw_ver, sizeof a->fw_ver, "simverbs-%s", p.name);
  a->node_guid = htobe64(0x0002c90300000000ULL);
  a->sys_image_guid = a->node_guid;
  a->max_mr_size = ~0ULL;
  a->page_size_cap = 0xfffff000;
  a->vendor_id = p.vendor_id;
  a->vendor_part_id = p.vendor_part_id;
  a->max_qp = 1 << 16;
  a->max_qp_wr = p.max_qp_wr;
  a->device_cap_flags = p.cap_flags | IBV_DEVICE_RC_RNR_NAK_GEN;
  a->max_sge = p.max_sge;
  a->max_sge_rd = p.max_sge_rd;
  a->max_cq = 1 << 16;
  a->max_cqe = p.max_cqe;
  a->max_mr = 1 << 20;
  a->max_pd = 1 << 16;
  a->max_qp_rd_atom = 16;
  a->max_qp_init_rd_atom = 16;
  a->max_res_rd_atom = 1 << 20;
  a->atomic_cap = p.transport == IBV_TRANSPORT_IWARP ? IBV_ATOMIC_NONE : IBV_ATOMIC_HCA;
  a->max_mw = p.max_mw;
  a->max_pkeys = 1;
  a->local_ca_ack_delay = 16;
  a->phys_port_cnt = 1;
}

int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr) {
  SimContext *ctx = ctx_of(context);
  if (!ctx || !attr) return EINVAL;
  fill_device_attr(profile_of(ctx), attr);
  return 0;
}

static int sim_query_device_ex(struct ibv_context *context,
                               const struct ibv_query_device_ex_input *input,
                               struct ibv_device_attr_ex *attr, size_t attr_size) {
  if ((input && input->comp_mask) || attr_size < sizeof(ibv_device_attr)) return EINVAL;
  ibv_device_attr_ex full{};
  fill_device_attr(profile_of(ctx_of(context)), &full.orig_attr);
  full.phys_port_cnt_ex = 1;
  memcpy(attr, &full, attr_size < sizeof full ? attr_size : sizeof full);
  return 0;
}

static void fill_port_attr(const Profile &p, struct ibv_port_attr *a) {
  memset(a, 0, sizeof *a);
  a->state = IBV_PORT_ACTIVE;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = IBV_MTU_4096;
  a->gid_tbl_len = 1;
  a->max_msg_sz = 1U << 31;
  a->pkey_tbl_len = 1;
  a->lid = 1;
  a->sm_lid = 1;
  a->active_width = 2;
  a->active_speed = 32;
  a->phys_state = 5;  // LinkUp
  a->link_layer = p.link_layer;
}

static int sim_query_port(struct ibv_context *context, uint8_t port_num,
                          struct ibv_port_attr *attr, size_t attr_len) {
  SimContext *ctx = ctx_of(context);
  if (!ctx || port_num != 1) return EINVAL;
  ibv_port_attr full;
  fill_port_attr(profile_of(ctx), &full);
  memcpy(attr, &full, attr_len < sizeof full ? attr_len : sizeof full);
  return 0;
}

// The exported compat symbol: only the fields every ABI version has.
int ibv_query_port(struct ibv_context *context, uint8_t port_num,
                   struct _compat_ibv_port_attr *port_attr) {
  return sim_query_port(context, port_num, reinterpret_cast<ibv_port_attr *>(port_attr),
                        offsetof(ibv_port_attr, link_layer) + 1);
}

int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid) {
  if (!ctx_of(context) || port_num != 1 || index != 0) return EINVAL;
  memset(gid, 0, sizeof *gid);
  gid->global.subnet_prefix = htobe64(0xfe80000000000000ULL);
  gid->global.interface_id = htobe64(0x0002c90300000001ULL);
  return 0;
}

int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index, __be16 *pkey) {
  if (!ctx_of(context) || port_num != 1 || index != 0) return EINVAL;
  *pkey = htobe16(0xffff);
  return 0;
}

const char *ibv_wc_status_str(enum ibv_wc_status status) {
  static const char *const names[] = {
      "success", "local length error", "local QP operation error",
      "local EE context operation error", "local protection error", "Work Request Flushed Error",
      "memory management operation error", "bad response error", "local access error",
      "remote invalid request error", "remote access error", "remote operation error",
      "transport retry counter exceeded", "RNR retry counter exceeded",
      "local RDD violation error", "remote invalid RD request", "aborted error",
      "invalid EE context number", "invalid EE context state", "fatal error",
      "response timeout error", "general error", "TM error", "TM rendezvous incomplete"};
  unsigned i = static_cast<unsigned>(status);
  return i < sizeof names / sizeof names[0] ? names[i] : "unknown";
}

// Completion channels exist so that code creating them links and runs, but
// the device has no interrupts: poll the CQ instead.
int ibv_get_cq_event(struct ibv_comp_channel *, struct ibv_cq **, void **) {
  errno = EOPNOTSUPP;
  return -1;
}

void ibv_ack_cq_events(struct ibv_cq *, unsigned int) {}

int ibv_resize_cq(struct ibv_cq *, int) { return EOPNOTSUPP; }

const char *ibv_node_type_str(enum ibv_node_type type) {
  switch (type) {
    case IBV_NODE_CA: return "InfiniBand channel adapter";
    case IBV_NODE_RNIC: return "iWARP NIC";
    default: return "unknown";
  }
}

const char *ibv_port_state_str(enum ibv_port_state state) {
  return state == IBV_PORT_ACTIVE ? "PORT_ACTIVE" : "PORT_DOWN";
}

int ibv_get_async_event(struct ibv_context *, struct ibv_async_event *) {
  errno = EAGAIN;  // the simulated device reports errors through completions
  return -1;
}

void ibv_ack_async_event(struct ibv_async_event *) {}

// ======================= protection domains ===============================

struct ibv_pd *ibv_alloc_pd(struct ibv_context *context) {
  SimContext *ctx = ctx_of(context);
  if (!ctx) {
    errno = EINVAL;
    return nullptr;
  }
  auto *pd = new (std::nothrow) SimPd();
  if (!pd) {
    errno = ENOMEM;
    return nullptr;
  }
  pd->box.self = pd;
  pd->ctx = ctx;
  pd->box.ibv.context = context;
  static uint32_t next_handle = 1;
  pd->box.ibv.handle = next_handle++;
  return &pd->box.ibv;
}

int ibv_dealloc_pd(struct ibv_pd *ibv) {
  SimPd *pd = pd_of(ibv);
  if (!pd) return EINVAL;
  delete pd;
  return 0;
}

// ======================= memory regions ===================================

namespace {

constexpr unsigned kKnownAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                  IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                  IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED |
                                  IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB;

// Like the kernel's pinning: every page must be mapped.
bool range_mapped(const void *addr, size_t length) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t a = reinterpret_cast<uintptr_t>(addr) & ~(page - 1);
  uintptr_t end = reinterpret_cast<uintptr_t>(addr) + length;
  unsigned char vec[4096];
  while (a < end) {
    size_t n = std::min<size_t>((end - a + page - 1) / page, sizeof vec);
    if (mincore(reinterpret_cast<void *>(a), n * page, vec) != 0) return false;
    a += n * page;
  }
  return true;
}

uint64_t pages_of(size_t length) { return (length + 4095) / 4096; }

ibv_mr *reg_mr(ibv_pd *ibv, void *addr, size_t length, uint64_t iova, unsigned access) {
  SimPd *pd = pd_of(ibv);
  access &= ~static_cast<unsigned>(IBV_ACCESS_OPTIONAL_RANGE);  // hints only
  if (!pd || (access & ~kKnownAccess)) {
    set_errno_null(EINVAL);
    return nullptr;
  }
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(access & IBV_ACCESS_LOCAL_WRITE)) {
    std::lock_guard<std::mutex> lock(sim().mu);
    set_error_locked("ibv_reg_mr: REMOTE_WRITE/ATOMIC without LOCAL_WRITE");
    set_errno_null(EINVAL);
    return nullptr;
  }
  if (iova != reinterpret_cast<uintptr_t>(addr) || (access & IBV_ACCESS_ZERO_BASED)) {
    set_errno_null(EOPNOTSUPP);  // only VA-based regions are simulated
    return nullptr;
  }
  Sim &s = sim();
  spend_ns(s.reg_ns + s.reg_ns_per_page * pages_of(length));
  if (length && !range_mapped(addr, length)) {
    std::lock_guard<std::mutex> lock(s.mu);
    set_error_locked("ibv_reg_mr: range not mapped");
    set_errno_null(EFAULT);
    return nullptr;
  }
  auto *mr = new (std::nothrow) SimMr();
  if (!mr) {
    set_errno_null(ENOMEM);
    return nullptr;
  }
  mr->box.self = mr;
  mr->pd = pd;
  mr->access = access;
  std::lock_guard<std::mutex> lock(s.mu);
  mr->index = key_alloc_locked(KeyKind::kMr, mr);
  uint32_t key = key_make(mr->index, s.keys[mr->index].tag);
  ibv_mr &m = mr->box.ibv;
  m.context = ibv->context;
  m.pd = ibv;
  m.addr = addr;
  m.length = length;
  m.handle = mr->index;
  m.lkey = key;
  m.rkey = key;
  pin_add_locked(mr);
  s.stats.registrations++;
  return &m;
}

}  // namespace

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access) {
  return reg_mr(pd, addr, length, reinterpret_cast<uintptr_t>(addr),
                static_cast<unsigned>(access));
}

struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                               int access) {
  return reg_mr(pd, addr, length, iova, static_cast<unsigned>(access));
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                unsigned int access) {
  return reg_mr(pd, addr, length, iova, access);
}

int ibv_dereg_mr(struct ibv_mr *ibv) {
  SimMr *mr = mr_of(ibv);
  if (!mr) return EINVAL;
  Sim &s = sim();
  spend_ns(s.dereg_ns + s.dereg_ns_per_page * pages_of(ibv->length));
  std::lock_guard<std::mutex> lock(s.mu);
  if (mr->bound_mws > 0) {
    set_error_locked("ibv_dereg_mr: memory windows are still bound to the MR");
    return EBUSY;
  }
  key_free_locked(mr->index);
  pin_remove_locked(mr);
  s.stats.deregistrations++;
  delete mr;
  return 0;
}

// ======================= memory windows ===================================

static struct ibv_mw *sim_alloc_mw(struct ibv_pd *ibv, enum ibv_mw_type type) {
  SimPd *pd = pd_of(ibv);
  if (!pd) {
    errno = EINVAL;
    return nullptr;
  }
  if (type != IBV_MW_TYPE_2 || !(profile_of(pd->ctx).cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  auto *mw = new (std::nothrow) SimMw();
  if (!mw) {
    errno = ENOMEM;
    return nullptr;
  }
  mw->box.self = mw;
  mw->pd = pd;
  std::lock_guard<std::mutex> lock(sim().mu);
  mw->index = key_alloc_locked(KeyKind::kMw, mw);
  ibv_mw &w = mw->box.ibv;
  w.context = ibv->context;
  w.pd = ibv;
  w.rkey = key_make(mw->index, sim().keys[mw->index].tag);
  w.handle = mw->index;
  w.type = type;
  return &w;
}

static int sim_dealloc_mw(struct ibv_mw *ibv) {
  SimMw *mw = mw_of(ibv);
  if (!mw) return EINVAL;
  std::lock_guard<std::mutex> lock(sim().mu);
  if (mw->bound && mw->mr) mw->mr->bound_mws--;
  key_free_locked(mw->index);
  delete mw;
  return 0;
}

// ======================= mlx5dv indirect mkeys ============================

bool mlx5dv_is_supported(struct ibv_device *device) {
  auto *dev = owner_of<SimDevice>(device);
  return dev && kProfiles[dev->profile].mlx5dv;
}

struct mlx5dv_mkey *mlx5dv_create_mkey(struct mlx5dv_mkey_init_attr *attr) {
  SimPd *pd = attr ? pd_of(attr->pd) : nullptr;
  if (!pd || !profile_of(pd->ctx).mlx5dv) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  const uint32_t allowed =
      MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT | MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE;
  if (!(attr->create_flags & MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT) ||
      (attr->create_flags & ~allowed) || attr->max_entries == 0 ||
      attr->max_entries > profile_of(pd->ctx).max_mkey_entries) {
    errno = EINVAL;
    return nullptr;
  }
  auto *mk = new (std::nothrow) SimMkey();
  if (!mk) {
    errno = ENOMEM;
    return nullptr;
  }
  mk->box.self = mk;
  mk->pd = pd;
  mk->max_entries = attr->max_entries;
  mk->remote_inv = attr->create_flags & MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE;
  std::lock_guard<std::mutex> lock(sim().mu);
  mk->index = key_alloc_locked(KeyKind::kMkey, mk);
  uint32_t key = key_make(mk->index, sim().keys[mk->index].tag);
  mk->box.ibv.lkey = key;
  mk->box.ibv.rkey = key;
  return &mk->box.ibv;
}

int mlx5dv_destroy_mkey(struct mlx5dv_mkey *dv) {
  SimMkey *mk = owner_of<SimMkey>(dv);
  if (!mk) return EINVAL;
  std::lock_guard<std::mutex> lock(sim().mu);
  key_free_locked(mk->index);
  delete mk;
  return 0;
}

// ======================= completion queues ================================

struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                             struct ibv_comp_channel *channel, int comp_vector) {
  SimContext *ctx = ctx_of(context);
  if (!ctx || cqe < 1 || cqe > profile_of(ctx).max_cqe || comp_vector != 0) {
    errno = EINVAL;
    return nullptr;
  }
  auto *cq = new (std::nothrow) SimCq();
  if (!cq) {
    errno = ENOMEM;
    return nullptr;
  }
  cq->box.self = cq;
  cq->ctx = ctx;
  ibv_cq &c = cq->box.ibv;
  c.context = context;
  c.channel = channel;
  c.cq_context = cq_context;
  c.cqe = cqe;
  pthread_mutex_init(&c.mutex, nullptr);
  pthread_cond_init(&c.cond, nullptr);
  return &c;
}

int ibv_destroy_cq(struct ibv_cq *ibv) {
  SimCq *cq = cq_of(ibv);
  if (!cq) return EINVAL;
  {
    std::lock_guard<std::mutex> lock(sim().mu);
    for (SimQp *qp : cq->ctx->qps)
      if (qp->scq == cq || qp->rcq == cq) return EBUSY;
  }
  pthread_mutex_destroy(&ibv->mutex);
  pthread_cond_destroy(&ibv->cond);
  delete cq;
  return 0;
}

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context) {
  auto *ch = new (std::nothrow) ibv_comp_channel();
  if (!ch) return nullptr;
  ch->context = context;
  ch->fd = -1;
  return ch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *channel) {
  delete channel;
  return 0;
}

// ======================= queue pairs ======================================

namespace {

bool valid_caps(const Profile &p, const ibv_qp_cap &cap) {
  return cap.max_send_wr >= 1 && cap.max_send_wr <= static_cast<uint32_t>(p.max_qp_wr) &&
         cap.max_recv_wr <= static_cast<uint32_t>(p.max_qp_wr) &&
         cap.max_send_sge <= static_cast<uint32_t>(p.max_sge) &&
         cap.max_recv_sge <= static_cast<uint32_t>(p.max_sge) &&
         cap.max_inline_data <= p.max_inline_data;
}

ibv_qp *create_qp(SimContext *ctx, ibv_qp_init_attr_ex *attr, const mlx5dv_qp_init_attr *dv) {
  const Profile &p = profile_of(ctx);
  SimPd *pd = pd_of(attr->pd);
  if (!pd || !attr->send_cq || !attr->recv_cq || attr->srq || attr->qp_type != IBV_QPT_RC) {
    errno = attr->qp_type != IBV_QPT_RC ? EOPNOTSUPP : EINVAL;
    return nullptr;
  }
  if (!valid_caps(p, attr->cap)) {
    std::lock_guard<std::mutex> lock(sim().mu);
    set_error_locked("ibv_create_qp: capabilities exceed the device limits");
    errno = EINVAL;
    return nullptr;
  }
  auto *qp = new (std::nothrow) SimQp();
  if (!qp) {
    errno = ENOMEM;
    return nullptr;
  }
  qp->qpx.self = qp;
  qp->mqpx.self = qp;
  qp->ctx = ctx;
  qp->pd_ = pd;
  qp->scq = cq_of(attr->send_cq);
  qp->rcq = cq_of(attr->recv_cq);
  qp->cap = attr->cap;
  qp->cap.max_recv_sge = qp->cap.max_recv_sge ? qp->cap.max_recv_sge : 1;
  qp->sq_sig_all = attr->sq_sig_all != 0;
  if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
    qp->has_qpx = true;
    qp->send_ops = attr->send_ops_flags;
  }
  if (dv) {
    qp->is_mlx5dv = true;
    if (dv->comp_mask & MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS) qp->dv_send_ops = dv->send_ops_flags;
  }
  ibv_qp &q = qp->qpx.ibv.qp_base;
  q.context = &ctx->box.ibv.context;
  q.qp_context = attr->qp_context;
  q.pd = attr->pd;
  q.send_cq = attr->send_cq;
  q.recv_cq = attr->recv_cq;
  q.qp_type = IBV_QPT_RC;
  q.state = IBV_QPS_RESET;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  install_qpx_ops(qp);
  std::lock_guard<std::mutex> lock(sim().mu);
  q.qp_num = endpoint_register_locked(qp);
  q.handle = q.qp_num;
  qp->sq.ring.resize(qp->cap.max_send_wr);
  ctx->qps.push_back(qp);
  sim().qps.push_back(qp);
  return &q;
}

}  // namespace

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *init) {
  if (!pd || !init) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_qp_init_attr_ex ex{};
  memcpy(&ex, init, sizeof *init);
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd;
  ibv_qp *qp = create_qp(ctx_of(pd->context), &ex, nullptr);
  if (qp) init->cap = ex.cap;
  return qp;
}

static struct ibv_qp *sim_create_qp_ex(struct ibv_context *context,
                                       struct ibv_qp_init_attr_ex *attr) {
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD)) {
    errno = EINVAL;
    return nullptr;
  }
  return create_qp(ctx_of(context), attr, nullptr);
}

struct ibv_qp *mlx5dv_create_qp(struct ibv_context *context, struct ibv_qp_init_attr_ex *attr,
                                struct mlx5dv_qp_init_attr *dv) {
  SimContext *ctx = ctx_of(context);
  if (!ctx || !profile_of(ctx).mlx5dv) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD)) {
    errno = EINVAL;
    return nullptr;
  }
  mlx5dv_qp_init_attr none{};
  return create_qp(ctx, attr, dv ? dv : &none);
}

struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *ibv) {
  SimQp *qp = qp_of(ibv);
  return qp && qp->has_qpx ? &qp->qpx.ibv : nullptr;
}

struct mlx5dv_qp_ex *mlx5dv_qp_ex_from_ibv_qp_ex(struct ibv_qp_ex *qpx) {
  SimQp *qp = owner_of<SimQp>(qpx);
  return qp && qp->is_mlx5dv ? &qp->mqpx.ibv : nullptr;
}

namespace {

bool legal_transition(ibv_qp_state from, ibv_qp_state to) {
  if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) return true;
  switch (to) {
    case IBV_QPS_INIT:
      return from == IBV_QPS_RESET || from == IBV_QPS_INIT;
    case IBV_QPS_RTR:
      return from == IBV_QPS_INIT;
    case IBV_QPS_RTS:
      return from == IBV_QPS_RTR || from == IBV_QPS_RTS;
    default:
      return false;
  }
}

int connect_locked(SimQp *qp, uint32_t dest) {
  Endpoint *ep = endpoint_lookup_locked(dest);
  if (!ep || ep == qp) return EINVAL;
  qp->remote = ep;
  qp->dest_qpn = dest;
  if (auto *peer = dynamic_cast<SimPeer *>(ep)) peer->qp = qp;
  return 0;
}

void reset_locked(SimQp *qp) {
  qp_purge_locked(qp);
  qp->sq.clear();
  qp->rq.clear();
  qp->remote = nullptr;
}

void erase_qp(std::vector<SimQp *> &list, SimQp *qp) {
  for (size_t i = 0; i < list.size(); i++)
    if (list[i] == qp) {
      list.erase(list.begin() + static_cast<long>(i));
      return;
    }
}

}  // namespace

int ibv_modify_qp(struct ibv_qp *ibv, struct ibv_qp_attr *attr, int mask) {
  SimQp *qp = qp_of(ibv);
  if (!qp || !attr) return EINVAL;
  std::lock_guard<std::mutex> lock(sim().mu);
  if (!(mask & IBV_QP_STATE)) return 0;
  ibv_qp_state to = attr->qp_state;
  if (!legal_transition(ibv->state, to)) return EINVAL;
  if (to == IBV_QPS_RTR) {
    if (!(mask & IBV_QP_DEST_QPN)) return EINVAL;
    int err = connect_locked(qp, attr->dest_qp_num);
    if (err) return err;
  }
  if (to == IBV_QPS_ERR) {
    qp_to_error_locked(qp);
    return 0;
  }
  if (to == IBV_QPS_RESET) reset_locked(qp);
  ibv->state = to;
  return 0;
}

int ibv_query_qp(struct ibv_qp *ibv, struct ibv_qp_attr *attr, int, struct ibv_qp_init_attr *init) {
  SimQp *qp = qp_of(ibv);
  if (!qp || !attr) return EINVAL;
  std::lock_guard<std::mutex> lock(sim().mu);
  memset(attr, 0, sizeof *attr);
  attr->qp_state = ibv->state;
  attr->cur_qp_state = ibv->state;
  attr->cap = qp->cap;
  attr->dest_qp_num = qp->dest_qpn;
  attr->port_num = 1;
  if (init) {
    memset(init, 0, sizeof *init);
    init->qp_context = ibv->qp_context;
    init->send_cq = ibv->send_cq;
    init->recv_cq = ibv->recv_cq;
    init->cap = qp->cap;
    init->qp_type = IBV_QPT_RC;
    init->sq_sig_all = qp->sq_sig_all;
  }
  return 0;
}

int ibv_destroy_qp(struct ibv_qp *ibv) {
  SimQp *qp = qp_of(ibv);
  if (!qp) return EINVAL;
  {
    std::lock_guard<std::mutex> lock(sim().mu);
    qp_purge_locked(qp);
    endpoint_unregister_locked(ibv->qp_num);
    Sim &s = sim();
    for (Endpoint *ep : s.endpoints) {
      if (!ep) continue;
      if (SimQp *other = ep->as_qp(); other && other->remote == qp) other->remote = nullptr;
      if (auto *peer = dynamic_cast<SimPeer *>(ep); peer && peer->qp == qp) peer->qp = nullptr;
    }
    for (KeySlot &slot : s.keys)
      if (slot.kind == KeyKind::kMw && static_cast<SimMw *>(slot.obj)->qp == qp)
        static_cast<SimMw *>(slot.obj)->qp = nullptr;
    erase_qp(qp->ctx->qps, qp);
    erase_qp(s.qps, qp);
  }
  pthread_mutex_destroy(&ibv->mutex);
  pthread_cond_destroy(&ibv->cond);
  delete qp;
  return 0;
}

// ======================= librdmacm subset =================================

namespace {

struct SimCmId {
  rdma_cm_id id{};
  bool own_context = false;
  bool own_send_cq = false, own_recv_cq = false;
};

SimCmId *cm_of(rdma_cm_id *id) { return reinterpret_cast<SimCmId *>(id); }

int cm_fail(int err) {
  errno = err;
  return -1;
}

// Binding picks the device: the id gets its own context on it.
int cm_bind(rdma_cm_id *id) {
  if (!id) return cm_fail(EINVAL);
  if (id->verbs) return 0;
  int n = 0;
  ibv_device **list = ibv_get_device_list(&n);
  if (!list || n < 1) return cm_fail(ENODEV);
  id->verbs = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!id->verbs) return cm_fail(ENODEV);
  id->port_num = 1;
  cm_of(id)->own_context = true;
  return 0;
}

}  // namespace

struct rdma_event_channel *rdma_create_event_channel(void) {
  auto *ch = new (std::nothrow) rdma_event_channel();
  if (ch) ch->fd = -1;  // no events: connections are made by simverbs_peer_connect
  return ch;
}

void rdma_destroy_event_channel(struct rdma_event_channel *channel) { delete channel; }

int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **out, void *context,
                   enum rdma_port_space ps) {
  if (!out) return cm_fail(EINVAL);
  auto *c = new (std::nothrow) SimCmId();
  if (!c) return cm_fail(ENOMEM);
  c->id.channel = channel;
  c->id.context = context;
  c->id.ps = ps;
  c->id.qp_type = IBV_QPT_RC;
  *out = &c->id;
  return 0;
}

int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *) { return cm_bind(id); }

int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *, struct sockaddr *, int) {
  return cm_bind(id);
}

int rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *attr) {
  if (!id || !attr || !id->verbs || id->qp) return cm_fail(EINVAL);
  ibv_qp_init_attr_ex a = *attr;
  if (!(a.comp_mask & IBV_QP_INIT_ATTR_PD) || !a.pd) {
    if (!id->pd) return cm_fail(EINVAL);
    a.comp_mask |= IBV_QP_INIT_ATTR_PD;
    a.pd = id->pd;
  }
  if (a.pd->context != id->verbs) return cm_fail(EINVAL);
  bool own_send = !a.send_cq, own_recv = !a.recv_cq;
  auto make_cq = [&](uint32_t n) { return ibv_create_cq(id->verbs, static_cast<int>(std::max(n, 1u)), nullptr, nullptr, 0); };
  if (own_send) a.send_cq = make_cq(a.cap.max_send_wr);
  if (own_recv) a.recv_cq = make_cq(a.cap.max_recv_wr);
  ibv_qp *qp = a.send_cq && a.recv_cq ? ibv_create_qp_ex(id->verbs, &a) : nullptr;
  if (!qp) {
    int err = errno ? errno : ENOMEM;
    if (own_send && a.send_cq) ibv_destroy_cq(a.send_cq);
    if (own_recv && a.recv_cq) ibv_destroy_cq(a.recv_cq);
    return cm_fail(err);
  }
  id->qp = qp;
  id->pd = a.pd;
  id->send_cq = a.send_cq;
  id->recv_cq = a.recv_cq;
  cm_of(id)->own_send_cq = own_send;
  cm_of(id)->own_recv_cq = own_recv;
  attr->cap = a.cap;
  return 0;
}

int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *init) {
  if (!init) return cm_fail(EINVAL);
  ibv_qp_init_attr_ex ex{};
  memcpy(&ex, init, sizeof *init);
  ex.comp_mask = pd ? IBV_QP_INIT_ATTR_PD : 0;
  ex.pd = pd;
  int ret = rdma_create_qp_ex(id, &ex);
  if (ret == 0) init->cap = ex.cap;
  return ret;
}

void rdma_destroy_qp(struct rdma_cm_id *id) {
  if (!id || !id->qp) return;
  ibv_destroy_qp(id->qp);
  id->qp = nullptr;
  if (cm_of(id)->own_send_cq) ibv_destroy_cq(id->send_cq);
  if (cm_of(id)->own_recv_cq) ibv_destroy_cq(id->recv_cq);
  cm_of(id)->own_send_cq = cm_of(id)->own_recv_cq = false;
  id->send_cq = id->recv_cq = nullptr;
}

int rdma_destroy_id(struct rdma_cm_id *id) {
  if (!id) return cm_fail(EINVAL);
  if (id->qp) return cm_fail(EBUSY);
  if (cm_of(id)->own_context && ibv_close_device(id->verbs)) return cm_fail(EBUSY);
  delete cm_of(id);
  return 0;
}

}  // extern "C"
