# Third-party dependencies, all from Debian 12 packages (scripts/deps.sh installs them).
# V8 comes from libnode108/libnode-dev, either installed or unpacked into .deps/.

set(TOOLHOST_DEPS_PREFIX "${CMAKE_SOURCE_DIR}/.deps/usr" CACHE PATH "Local prefix for unpacked packages")

find_package(Boost 1.81.0 EXACT REQUIRED CONFIG COMPONENTS json url system)
find_package(OpenSSL 3 REQUIRED)
find_package(Threads REQUIRED)
find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
find_package(CLI11 REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(LMDB REQUIRED IMPORTED_TARGET lmdb)
pkg_check_modules(SYSTEMD REQUIRED IMPORTED_TARGET libsystemd)
pkg_check_modules(TOMLPP REQUIRED IMPORTED_TARGET tomlplusplus)
# The sandbox hosts' system call filter (runtime/confinement.cc).
pkg_check_modules(SECCOMP REQUIRED IMPORTED_TARGET libseccomp)

# Asio and Beast are compiled once, in toolhost_asio (see protocol/CMakeLists.txt).
add_library(toolhost_boost INTERFACE)
target_link_libraries(toolhost_boost INTERFACE Boost::boost Boost::json Boost::url Boost::system
                                               Threads::Threads)
target_compile_definitions(toolhost_boost INTERFACE
  BOOST_ASIO_SEPARATE_COMPILATION BOOST_BEAST_SEPARATE_COMPILATION
  BOOST_ASIO_NO_DEPRECATED BOOST_ASIO_DISABLE_BOOST_COROUTINE)

# V8 (10.2, from Node 18's libnode).
find_path(V8_INCLUDE_DIR v8.h
  PATHS "${TOOLHOST_DEPS_PREFIX}/include/node" /usr/include/node NO_DEFAULT_PATH REQUIRED)
find_library(V8_LIBRARY NAMES node libnode.so.108
  PATHS "${TOOLHOST_DEPS_PREFIX}/lib/x86_64-linux-gnu" /usr/lib/x86_64-linux-gnu NO_DEFAULT_PATH REQUIRED)
add_library(toolhost_v8 INTERFACE)
target_include_directories(toolhost_v8 SYSTEM INTERFACE "${V8_INCLUDE_DIR}")
target_link_libraries(toolhost_v8 INTERFACE "${V8_LIBRARY}")
# Must match how Debian built V8: no pointer compression, no V8 sandbox.
target_compile_definitions(toolhost_v8 INTERFACE V8_DEPRECATION_WARNINGS=0)
get_filename_component(V8_LIBRARY_DIR "${V8_LIBRARY}" DIRECTORY)
set(CMAKE_BUILD_RPATH "${V8_LIBRARY_DIR}")
if(NOT V8_LIBRARY_DIR STREQUAL "/usr/lib/x86_64-linux-gnu")
  set(CMAKE_INSTALL_RPATH "${V8_LIBRARY_DIR}")
endif()

# valijson is header-only; either installed or unpacked into .deps/.
find_path(VALIJSON_INCLUDE_DIR valijson/validator.hpp
  PATHS "${TOOLHOST_DEPS_PREFIX}/include" /usr/include NO_DEFAULT_PATH REQUIRED)
add_library(toolhost_valijson INTERFACE)
target_include_directories(toolhost_valijson SYSTEM INTERFACE "${VALIJSON_INCLUDE_DIR}")
# Without it valijson reports an invalid schema (a negative minLength, "type": "objekt", a
# number too large for its constraint) by printing it and calling abort(): one bad schema from
# a client would end the daemon. With it, it throws, and JsonSchema turns that into an error.
target_compile_definitions(toolhost_valijson INTERFACE VALIJSON_USE_EXCEPTIONS=1)

# mimalloc as toolhostd's malloc (and the bench's, so that its floors pay the same): a call
# allocates and frees many small blocks on one thread that another allocated, where glibc's
# arenas take locks and consolidate; at 64 calls in flight mimalloc cut the CPU per call by about
# 40%. Linked as a shared library ahead of libc, it serves every malloc of the process, V8's and
# libnode's included. Off under sanitizers, which bring their own allocator.
if(TOOLHOST_SANITIZE)
  set(_mimalloc_default OFF)
else()
  set(_mimalloc_default ON)
endif()
option(TOOLHOST_MIMALLOC "Link toolhostd with mimalloc as its malloc" ${_mimalloc_default})
add_library(toolhost_malloc INTERFACE)
if(TOOLHOST_MIMALLOC)
  find_package(mimalloc 2.0 CONFIG REQUIRED)
  target_link_libraries(toolhost_malloc INTERFACE mimalloc)
  target_compile_definitions(toolhost_malloc INTERFACE TOOLHOST_MIMALLOC=1)
endif()

if(TOOLHOST_BUILD_TESTS)
  find_package(Catch2 2.13 REQUIRED)
  include(Catch)
endif()
