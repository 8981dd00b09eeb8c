// toolhostd: builds the daemon's parts in order (V8 platform, store, registry, policy, runtime,
// server), passes references down, runs the I/O threads, and shuts down cleanly on a signal.

#include "daemon/capability_host.h"
#include "daemon/config.h"
#include "daemon/disk_thread.h"
#include "daemon/dispatcher.h"
#include "daemon/external_tools.h"
#include "daemon/log_budget.h"
#include "daemon/logging.h"
#include "daemon/meta_methods.h"
#include "daemon/method_table.h"
#include "daemon/policy_methods.h"
#include "daemon/popups.h"
#include "daemon/sandbox_methods.h"
#include "daemon/secret_methods.h"
#include "daemon/secrets_host.h"
#include "daemon/server.h"
#include "daemon/storage_host.h"
#include "daemon/storage_methods.h"
#include "daemon/systemd.h"
#include "daemon/task_methods.h"
#include "daemon/tool_methods.h"
#include "policy/approvals.h"
#include "policy/audit.h"
#include "policy/decisions.h"
#include "policy/http_client.h"
#include "policy/secrets_vault.h"
#include "protocol/path_trust.h"
#include "registry/native_tools.h"
#include "registry/registry.h"
#include "registry/tasks.h"
#include "registry/tool_storage.h"
#include "runtime/process_sandbox_pool.h"
#include "runtime/sandbox_host.h"
#include "runtime/v8_platform.h"
#include "runtime/worker_threads.h"
#include "store/page_check.h"
#include "store/store.h"

#include <fmt/format.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <CLI/CLI.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <thread>
#include <vector>

#ifndef TOOLHOST_VERSION
#define TOOLHOST_VERSION "0.0.0"
#endif
#ifdef TOOLHOST_MIMALLOC
#include <mimalloc.h>
#endif

namespace asio = boost::asio;
using namespace toolhost;

