// A check of every page of the state database, made in a process of its own.
//
// LMDB keeps no checksums and trusts what it reads: a damaged page (a disk error, a bad copy, an
// editor) is followed wherever it points, and the first read that touches it can kill the
// process that made it (SIGSEGV or SIGBUS reading outside the map, an LMDB assertion). So the
// daemon does not walk its own database to find out: it runs a child (toolhostd --check-store
// <db>) that walks every table, every entry and every byte of every value, and takes the
// child's crash, as much as its report, as the answer.
//
// Caveats:
//  - walkDatabase() may kill the process that calls it when the database is damaged: call it
//    only in the child (runPageCheck). checkInChild() is safe anywhere, from any thread; it
//    blocks until the child ends (or the timeout, when it kills the child).
//  - The walk sees one snapshot. It finds what is damaged in the pages reachable from the
//    current meta page when it runs, nothing written later, and nothing LMDB cannot tell from
//    valid data (a changed byte inside a value: the registry's hashes find those).
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "store/store.h"

namespace toolhost::store {

// What the walk found damaged (empty when nothing), a sentence each, the first kMaxPageProblems.
inline constexpr std::size_t kMaxPageProblems = 20;
std::vector<std::string> walkDatabase(const std::filesystem::path& db);

// What walkDatabase found damaged (empty when nothing); a failure that is no damage (the
// environment cannot be opened, no reader slot is free) throws std::runtime_error.
//
// The child's main: argv[2] is the LMDB directory. Prints the problems, one per line, and
// returns kPageCheckFound when there are any, 0 when there are none, 2 when it could not check.
inline constexpr int kPageCheckFound = 3;
int runPageCheck(int argc, char** argv);

// How to start the child: the executable and the arguments before the database's path.
struct PageCheckLaunch {
  std::string executable;
  std::vector<std::string> arguments;
  // Under systemd's default start timeout (90 s); a gibibyte reads in a second or two.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// Runs the check on `db` in a child: std::nullopt when it found nothing wrong, else what it
// found (damaged) or why it could not finish (not damaged: it could not start, ran out of time,
// or met an error that is no damage, such as a full reader table).
std::optional<PageCheckFailure> checkInChild(const PageCheckLaunch& launch,
                                             const std::filesystem::path& db);

}  // namespace toolhost::store
