// Helpers shared by the store tests: temporary state directories under /tmp, removed after.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>

#include "store/store.h"
#include "tests/support/temp_dir.h"

// boost's operator<< for result<T> is unconstrained and breaks Catch2 for T without one.
template <class T>
struct Catch::StringMaker<boost::system::result<T>> {
  static std::string convert(const boost::system::result<T>& r) {
    return r ? std::string("result(value)") : "result(error: " + r.error().message() + ")";
  }
};

namespace toolhost::store::test {

using toolhost::testing::TempDir;

inline Options options(const std::filesystem::path& stateDir,
                       std::vector<std::string> tables = {"items", "other"}) {
  Options o;
  o.stateDir = stateDir;
  o.tables = std::move(tables);
  return o;
}

inline StorePtr openOrFail(const Options& o) {
  auto store = Store::open(o);
  if (!store) FAIL("open failed: " << store.error().message);
  return std::move(*store);
}

inline std::string readFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Waits for a forked child and returns its exit status, or -signal if it was killed.
inline int waitChild(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1000;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return -1001;
}

}  // namespace toolhost::store::test
