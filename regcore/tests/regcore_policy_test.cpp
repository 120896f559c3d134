// Prints, per device profile, the strategy the policy table picks for a grid
// of I/O shapes, runs each I/O for real on simverbs, and fails if the
// context's actual strategy, the dry run and the table disagree or the data
// did not arrive. The lit test checks the printed strategies against the
// table in docs/regcore.md.
//
//   regcore_policy_test [--profile=mthca|mlx4|mlx5|iwarp|all] [--force-mr]
//                       [--describe]
#include <regcore/regcore.h>
#include <simverbs/simverbs.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "env.hpp"

namespace {

struct Shape {
  unsigned runs;
  uint32_t run_len;
};

// Run counts around every SGE limit of the profiles (2, 4, 16), and 20 runs
// below and above the 64 KiB staging threshold.
const Shape kShapes[] = {{1, 512}, {2, 512}, {4, 512}, {5, 512}, {16, 512},
                         {17, 512}, {20, 64}, {20, 4096}};

const char *dir_name(regcore_dir d) { return d == REGCORE_DIR_READ ? "READ" : "WRITE"; }

struct Failure {
  std::string what;
};

// Builds `shape` out of non-adjacent pieces of `arena`.
std::vector<ibv_sge> make_sges(std::vector<uint8_t> &arena, const Shape &shape) {
  std::vector<ibv_sge> sge;
  uint32_t stride = shape.run_len + 64;
  for (unsigned i = 0; i < shape.runs; i++)
    sge.push_back({reinterpret_cast<uintptr_t>(arena.data()) + i * stride, shape.run_len, 0});
  return sge;
}

bool data_moved(testenv::Env &e, regcore_dir dir, const std::vector<ibv_sge> &sge, uint64_t off) {
  for (const ibv_sge &s : sge) {
    auto *local = reinterpret_cast<const uint8_t *>(static_cast<uintptr_t>(s.addr));
    if (std::memcmp(local, e.remote.data() + off, s.length) != 0) return false;
    off += s.length;
  }
  (void)dir;
  return true;
}

// Runs one I/O; returns the line to print or throws Failure.
std::string run_case(testenv::Env &e, const regcore_policy &pol, regcore_dir dir, const Shape &shape,
                     unsigned flags, uint8_t fill) {
  std::vector<uint8_t> arena(shape.runs * (shape.run_len + 64) + 64, fill);
  for (size_t i = 0; i < arena.size(); i++) arena[i] = static_cast<uint8_t>(fill + i * 31);
  std::vector<ibv_sge> sge = make_sges(arena, shape);
  uint64_t bytes = static_cast<uint64_t>(shape.runs) * shape.run_len;
  regcore_rw_strategy table = regcore_policy_decide(&pol, dir, shape.runs, bytes, flags);
  regcore_rw_strategy dry;
  if (regcore_rw_strategy_for(e.core, dir, sge.data(), shape.runs, &dry)) throw Failure{"dry run failed"};
  regcore_rw_ctx *ctx = nullptr;
  uint64_t off = 4096;
  int nwr = regcore_rw_ctx_init(&ctx, e.core, e.qp, sge.data(), shape.runs,
                                reinterpret_cast<uintptr_t>(e.remote.data()) + off, e.remote_rkey, dir);
  if (nwr <= 0) throw Failure{std::string("init: ") + regcore_last_error()};
  regcore_rw_strategy actual = regcore_rw_ctx_strategy(ctx);
  if (regcore_rw_ctx_post(ctx, e.qp, 0x1234, nullptr)) throw Failure{regcore_last_error()};
  ibv_wc wc;
  if (!e.poll_one(e.scq, &wc) || wc.wr_id != 0x1234 || wc.status != IBV_WC_SUCCESS)
    throw Failure{"no successful completion"};
  if (regcore_poll_cq(e.core, e.scq, 1, &wc) != 0) throw Failure{"more than one completion"};
  bool ok = data_moved(e, dir, sge, off);
  regcore_rw_ctx_destroy(ctx);
  if (actual != table || dry != table)
    throw Failure{std::string("MISMATCH table=") + regcore_rw_strategy_name(table) +
                  " dry=" + regcore_rw_strategy_name(dry) + " actual=" + regcore_rw_strategy_name(actual)};
  if (!ok) throw Failure{"data did not arrive"};
  char line[160];
  snprintf(line, sizeof line, "%s runs=%u bytes=%llu -> %s wrs=%d data=ok", dir_name(dir), shape.runs,
           static_cast<unsigned long long>(bytes), regcore_rw_strategy_name(actual), nwr);
  return line;
}

const char *transport_name(ibv_transport_type t) { return t == IBV_TRANSPORT_IWARP ? "iwarp" : "ib"; }

int run_profile(simverbs_profile p, unsigned flags) {
  testenv::Options o;
  o.max_sge_per_ctx = 32;
  o.flags = flags;
  testenv::Env e(p, o);
  regcore_policy pol{};
  regcore_policy_get(e.core, &pol);
  std::printf("profile %s class=%s transport=%s max_sge_write=%u max_sge_read=%u wrs_per_ctx=%u "
              "reg=%s read_sink_access=%#x\n",
              simverbs_profile_name(p), pol.device_class, transport_name(pol.transport),
              pol.max_sge_write, pol.max_sge_read, pol.wrs_per_ctx,
              regcore_reg_strategy_name(pol.reg_strategy), pol.read_sink_access);
  int failures = 0;
  uint8_t fill = 1;
  for (regcore_dir dir : {REGCORE_DIR_READ, REGCORE_DIR_WRITE})
    for (const Shape &shape : kShapes) {
      try {
        std::printf("  %s\n", run_case(e, pol, dir, shape, flags, fill++).c_str());
      } catch (const Failure &f) {
        std::printf("  FAIL %s runs=%u: %s\n", dir_name(dir), shape.runs, f.what.c_str());
        failures++;
      }
    }
  std::vector<uint8_t> buf(4096);
  regcore_reg_ctx *reg;
  if (regcore_reg_ctx_init(&reg, e.core, e.qp, buf.data(), buf.size(), IBV_ACCESS_REMOTE_WRITE) == 0) {
    std::printf("  REG -> %s remote_inv=%d\n", regcore_reg_strategy_name(regcore_reg_ctx_strategy(reg)),
                regcore_reg_ctx_remote_inv_ok(reg));
    regcore_reg_ctx_release(reg, 0, nullptr, nullptr);
  } else {
    std::printf("  FAIL REG: %s\n", regcore_last_error());
    failures++;
  }
  return failures;
}

}  // namespace

int main(int argc, char **argv) {
  std::string which = "all";
  unsigned flags = 0;
  bool describe = false;
  for (int i = 1; i < argc; i++) {
    if (!std::strncmp(argv[i], "--profile=", 10)) which = argv[i] + 10;
    else if (!std::strcmp(argv[i], "--force-mr")) flags |= REGCORE_F_FORCE_MR;
    else if (!std::strcmp(argv[i], "--describe")) describe = true;
    else {
      std::fprintf(stderr, "usage: %s [--profile=NAME|all] [--force-mr] [--describe]\n", argv[0]);
      return 2;
    }
  }
  if (describe) {
    int need = regcore_policy_describe(nullptr, nullptr, 0);
    std::string text(static_cast<size_t>(need) + 1, '\0');
    regcore_policy_describe(nullptr, &text[0], text.size());
    std::printf("%s", text.c_str());
  }
  int failures = 0;
  for (simverbs_profile p : testenv::kAllProfiles)
    if (which == "all" || which == simverbs_profile_name(p)) failures += run_profile(p, flags);
  std::printf("policy failures=%d\n", failures);
  return failures ? 1 : 0;
}