namespace {

// A request may nest [limits] max_depth levels (at most 1000), and parts of the daemon walk it
// recursively (the JSON writer, schema validation, canonical JSON): on the I/O threads, the disk
// thread and others. Each thread gets a stack of at least this, whatever `ulimit -s` says (a
// thread's stack defaults to the soft limit: 1 MiB of it was a crash for one deep request).
constexpr std::size_t kThreadStackBytes = std::size_t{8} << 20;

// Before any thread starts: the default for every thread created from then on.
void setThreadStacks() {
  pthread_attr_t attributes;
  if (pthread_getattr_default_np(&attributes) != 0) return;
  std::size_t size = 0;
  if (pthread_attr_getstacksize(&attributes, &size) != 0 || size < kThreadStackBytes) {
    if (pthread_attr_setstacksize(&attributes, kThreadStackBytes) != 0 ||
        pthread_setattr_default_np(&attributes) != 0) {
      std::fprintf(stderr, "toolhostd: warning: could not set the threads' stack size\n");
    }
  }
  pthread_attr_destroy(&attributes);
}

// Which malloc serves this process (and its sandbox hosts, the same executable): mimalloc when
// toolhostd was built with it and it won the symbol lookup ahead of libc, else libc's.
std::string mallocName() {
#ifdef TOOLHOST_MIMALLOC
  void* probe = std::calloc(1, 64);  // calloc: nothing uninitialized is handed on
  const bool mimalloc = mi_is_in_heap_region(probe);
  std::free(probe);
  if (mimalloc) {
    const int version = mi_version();  // e.g. 209 for 2.0.9
    return fmt::format("mimalloc {}.{}.{}", version / 100, version / 10 % 10, version % 10);
  }
#endif
  return "libc";
}

int run(const daemon::Config& config, const daemon::CommandLine& commandLine) {
  // systemd: the socket it passed and the watchdog period leave the environment before any
  // thread starts (daemon/systemd.h).
  auto systemd = daemon::SystemdService::fromEnvironment();
  if (!systemd) {
    spdlog::critical("{}", systemd.error().detail);
    return 1;
  }
  // The configuration in force: SIGHUP swaps it; connections take a snapshot when accepted.
  daemon::ConfigHolder configs(config);

  // Forgetting secrets is for a database that exists: a mistyped directory must not become a
  // new, empty state.
  if (commandLine.forgetSecrets && !std::filesystem::exists(config.stateDir / "db" / "data.mdb")) {
    spdlog::critical("no state database in {}: nothing to forget (check --state-dir or --config)",
                     config.stateDir.string());
    return 1;
  }

  // A second daemon on a live socket stops before it makes a state directory it would never use
  // (a mistyped --state-dir would be left behind). Listening checks again.
  if (!systemd->socketActivated() && !commandLine.forgetSecrets) {
    if (auto checked = daemon::Server::checkSocketDirectory(config); !checked) {
      spdlog::critical("{}", checked.error().detail);
      return 1;
    }
  }
  if (!systemd->socketActivated() && !commandLine.forgetSecrets &&
      daemon::Server::somebodyListensAt(config.socketPath)) {
    spdlog::critical("another daemon is already listening on {}", config.socketPath.string());
    return 1;
  }
  // So does one whose socket path holds something else (listening would refuse to replace it).
  if (struct stat existing{}; !systemd->socketActivated() && !commandLine.forgetSecrets &&
                              ::lstat(config.socketPath.c_str(), &existing) == 0 &&
                              !S_ISSOCK(existing.st_mode)) {
    spdlog::critical(
        "{} exists and is not a socket; refusing to replace it (move it, or set "
        "another [server] socket)",
        config.socketPath.string());
    return 1;
  }

  // A state directory another user controls would let them plant the database and the secrets
  // key, or read them. Directories made here are private; one that exists keeps its mode (it may
  // be shared, such as /var/lib): what the daemon keeps in it is private anyway (db/ is 0700,
  // its files 0600; the store refuses a db/ or file in it that another user made or may write).
  if (auto made = protocol::makeTrustedDirectories(config.stateDir, 0700); !made) {
    spdlog::critical("refusing the state directory {}: {}", config.stateDir.string(), made.error());
    return 1;
  }

  // No V8 in this process: JavaScript runs in the sandbox host processes (runtime/sandbox_host.h).
  // Those inherit what this process may do with memory: V8's JIT must be able to make the pages
  // it wrote code into executable, which MemoryDenyWriteExecute= (on in toolhost.service)
  // forbids. Without this check every call would crash its sandbox host instead.
  if (config.runtime.jit && !daemon::canMakeWritablePagesExecutable()) {
    spdlog::critical(
        "[runtime] jit = true, but this process may not make written pages executable (under "
        "systemd: MemoryDenyWriteExecute=yes); set jit = false, or add a drop-in with "
        "MemoryDenyWriteExecute=no to run V8 with its JIT");
    return 1;
  }

  store::Options storeOptions;
  storeOptions.stateDir = config.stateDir;
  storeOptions.mapSizeMb = config.mapSizeMb;
  for (auto& table : registry::Registry::tables()) storeOptions.tables.push_back(table);
  for (auto& table : registry::TaskStore::tables()) storeOptions.tables.push_back(table);
  for (auto& table : registry::ToolStorage::tables()) storeOptions.tables.push_back(table);
  for (auto& table : policy::DecisionStore::tables()) storeOptions.tables.push_back(table);
  for (auto& table : policy::SecretsVault::tables()) storeOptions.tables.push_back(table);
  // Every page is read first by a child (toolhostd --check-store, see main()), which a damaged
  // page may kill instead of this process.
  storeOptions.checkPages = [](const std::filesystem::path& db) {
    return store::checkInChild(store::PageCheckLaunch{"/proc/self/exe", {"--check-store"}}, db);
  };
  // A full or failing disk fails every write; the lines about it share one budget.
  storeOptions.allowFailureLine = [budget = std::make_shared<daemon::LogBudget>(2, 20)](
                                      std::string& note) { return budget->allow(note); };
  auto opened = store::Store::open(storeOptions);
  if (!opened) {
    spdlog::critical("{}", opened.error().message);
    return 1;
  }
  store::Store& store = **opened;

  if (commandLine.forgetSecrets) {
    auto removed = policy::SecretsVault::forgetAll(store);
    if (!removed) {
      spdlog::critical("cannot remove the stored secrets: {}", removed.error().message);
      return 1;
    }
    std::printf(
        "toolhostd: removed %llu stored secrets and the record of their key from %s; tools, "
        "decisions and storage are kept. The next start uses the key it finds (or makes one); "
        "set the secrets again with toolhostctl secrets set.\n",
        static_cast<unsigned long long>(*removed), config.stateDir.c_str());
    return 0;
  }

  // The secrets vault's key, checked before anything else writes: a missing or wrong key stops
  // the daemon here and changes nothing.
  auto vault = policy::SecretsVault::open(store, daemon::chooseSecretsKey(config));
  if (!vault) {
    spdlog::critical("{}", vault.error().message);
    return 1;
  }

  registry::Registry registry(store);
  for (auto& native : registry::builtinNativeTools()) {
    std::string name(native.manifest.at("name").as_string());
    if (auto registered = registry.registerNative(std::move(native)); !registered) {
      spdlog::critical("cannot register the built-in tool {}: {}", name, registered.error().detail);
      return 1;
    }
  }
  registry::TaskLimits taskLimits;
  taskLimits.maxStoredBytes = std::uint64_t{config.mapSizeMb} * 1024 * 1024 / 2;
  registry::TaskStore taskStore(store, registry, taskLimits);
  // ctx.storage: values per tool name, written on the storage host's own thread (below).
  registry::ToolStorage toolStorage(store);

  policy::DecisionStore decisions(store);
  policy::AuditLog audit(store, config.auditMaxEntries);
  policy::ApprovalBroker approvals(decisions, audit);

  daemon::DaemonFacts facts;
  facts.version = TOOLHOST_VERSION;
  facts.malloc = mallocName();
  facts.config = &configs;
  facts.healthChecks.push_back(daemon::HealthCheck{"store", [&store] {
    auto stats = store.stats();
    if (!stats) return boost::json::object{{"ok", false}, {"detail", store.describe(stats.error())}};
    if (stats->writesFull) {
      return boost::json::object{
          {"ok", false},
          {"detail",
           "the last write failed: the state database is full (its map, [store] map_size_mb, "
           "or the disk); reads still work"},
          {"usedBytes", stats->usedBytes},
          {"mapSizeBytes", stats->mapSizeBytes},
          {"schemaVersion", stats->schemaVersion}};
    }
    if (stats->writesFailing) {
      return boost::json::object{
          {"ok", false},
          {"detail",
           "the last write failed: " + store.describe(stats->writesFailing) + "; reads still work"},
          {"usedBytes", stats->usedBytes},
          {"mapSizeBytes", stats->mapSizeBytes},
          {"schemaVersion", stats->schemaVersion}};
    }
    return boost::json::object{{"ok", true},
                               {"usedBytes", stats->usedBytes},
                               {"mapSizeBytes", stats->mapSizeBytes},
                               {"schemaVersion", stats->schemaVersion}};
  }});

  // The mediated HTTPS client of fetch and external-service tools: [fetch] allow_private and
  // extra_ca_file are read once, here (a change needs a restart). Popup hosts come and go with
  // their connections. Both outlive the io_context: operations still queued there use them.
  std::unique_ptr<policy::HttpClient> http;
  try {
    http = std::make_unique<policy::HttpClient>(policy::AddressRules(config.fetch.allowPrivate),
                                                config.fetch.extraCaFile);
  } catch (const std::exception& error) {
    spdlog::critical("cannot set up the HTTPS client for fetch: {}", error.what());
    return 1;
  }
  daemon::PopupHosts popups;
  daemon::SecretsHost secrets(**vault, audit, registry);
  daemon::MediationServices mediation{decisions, approvals, audit, *http, configs, &secrets};

  asio::io_context io(static_cast<int>(config.ioThreads));
  // The methods' LMDB writes wait for the disk here, not on an I/O thread (daemon/disk_thread.h).
  // Stopped below once the I/O threads are done, before anything it serves is destroyed.
  daemon::DiskThread disk;
  // Reads that walk a whole task lineage (each task re-hashed) take seconds for long ones: off
  // the I/O threads, and off the disk thread too, where writes would queue behind them.
  daemon::DiskThread lineageReads;
  // Checks of large arguments against a tool's parameters take up to a second or so: off the
  // I/O threads, where every connection would wait for them.
  daemon::DiskThread argumentChecks;
  // A lineage definition's first call reads it and compiles its parameters: off the I/O threads,
  // and off the argument checks, which other calls would wait behind.
  daemon::DiskThread definitionBuilds;
  // Request lines of hundreds of KiB and more are parsed here, not on the I/O threads: one
  // client's megabytes of JSON would hold up every connection for as long as they take.
  daemon::DiskThread requestParses;
  // store.verify's page walk and store.backup's copy: as long as the database is large.
  daemon::DiskThread maintenance;

  // Sandboxed JavaScript: V8 workers, retained sandboxes, the watchdog. The pool is destroyed
  // first (its calls end and abort their operations), then the capability host, then the
  // io_context its operations and callers run on.
  daemon::StorageHost storageHost(toolStorage, configs);
  daemon::SubtaskLedger subtasks;  // what each call's ctx.createSubtasksResult compiled
  daemon::DaemonCapabilityHost capabilityHost(
      daemon::CapabilityServices{registry, taskStore, mediation, popups, &storageHost, &subtasks},
      io.get_executor());
  // Sandboxed JavaScript runs in [runtime] processes sandbox host processes: this executable
  // again, with --sandbox-host (see main()), supervised and restarted by the pool.
  runtime::ProcessSandboxPool sandboxes(config.runtime, capabilityHost,
                                        runtime::SandboxLaunch{"/proc/self/exe", {"--sandbox-host"}},
                                        io.get_executor());
  daemon::ExternalTools externalTools(mediation);
  registry.onBindingMoved([&sandboxes](const std::string& name, const std::string& from, const std::string& to) {
    spdlog::debug("{} moved from {} to {}; its sandbox is discarded", name, from, to);
    sandboxes.discard(from);
  });

  // The sandbox processes: degraded while one fails calls fast (it ended max_restarts + 1 times
  // within restart_window_ms) or could not be started.
  facts.healthChecks.push_back(daemon::HealthCheck{
      "runtime", [&sandboxes] {
        bool ok = true;
        boost::json::array processes;
        for (const auto& slot : sandboxes.health()) {
          boost::json::object entry{{"pid", slot.pid}, {"recentUnexpectedEnds", slot.recentEnds}};
          if (slot.agentCode) entry["agentCode"] = true;
          if (slot.landlockAbi) entry["landlockAbi"] = *slot.landlockAbi;
          // Agents' code failing (its own process) fails no installed tool.
          if (slot.failingForMs > 0) {
            ok = ok && slot.agentCode;
            entry["failingForMs"] = slot.failingForMs;
          }
          if (!slot.startError.empty()) {
            ok = false;
            entry["startFailed"] = true;  // why is in the log: any role may read this check
          }
          processes.push_back(std::move(entry));
        }
        boost::json::object out{{"ok", ok}, {"processes", std::move(processes)}};
        if (!ok) {
          out["detail"] =
              "a sandbox process ended unexpectedly too often or could not be started: calls of "
              "the tools it hosts fail (see the daemon's log)";
        }
        return out;
      }});

  daemon::MethodTable methods;
  daemon::registerMetaMethods(methods, facts);
  daemon::registerToolMethods(
      methods,
      daemon::ToolServices{registry, disk, &sandboxes, &externalTools, &secrets, &taskStore,
                           &argumentChecks, &store, &subtasks, &definitionBuilds, &maintenance});
  daemon::registerPopupMethods(methods, popups);
  daemon::registerSandboxMethods(methods, sandboxes);
  daemon::registerTaskMethods(methods, taskStore, disk, lineageReads, &sandboxes);
  daemon::registerStorageMethods(methods, toolStorage, registry, disk);
  daemon::registerPolicyMethods(
      methods, daemon::PolicyServices{registry, decisions, approvals, audit, disk, configs});
  daemon::registerSecretMethods(methods, daemon::SecretServices{registry, **vault, audit, disk, configs});
  daemon::Dispatcher dispatcher(methods);

  daemon::Server server(io, configs, dispatcher);
  server.decodeLargeOn(&requestParses);
  facts.connectionCount = [&server] { return server.connectionCount(); };
  facts.healthChecks.push_back(daemon::HealthCheck{
      "socket", [&server] {
        boost::json::object result{{"ok", true}, {"path", server.socketPath().string()}};
        if (auto problem = server.socketProblem()) {
          result["ok"] = false;
          result["detail"] = *problem;
        }
        return result;
      }});
  // SIGTERM/SIGINT stop gracefully, SIGHUP reloads; READY=1, STATUS= and WATCHDOG=1 to systemd.
  // Its signal handlers are in place before the socket listens: a client that sees the socket
  // may signal the daemon at once, and SIGTERM's default action would kill it.
  daemon::ServiceLifecycle lifecycle(io, server, configs, *systemd, commandLine);
  if (auto listening = systemd->listen(server, configs); !listening) {
    spdlog::critical("{}", listening.error().detail);
    return 1;
  }
  externalTools.addOwnSocket(server.socketPath());
  server.onSocketsChanged([&externalTools](daemon::Server::FileIds files) {
    externalTools.setOwnSockets(std::move(files));
  });

  lifecycle.start();
  server.start();
  spdlog::info("toolhostd {} listening on {} (state in {}, V8 {}, malloc {})", facts.version,
               server.socketPath().string(), config.stateDir.string(), runtime::v8Version(),
               facts.malloc);

  // This thread is the first I/O thread (main() started it with a full stack).
  std::vector<std::thread> threads;
  try {
    for (unsigned i = 1; i < config.ioThreads; ++i) threads.emplace_back([&io] { io.run(); });
  } catch (const std::system_error&) {
    io.stop();
    for (auto& thread : threads) thread.join();
    throw;
  }
  io.run();
  for (auto& thread : threads) thread.join();
  // After a forced stop, jobs may still be queued: they run now, while what they use is alive.
  // Parses of large requests nobody will be answered for are skipped.
  daemon::Session::abandonAllDecodes();
  disk.stop();
  lineageReads.stop();
  argumentChecks.stop();
  definitionBuilds.stop();
  requestParses.stop();
  maintenance.stop();
  return 0;
}

int runReporting(const daemon::Config& config, const daemon::CommandLine& commandLine) {
  try {
    return run(config, commandLine);
  } catch (const std::system_error& error) {
    spdlog::critical("fatal: {}{}", error.what(), runtime::threadLimitHint(error.code()));
    return 1;
  } catch (const std::exception& error) {
    spdlog::critical("fatal: {}", error.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  setThreadStacks();
  // A sandbox host process started by the runtime (runtime/sandbox_host.h): nothing of the
  // daemon runs in it; its socket to the daemon is fd 3.
  if (argc > 1 && std::string_view(argv[1]) == "--sandbox-host") {
    return runtime::runSandboxHost(3, argc, argv);
  }
  // The check of every page of the state database (store/page_check.h), run by the daemon.
  if (argc > 1 && std::string_view(argv[1]) == "--check-store") {
    return store::runPageCheck(argc, argv);
  }
  // SIGHUP asks a running daemon to reload; until the daemon's own handler is in place (once the
  // store is open and the server listens), one would end the process. Ignored until then; the
  // handler replaces this (sandbox hosts start with every signal at its default).
  std::signal(SIGHUP, SIG_IGN);
  CLI::App app{"toolhostd: hosts the tools AI agents call, over JSON-RPC 2.0 on a Unix socket"};
  daemon::CommandLine commandLine;
  std::string socket, stateDir, configFile, logLevel, logFormat;
  app.add_option("--socket", socket, "Unix socket path (else $TOOLHOST_SOCKET, the config, or the default)");
  app.add_option("--state-dir", stateDir, "state directory (LMDB and keys)");
  app.add_option("--config", configFile, "TOML configuration file")->check(CLI::ExistingFile);
  app.add_option("--log-level", logLevel, "trace, debug, info, warn, error, critical or off");
  app.add_option("--log-format", logFormat, "auto (text on a terminal, else JSON lines), text or json");
  app.add_flag("--forget-secrets", commandLine.forgetSecrets,
               "remove every stored secret and the record of their key, then exit (after the "
               "secrets key was lost: nothing can read them; the daemon must not be running)");
  app.set_version_flag("--version", std::string("toolhostd ") + TOOLHOST_VERSION);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;
  }
  // Given but empty (a script's unset variable) is refused, never taken as the default path.
  if (app.count("--socket") > 0) commandLine.socketPath = socket;
  if (app.count("--state-dir") > 0) commandLine.stateDir = stateDir;
  if (!configFile.empty()) commandLine.configFile = configFile;
  if (!logLevel.empty()) commandLine.logLevel = logLevel;
  if (!logFormat.empty()) commandLine.logFormat = logFormat;

  auto config = daemon::loadConfig(commandLine);
  if (!config) {
    std::fprintf(stderr, "toolhostd: %s\n", config.error().detail.c_str());
    return 2;
  }
  daemon::setupLogging(config->logLevel, config->logFormat);
  std::signal(SIGPIPE, SIG_IGN);
  // A write past the file size limit (ulimit -f) fails with EFBIG, a full disk to the store,
  // instead of ending the process.
  std::signal(SIGXFSZ, SIG_IGN);
  // The daemon runs on a thread of its own, with the stack setThreadStacks gave every thread:
  // this one has what `ulimit -s` left it, and starting up compiles the methods' schemas.
  int code = 1;
  try {
    std::thread daemon([&] { code = runReporting(*config, commandLine); });
    daemon.join();
  } catch (const std::system_error& error) {
    spdlog::critical("fatal: cannot start the daemon's thread: {}", error.what());
  }
  return code;
}
