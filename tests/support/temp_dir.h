// A fresh directory under /tmp (short, so socket paths stay far below 108 bytes), removed with
// everything in it on destruction. Header-only: every test executable may use it.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace toolhost::testing {

class TempDir {
 public:
  TempDir() {
    std::string pattern = "/tmp/th-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // A state directory that does not exist yet, so whatever opens it has to create it.
  std::filesystem::path state() const { return path_ / "state"; }

 private:
  std::filesystem::path path_;
};

}  // namespace toolhost::testing
