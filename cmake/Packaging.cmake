# Debian packages with CPack, one per install component:
#
#   ulplint          ulplint, ulplint-clangd, ulplint-kernel, the clang-tidy
#                    plugin (lib/<multiarch>/ulplint/), man pages, docs
#   libregcore0      libregcore.so.0
#   libregcore-dev   headers, libregcore.so/.a, simverbs and regcore over
#                    simverbs (libsimverbs.a, libregcore-sim.a), CMake
#                    package, pkg-config files, regcore(3)
#
# Library dependencies come from dpkg-shlibdeps (Debian's libllvm22,
# libclang-cpp22, gRPC for ulplint-clangd); what no ELF file says is listed
# here: clang's resource headers (stddef.h, ...) that every parse needs.
# scripts/build-packages.sh builds and runs cpack.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ulplint)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "ulplint maintainers <maintainers@users.noreply.a-seed-23de0e14.example>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "static analysis of RDMA upper-layer-protocol code")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)

set(CPACK_COMPONENTS_ALL)
if(ULPLINT_BUILD_ANALYZER)
  list(APPEND CPACK_COMPONENTS_ALL ulplint)
endif()
if(ULPLINT_BUILD_REGCORE)
  list(APPEND CPACK_COMPONENTS_ALL libregcore0 libregcore-dev)
endif()

set(CPACK_DEBIAN_ULPLINT_PACKAGE_NAME ulplint)
set(CPACK_DEBIAN_ULPLINT_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_ULPLINT_PACKAGE_DEPENDS "libclang-common-22-dev, python3")
set(CPACK_DEBIAN_ULPLINT_PACKAGE_RECOMMENDS "clang-tidy-22")
set(CPACK_DEBIAN_ULPLINT_DESCRIPTION
  "static analysis of RDMA upper-layer-protocol code
 ulplint finds memory-registration bugs in RDMA ULPs (kernel code on
 rdma/ib_verbs.h, userspace code on rdma-core) and points them at the
 core-managed APIs, rdma_rw and regcore. It runs as a command for CI
 (SARIF, Code Quality, baselines, shards), as a clang-tidy-22 plugin and
 as ulplint-clangd for editors; ulplint-kernel runs it over kernel trees.")

set(CPACK_DEBIAN_LIBREGCORE0_PACKAGE_NAME libregcore0)
set(CPACK_DEBIAN_LIBREGCORE0_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_LIBREGCORE0_DESCRIPTION
  "core-managed RDMA memory registration for userspace ULPs
 regcore does RDMA READ/WRITE for a scatter/gather list, or hands out a
 remote key for a buffer, and keeps local registration, the extra work
 requests and invalidation to itself. This package has the shared library.")

set(CPACK_DEBIAN_LIBREGCORE-DEV_PACKAGE_NAME libregcore-dev)
set(CPACK_DEBIAN_LIBREGCORE-DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_LIBREGCORE-DEV_PACKAGE_DEPENDS "libibverbs-dev")
set(CPACK_DEBIAN_LIBREGCORE-DEV_DESCRIPTION
  "core-managed RDMA memory registration for userspace ULPs (development)
 Headers, static libraries, the CMake package (regcore::regcore) and
 pkg-config files of regcore, and simverbs, a software RDMA device that
 regcore and ULPs run on without RDMA hardware (regcore::sim,
 pkg-config regcore-sim).")
set(CPACK_COMPONENT_LIBREGCORE-DEV_DEPENDS libregcore0)

include(CPack)
