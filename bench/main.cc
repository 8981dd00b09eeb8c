// toolhost_bench: the subcommands bench/run.sh strings together (see bench/README.md).
#include "bench/bench.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <string>

int main(int argc, char** argv) {
  using namespace toolhost::bench;
  CLI::App app{"toolhost_bench: the pieces of the toolhost benchmark (bench/run.sh runs them all). "
               "Figures are printed as `key value` lines."};
  app.require_subcommand(1);

  EchoServerOptions echo;
  auto* echoCommand = app.add_subcommand("echo-server", "a bare Asio NDJSON JSON-RPC echo server (the transport floor)");
  echoCommand->add_option("socket", echo.socket, "Unix socket path to listen on")->required();
  echoCommand->add_option("--threads", echo.threads, "I/O threads (default 1, as the daemon's io_threads)");
  echoCommand
      ->add_option("--hop", echo.hop,
                   "none (default), or thread / process: every line goes through a mirror thread or "
                   "process and back before it is answered (the floor of a server that runs calls elsewhere)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, EchoServerOptions::Hop>{
          {"none", EchoServerOptions::Hop::none},
          {"thread", EchoServerOptions::Hop::thread},
          {"process", EchoServerOptions::Hop::process}}));

  ClientOptions client;
  std::string pid;
  auto* clientCommand = app.add_subcommand("client", "warm calls: sequential latency and pipelined throughput on one connection");
  clientCommand->add_option("socket", client.socket, "the server's socket")->required();
  clientCommand->add_option("--method", client.method, "JSON-RPC method (default tools.call)");
  clientCommand->add_option("--params", client.params, "params, JSON text sent as is");
  clientCommand->add_option("--warmup", client.warmup, "untimed sequential calls first (default 500)");
  clientCommand->add_option("--sequential", client.sequential, "timed sequential calls (0: none)");
  clientCommand->add_option("--inflight", client.inflight, "requests in flight, one throughput phase each (e.g. 1,16,64)")
      ->delimiter(',');
  clientCommand->add_option("--duration", client.durationSeconds, "seconds per throughput phase (default 3)");
  clientCommand->add_option("--server-pid", client.serverPid, "the server's pid: its process tree's CPU per call");
  clientCommand->add_option("--prefix", client.prefix, "prefix of every key printed");

  ColdOptions cold;
  auto* coldCommand = app.add_subcommand(
      "cold", "installs fresh revisions, times the first tools.call of each, samples the daemon's RSS");
  coldCommand->add_option("socket", cold.socket, "the daemon's socket")->required();
  coldCommand->add_option("--count", cold.count, "fresh revisions (default 1000)");
  coldCommand->add_option("--checkpoints", cold.checkpoints, "RSS samples after this many calls (e.g. 100,1000)")
      ->delimiter(',');
  coldCommand->add_option("--server-pid", cold.serverPid, "the daemon's pid")->required();
  coldCommand->add_option("--prefix", cold.prefix, "prefix of every key printed");

  V8FloorOptions floor;
  auto* floorCommand = app.add_subcommand("v8-floor", "in-process V8: warm call, isolate create + call, RSS per isolate");
  floorCommand->add_option("--warm", floor.warm, "timed warm calls (default 20000)");
  floorCommand->add_option("--cold", floor.cold, "timed isolate create + call cycles (default 100)");
  floorCommand->add_option("--kept", floor.kept,
                           "timed isolate create + call with every isolate kept alive, as retained sandboxes are "
                           "(run it in a process of its own: a disposed isolate's code range makes the next creation cheaper)");
  floorCommand->add_option("--isolates", floor.isolates, "RSS sampled after this many isolates (e.g. 100,1000)")
      ->delimiter(',');
  floorCommand->add_option("--v8-flags", floor.v8Flags,
                           "extra V8 flags, for experiments (e.g. --no-short-builtin-calls); the daemon does not set them");
  floorCommand->add_flag("--jit", floor.jit,
                         "V8 with its JIT, as the daemon runs with [runtime] jit = true (default: --jitless, "
                         "as the daemon by default)");
  floorCommand->add_option("--prefix", floor.prefix, "prefix of every key printed");

  ReportOptions report;
  auto* reportCommand = app.add_subcommand("report", "the table of figures, ratios and targets of one run");
  reportCommand->add_option("figures", report.figures, "the run's `key value` lines")->required();
  reportCommand->add_option("--markdown", report.markdown, "also write the table to this file");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*echoCommand) return runEchoServer(echo);
    if (*clientCommand) return runClient(client);
    if (*coldCommand) {
      std::sort(cold.checkpoints.begin(), cold.checkpoints.end());
      return runCold(cold);
    }
    if (*floorCommand) {
      std::sort(floor.isolates.begin(), floor.isolates.end());
      return runV8Floor(floor);
    }
    if (*reportCommand) return runReport(report);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "toolhost_bench: %s\n", e.what());
    return 1;
  }
  return 2;
}
