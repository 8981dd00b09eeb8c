// The table of one run: every figure beside its floor, the ratio, the target and whether
// it is met. Reads the `key value` lines the other subcommands printed (run.sh prefixes them
// with echo., daemon., v8. and meta.). Printed as markdown, and written to a file when asked.
#include "bench/bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

namespace toolhost::bench {

namespace {

class Figures {
 public:
  explicit Figures(const std::filesystem::path& file) {
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) {
      auto space = line.find(' ');
      if (space == std::string::npos) continue;
      values_[line.substr(0, space)] = line.substr(space + 1);
    }
  }
  std::optional<double> number(const std::string& key) const {
    auto found = values_.find(key);
    if (found == values_.end()) return std::nullopt;
    try {
      return std::stod(found->second);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  std::string text(const std::string& key) const {
    auto found = values_.find(key);
    return found == values_.end() ? "n/a" : found->second;
  }

 private:
  std::map<std::string, std::string> values_;
};

std::string format(std::optional<double> value, const char* unit) {
  if (!value) return "n/a";
  char out[64];
  const double v = *value;
  const bool whole = v == std::floor(v);
  const int decimals = whole || std::fabs(v) >= 1000 ? 0 : std::fabs(v) >= 100 ? 1 : 2;
  std::snprintf(out, sizeof out, *unit != '\0' ? "%.*f %s" : "%.*f", decimals, v, unit);
  return out;
}

enum class Target { none, atMost, atLeast };

struct Row {
  std::string what;
  std::optional<double> measured;
  std::string floorName;
  std::optional<double> floor;
  const char* unit;
  Target target = Target::none;
  double bound = 0;
};

// What a sandboxed call pays at least, from the parts the design cannot drop, each measured in
// this run: the daemon's own path (its built-in tool: parse, dispatch, both schemas, the answer;
// no hop, no V8), what one hop adds to the echo (through a process; the thread hop costs about
// the same), and the in-process V8 call. Their sum against the target shows which targets a
// faster implementation of this design could reach on this machine and which it could not.
void partsTable(std::ostringstream& out, const Figures& f) {
  auto n = [&](const std::string& key) { return f.number(key); };
  struct Part {
    const char* what;
    const char* key;
    const char* unit;
    double target;
  };
  const std::vector<Part> parts{
      {"Warm call, sequential, p50", "seq.p50_us", "µs", 1.3},
      {"Server CPU per call, 64 in flight", "tput.64.server_cpu_us_per_call", "µs", 3.0}};
  const auto v8call = n("v8.warm_async.p50_us");
  out << "\nThe parts every sandboxed call pays, measured in this run, against the target: the "
         "daemon without a sandbox (built-in tool), what one hop adds (echo through a process "
         "minus echo), the in-process V8 call (`async (args) => args`, JSON in and out); each "
         "with its ratio to the echo:\n\n";
  out << "| measurement | daemon, built-in tool | + one hop | + V8 call | sum | toolhostd, "
         "sandboxed "
         "tool | target |\n|---|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& part : parts) {
    const auto base = n(std::string("echo.") + part.key);
    const auto daemon = n(std::string("native.") + part.key);
    const auto hop = n(std::string("hopprocess.") + part.key);
    const auto sandboxed = n(std::string("daemon.") + part.key);
    if (!base || *base <= 0 || !daemon || !hop || !v8call || !sandboxed) continue;
    const double added = std::max(0.0, *hop - *base);
    const double sum = *daemon + added + *v8call;
    auto cell = [&](double value) {
      char text[64];
      std::snprintf(text, sizeof text, " (%.2f×)", value / *base);
      return format(value, part.unit) + text;
    };
    char target[32];
    std::snprintf(target, sizeof target, "≤ %.1f×", part.target);
    out << "| " << part.what << " | " << cell(*daemon) << " | " << cell(added) << " | "
        << cell(*v8call) << " | " << cell(sum) << " | " << cell(*sandboxed) << " | " << target
        << " |\n";
  }
  // Throughput: the most the machine's cores allow at the parts' CPU per call, the client's
  // own CPU per call included (it runs on the same cores).
  const auto echoCalls = n("echo.tput.64.calls_per_s");
  const auto echoCpu = n("echo.tput.64.server_cpu_us_per_call");
  const auto daemonCpu = n("native.tput.64.server_cpu_us_per_call");
  const auto hopCpu = n("hopprocess.tput.64.server_cpu_us_per_call");
  const auto clientCpu = n("daemon.tput.64.client_cpu_us_per_call");
  const auto cores = n("meta.nproc");
  if (echoCalls && echoCpu && daemonCpu && hopCpu && clientCpu && cores && v8call &&
      *echoCalls > 0) {
    const double cpu = *daemonCpu + std::max(0.0, *hopCpu - *echoCpu) + *v8call + *clientCpu;
    const double most = *cores * 1e6 / cpu;
    char text[64];
    std::snprintf(text, sizeof text, " (%.2f×)", most / *echoCalls);
    out << "\nThroughput with 64 in flight, at most, with those parts' CPU per call and the "
           "client's on "
        << format(cores, "") << " cores: " << format(most, "calls/s") << text
        << " of the echo's; target ≥ 0.6×.\n";
  }
}

}  // namespace

int runReport(const ReportOptions& options) {
  const Figures f(options.figures);
  auto n = [&](const std::string& key) { return f.number(key); };

  const std::string most = f.text("meta.revisions");  // the last RSS checkpoint
  std::vector<Row> rows{
      {"Warm call, sequential, p50", n("daemon.seq.p50_us"), "echo round trip", n("echo.seq.p50_us"), "µs",
       Target::atMost, 1.3},
      {"Warm call, sequential, p99", n("daemon.seq.p99_us"), "echo round trip", n("echo.seq.p99_us"), "µs"},
      {"Throughput, 1 in flight", n("daemon.tput.1.calls_per_s"), "echo", n("echo.tput.1.calls_per_s"), "calls/s"},
      {"Throughput, 16 in flight", n("daemon.tput.16.calls_per_s"), "echo", n("echo.tput.16.calls_per_s"), "calls/s"},
      {"Throughput, 64 in flight", n("daemon.tput.64.calls_per_s"), "echo", n("echo.tput.64.calls_per_s"), "calls/s",
       Target::atLeast, 0.6},
      {"Latency under load, 64 in flight, p50", n("daemon.tput.64.p50_us"), "echo", n("echo.tput.64.p50_us"), "µs"},
      {"Server CPU per call, 64 in flight", n("daemon.tput.64.server_cpu_us_per_call"), "echo",
       n("echo.tput.64.server_cpu_us_per_call"), "µs", Target::atMost, 3.0},
      {"Server CPU per call, 1 in flight", n("daemon.tput.1.server_cpu_us_per_call"), "echo",
       n("echo.tput.1.server_cpu_us_per_call"), "µs"},
      {"Cold first call of a new revision, p50 (first 100)", n("daemon.cold.100.p50_us"),
       "in-process isolate create + call", n("v8.cold.p50_us"), "µs", Target::atMost, 1.0},
      {"Cold first call of a new revision, p50 (first 100)", n("daemon.cold.100.p50_us"),
       "in-process create + call, isolates kept alive (1 to 100 live)", n("v8.cold_kept.100.p50_us"), "µs"},
      {"Cold first call of a new revision, p50 (all " + most + ")", n("daemon.cold.all.p50_us"),
       "in-process isolate create + call", n("v8.cold.p50_us"), "µs"},
      {"Cold first call, p50 of calls 101–" + most + " (100 to " + most + " already retained)",
       n("daemon.cold." + most + ".p50_us"), "in-process isolate + context create, 100 to " + most + " live",
       n("v8.rss." + most + ".create_p50_us"), "µs"},
      {"RSS per retained sandbox, 100 retained", n("daemon.rss.100.kb_per_sandbox"),
       "bare isolate + context", n("v8.rss.100.kb_per_isolate"), "KiB", Target::atMost, 1.1},
      {"RSS per retained sandbox, " + most + " retained", n("daemon.rss." + most + ".kb_per_sandbox"),
       "bare isolate + context", n("v8.rss." + most + ".kb_per_isolate"), "KiB", Target::atMost, 1.1},
  };

  std::ostringstream out;
  out << "# toolhost benchmark: " << f.text("meta.date") << ", " << f.text("meta.commit") << "\n\n";
  out << "- Machine: " << f.text("meta.cpu") << ", " << f.text("meta.nproc") << " cores, V8 "
      << f.text("v8.version") << "\n";
  out << "- Load average (1, 5, 15 min) before the run: " << f.text("meta.load_before") << "; after: "
      << f.text("meta.load_after") << "; the machine's CPUs were " << f.text("meta.busy_pct")
      << "% busy during the run (this run's own load included), with " << f.text("meta.steal_pct")
      << "% stolen by the hypervisor\n";
  out << "- Daemon: " << f.text("meta.daemon_config") << "\n";
  out << "- Client: one connection; throughput phases of " << f.text("meta.duration_s")
      << " s each; sequential p50/p99 over " << format(n("daemon.seq.calls"), "calls");
  if (const std::string rounds = f.text("meta.rounds"); rounds != "n/a") {
    out << "; the warm-call figures (echo and toolhostd alike) are the medians of " << rounds
        << " rounds, each running the client against the echo server and then toolhostd";
  }
  out << "\n\n";
  out << "| measurement | toolhostd | floor | floor value | ratio | target | met |\n";
  out << "|---|---:|---|---:|---:|---:|---|\n";
  for (const auto& row : rows) {
    std::string ratio = "n/a", target = "", met = "";
    if (row.measured && row.floor && *row.floor > 0) {
      const double r = *row.measured / *row.floor;
      char text[32];
      std::snprintf(text, sizeof text, "%.2f×", r);
      ratio = text;
      if (row.target != Target::none) {
        std::snprintf(text, sizeof text, "%s %.1f×", row.target == Target::atMost ? "≤" : "≥", row.bound);
        target = text;
        const bool ok = row.target == Target::atMost ? r <= row.bound : r >= row.bound;
        met = ok ? "**yes**" : "**no**";
      }
    }
    out << "| " << row.what << " | " << format(row.measured, row.unit) << " | " << row.floorName << " | "
        << format(row.floor, row.unit) << " | " << ratio << " | " << target << " | " << met << " |\n";
  }
  // The warm-call targets beside what a hop costs by itself, and what the daemon costs without a
  // sandbox: which part of the gap is the hop every design with V8 worker threads pays, which
  // the daemon's own path, which the sandbox.
  struct Column {
    const char* name;
    std::string prefix;
  };
  const std::vector<Column> columns{{"echo", "echo."},
                                    {"echo through a thread", "hopthread."},
                                    {"echo through a process", "hopprocess."},
                                    {"toolhostd, built-in tool", "native."},
                                    {"toolhostd, sandboxed tool", "daemon."}};
  struct TargetRow {
    const char* what;
    const char* key;
    const char* unit;
    const char* target;
  };
  const std::vector<TargetRow> targetRows{
      {"Warm call, sequential, p50", "seq.p50_us", "µs", "≤ 1.3×"},
      {"Throughput, 64 in flight", "tput.64.calls_per_s", "calls/s", "≥ 0.6×"},
      {"Server CPU per call, 64 in flight", "tput.64.server_cpu_us_per_call", "µs", "≤ 3.0×"},
      {"Server CPU per call, 1 in flight", "tput.1.server_cpu_us_per_call", "µs", ""},
  };
  if (n("hopthread.seq.p50_us")) {
    out << "\nThe warm-call targets beside the cost of a hop (the echo server with every line sent "
           "through a thread, or a process, and back) and of the daemon without a sandbox (its "
           "built-in tool `echo`); each cell is the figure and its ratio to the echo:\n\n";
    out << "| measurement |";
    for (const auto& column : columns) out << " " << column.name << " |";
    out << " target |\n|---|";
    for (std::size_t i = 0; i < columns.size(); ++i) out << "---:|";
    out << "---:|\n";
    for (const auto& row : targetRows) {
      out << "| " << row.what << " |";
      const auto base = n(std::string("echo.") + row.key);
      for (const auto& column : columns) {
        const auto value = n(column.prefix + row.key);
        out << " " << format(value, row.unit);
        if (value && base && *base > 0 && column.prefix != "echo.") {
          char ratio[32];
          std::snprintf(ratio, sizeof ratio, " (%.2f×)", *value / *base);
          out << ratio;
        }
        out << " |";
      }
      out << " " << row.target << " |\n";
    }
    partsTable(out, f);
  }

  out << "\nOther figures of the same run:\n\n";
  out << "| figure | value |\n|---|---:|\n";
  const std::vector<std::pair<std::string, std::string>> others{
      {"In-process V8 warm call `(args) => args`, JSON in and out, p50", "v8.warm.p50_us"},
      {"In-process V8 warm call `async (args) => args` + microtasks, p50", "v8.warm_async.p50_us"},
      {"In-process isolate create + call + dispose, p50", "v8.cold_dispose.p50_us"},
      {"In-process compile + call in a pre-warmed isolate and context, p50", "v8.prewarmed.p50_us"},
      {"Echo, sequential, mean", "echo.seq.mean_us"},
      {"toolhostd, sequential, mean", "daemon.seq.mean_us"},
      {"Server CPU per call, sequential: echo", "echo.seq.server_cpu_us_per_call"},
      {"Server CPU per call, sequential: toolhostd", "daemon.seq.server_cpu_us_per_call"},
      {"Server CPU per call, 16 in flight: echo", "echo.tput.16.server_cpu_us_per_call"},
      {"Server CPU per call, 16 in flight: toolhostd", "daemon.tput.16.server_cpu_us_per_call"},
      {"Client CPU per call, 64 in flight, against echo", "echo.tput.64.client_cpu_us_per_call"},
      {"Client CPU per call, 64 in flight, against toolhostd", "daemon.tput.64.client_cpu_us_per_call"},
      {"toolhostd latency under load, 64 in flight, p99", "daemon.tput.64.p99_us"},
      {"Cold first call, p90 (all " + most + ")", "daemon.cold.all.p90_us"},
      {"In-process isolate create + call, p90", "v8.cold.p90_us"},
      {"In-process isolate + context create, p50, with 1 to 100 live", "v8.rss.100.create_p50_us"},
      {"toolhostd CPU per cold first call (first 100)", "daemon.cold.100.server_cpu_us_per_call"},
      {"toolhostd CPU per cold first call (calls 101–" + most + ")", "daemon.cold." + most + ".server_cpu_us_per_call"},
      {"tools.install, per revision (32 pipelined)", "daemon.install.us_per_revision"},
  };
  for (const auto& [what, key] : others) out << "| " << what << " | " << format(n(key), "µs") << " |\n";
  const std::vector<std::pair<std::string, std::string>> memory{
      {"toolhostd RSS before the cold calls", "daemon.rss.before_kb"},
      {"toolhostd RSS with " + most + " retained", "daemon.rss." + most + ".total_kb"},
      {"RssAnon per retained sandbox, " + most + " retained", "daemon.rss." + most + ".anon_kb_per_sandbox"},
      {"Pss per retained sandbox, " + most + " retained (differs from RSS once sandboxes live in "
       "several processes)", "daemon.rss." + most + ".pss_kb_per_sandbox"},
      {"Sandboxes still retained after the " + most + " calls", "daemon.retained"},
      {"Processes in the daemon's tree", "daemon.rss." + most + ".processes"},
  };
  for (const auto& [what, key] : memory) {
    out << "| " << what << " | " << format(n(key), key.ends_with("_kb") || key.ends_with("_sandbox") ? "KiB" : "") << " |\n";
  }

  const std::string table = out.str();
  std::fputs(table.c_str(), stdout);
  if (!options.markdown.empty()) {
    std::ofstream file(options.markdown);
    file << table;
  }
  return 0;
}

}  // namespace toolhost::bench
