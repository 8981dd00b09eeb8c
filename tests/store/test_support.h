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

// boost's operator<< for result<T> is unconstrained and breaks Catch2 for T without one.
template <class T>
struct Catch::StringMaker<boost::system::result<T>> {
  static std::string convert(const boost::system::result<T>& r) {
    return r ? std::string("result(value)") : "result(error: " + r.error().message() + ")";
  }
};

namespace toolhost::store::test {

class TempDir {
 public:
  TempDir() {
    std::string pattern = "/tmp/toolhost-store-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) FAIL("mkdtemp failed");
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }
  // A state directory that does not exist yet, so open() has to create it.
  std::filesystem::path state() const { return path_ / "state"; }

 private:
  std::filesystem::path path_;
};

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
