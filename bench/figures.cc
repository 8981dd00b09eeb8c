// Percentiles, the `key value` output, and process-tree samples from /proc.
#include "bench/bench.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>

namespace toolhost::bench {

double percentileNs(std::vector<std::int64_t>& samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(samples.size())));
  rank = std::clamp<std::size_t>(rank, 1, samples.size());
  return static_cast<double>(samples[rank - 1]);
}

double meanNs(const std::vector<std::int64_t>& samples) {
  if (samples.empty()) return 0;
  return static_cast<double>(std::accumulate(samples.begin(), samples.end(), std::int64_t{0})) /
         static_cast<double>(samples.size());
}

void emit(std::string_view key, double value) {
  std::printf("%.*s %.3f\n", static_cast<int>(key.size()), key.data(), value);
  std::fflush(stdout);
}

void emit(std::string_view key, std::string_view value) {
  std::printf("%.*s %.*s\n", static_cast<int>(key.size()), key.data(), static_cast<int>(value.size()),
              value.data());
  std::fflush(stdout);
}

namespace {

std::string readFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A `Name:   1234 kB` line of /proc/<pid>/status.
std::uint64_t statusKb(const std::string& status, std::string_view name) {
  auto at = status.find(std::string(name) + ":");
  if (at == std::string::npos) return 0;
  return std::strtoull(status.c_str() + at + name.size() + 1, nullptr, 10);
}

}  // namespace

TreeSample sampleTree(pid_t root) {
  static const double ticksPerSecond = static_cast<double>(sysconf(_SC_CLK_TCK));
  TreeSample sample;
  std::vector<pid_t> pending{root};
  while (!pending.empty()) {
    pid_t pid = pending.back();
    pending.pop_back();
    const std::filesystem::path dir = "/proc/" + std::to_string(pid);
    // Fields after the command name, which is in parentheses and may hold spaces: utime and
    // stime are fields 14 and 15 of the line, so the 12th and 13th after ')'.
    std::string stat = readFile(dir / "stat");
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;  // gone meanwhile
    std::istringstream fields(stat.substr(close + 2));
    std::string field;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && fields >> field; ++i) {
      if (i == 14) utime = std::stoull(field);
      if (i == 15) stime = std::stoull(field);
    }
    sample.cpuSeconds += static_cast<double>(utime + stime) / ticksPerSecond;
    std::string status = readFile(dir / "status");
    sample.rssKb += statusKb(status, "VmRSS");
    sample.rssAnonKb += statusKb(status, "RssAnon");
    sample.pssKb += statusKb(readFile(dir / "smaps_rollup"), "Pss");
    ++sample.processes;
    std::error_code ignored;
    for (const auto& task : std::filesystem::directory_iterator(dir / "task", ignored)) {
      std::istringstream children(readFile(task.path() / "children"));
      pid_t child = 0;
      while (children >> child) pending.push_back(child);
    }
  }
  return sample;
}

std::uint64_t selfRssKb() { return statusKb(readFile("/proc/self/status"), "VmRSS"); }

}  // namespace toolhost::bench
