# Finds LLVM/Clang 22 from Debian's packages (/usr/lib/llvm-22) and defines
# the link sets the analyzer targets use.
#
# The checks are linked against the shared libclang-cpp and libLLVM (as
# Debian's clang-tidy-22 is), plus clang-tidy's engine from libclangTidy.a for
# the standalone driver. The plugin leaves clang-tidy's symbols undefined:
# clang-tidy-22 exports them to the modules it loads.
list(APPEND CMAKE_PREFIX_PATH /usr/lib/llvm-22)
find_package(LLVM 22.1 REQUIRED CONFIG)
# Debian's exported clangd targets (remote index) name gRPC::grpc++ and
# protobuf::libprotobuf: define them before Clang's targets are imported.
find_package(Protobuf QUIET)
find_package(gRPC CONFIG QUIET)
find_package(Clang 22.1 REQUIRED CONFIG)
if(TARGET clangdMain AND TARGET gRPC::grpc++ AND TARGET protobuf::libprotobuf)
  set(_ulplint_clangd_default ON)
else()
  set(_ulplint_clangd_default OFF)
  message(STATUS "ulplint: no clangd libraries or gRPC/protobuf: ulplint-clangd is not built")
endif()
option(ULPLINT_BUILD_CLANGD "Build ulplint-clangd (clangd with the rdma checks)"
  ${_ulplint_clangd_default})
message(STATUS "ulplint: LLVM ${LLVM_PACKAGE_VERSION} at ${LLVM_INSTALL_PREFIX}")

set(ULPLINT_LLVM_LIBDIR ${LLVM_LIBRARY_DIR})
set(ULPLINT_LLVM_BINDIR ${LLVM_TOOLS_BINARY_DIR})

add_library(ulplint_llvm_flags INTERFACE)
target_include_directories(ulplint_llvm_flags SYSTEM INTERFACE
  ${LLVM_INCLUDE_DIRS} ${CLANG_INCLUDE_DIRS})
target_compile_definitions(ulplint_llvm_flags INTERFACE ${LLVM_DEFINITIONS_LIST})
if(NOT LLVM_ENABLE_RTTI)
  target_compile_options(ulplint_llvm_flags INTERFACE -fno-rtti)
endif()
target_link_libraries(ulplint_llvm_flags INTERFACE
  ${ULPLINT_LLVM_LIBDIR}/libclang-cpp.so
  ${ULPLINT_LLVM_LIBDIR}/libLLVM.so)

# The analyzer's own code builds without a warning at -Wall -Wextra
# (LLVM's and Clang's headers are system headers above).
add_library(ulplint_warnings INTERFACE)
target_compile_options(ulplint_warnings INTERFACE -Wall -Wextra)

find_program(ULPLINT_CLANG_TIDY clang-tidy-22 HINTS ${ULPLINT_LLVM_BINDIR} REQUIRED)
find_program(ULPLINT_CLANG clang-22 HINTS ${ULPLINT_LLVM_BINDIR} REQUIRED)
find_program(ULPLINT_FILECHECK FileCheck HINTS ${ULPLINT_LLVM_BINDIR} REQUIRED)
find_program(ULPLINT_LIT NAMES lit lit.py llvm-lit
  HINTS ${ULPLINT_LLVM_BINDIR} ${LLVM_INSTALL_PREFIX}/build/utils/lit REQUIRED)
