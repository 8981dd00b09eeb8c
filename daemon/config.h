// The daemon's configuration: defaults, then the TOML file, then command-line flags. Built once
// on the main thread at start-up (and again on reload); read-only afterwards.
#pragma once

#include "daemon/roles.h"
#include "policy/destination.h"
#include "protocol/jsonrpc.h"
#include "registry/tool_storage.h"
#include "runtime/limits.h"

#include <boost/system/result.hpp>

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace toolhost::daemon {

enum class LogFormat { automatic, text, json };

// [fetch]: the mediated HTTPS requests of sandboxed tools and external-service tools.
// allowPrivate and extraCaFile shape the HTTPS client, built once at start (a change needs a
// restart); the limits apply to requests started after a reload.
struct FetchConfig {
  std::vector<policy::Cidr> allowPrivate;            // special-purpose ranges opened
  std::optional<std::filesystem::path> extraCaFile;  // PEM CAs trusted besides the system's
  std::chrono::milliseconds timeout{30000};          // DNS, connect, TLS, request, response
  std::size_t maxResponseBytes = std::size_t{16} << 20;
  std::size_t maxRequestBytes = std::size_t{8} << 20;
  // Every response body held at once, all fetches together (policy::FetchLimits).
  std::size_t maxBufferedBytes = std::size_t{256} << 20;
  // Of those, what one tool's fetches hold at once (by tool name, all its revisions together).
  std::size_t maxBufferedBytesPerTool = std::size_t{64} << 20;
};
// The largest max_response_bytes and max_request_bytes a config may set.
inline constexpr std::int64_t kMaxFetchResponseBytes = std::int64_t{128} << 20;
inline constexpr std::int64_t kMaxFetchRequestBytes = std::int64_t{32} << 20;

// [secrets]: where the vault's key is (read at start; a change needs a restart) and how large a
// value secrets.set accepts (applies at once after a reload).
struct SecretsConfig {
  // The key file; relative paths are read from the config file's directory. Unset: the systemd
  // credential $CREDENTIALS_DIRECTORY/toolhost.key when that variable is set, else
  // <stateDir>/secrets.key (see daemon/secrets_host.h).
  std::optional<std::filesystem::path> keyFile;
  std::size_t maxValueBytes = std::size_t{64} << 10;
};

struct Config {
  std::filesystem::path socketPath;
  std::optional<gid_t> socketGroup;  // socket mode 0660 with this group, else 0600
  std::filesystem::path stateDir;
  std::size_t mapSizeMb = 1024;
  unsigned ioThreads = 1;
  std::chrono::milliseconds shutdownGrace{10000};
  protocol::WireLimits limits;
  // Connections open at once ([limits] max_connections); admins may always connect.
  std::size_t maxConnections = 256;
  std::string logLevel = "info";
  LogFormat logFormat = LogFormat::automatic;
  AccessRules access;
  std::optional<std::filesystem::path> configFile;
  // [policy]: how long a prompt waits for an approver before the request is denied (a reload
  // applies it to prompts asked from then on), and how many audit entries are kept.
  std::chrono::milliseconds promptTimeout{120000};
  // [popup]: how long an open popup waits for its host's answer before it fails with
  // popup-timeout (a reload applies it to popups opened from then on).
  std::chrono::milliseconds popupTimeout{600000};
  std::size_t auditMaxEntries = 100000;
  // [runtime]: read at start; a change needs a restart.
  runtime::RuntimeConfig runtime;
  FetchConfig fetch;
  // [storage]: ctx.storage quotas per tool name (a reload applies them to operations run from
  // then on).
  registry::StorageQuotas storage;
  SecretsConfig secrets;
};

// Values given on the command line; they win over the file.
struct CommandLine {
  std::optional<std::filesystem::path> socketPath;
  std::optional<std::filesystem::path> stateDir;
  std::optional<std::filesystem::path> configFile;
  std::optional<std::string> logLevel;
  std::optional<std::string> logFormat;
  bool forgetSecrets = false;  // --forget-secrets: remove the stored secrets and exit
};

struct ConfigError {
  std::string detail;  // names the file, the key and what is wrong
};

// Socket path when neither flag, config nor TOOLHOST_SOCKET names one:
// $RUNTIME_DIRECTORY/toolhost.sock (systemd), /run/toolhost/toolhost.sock for root,
// $XDG_RUNTIME_DIR/toolhost/toolhost.sock, else /tmp/toolhost-<uid>/toolhost.sock.
std::filesystem::path defaultSocketPath();
// State directory when none is given: $STATE_DIRECTORY (systemd), /var/lib/toolhost for root,
// $XDG_STATE_HOME/toolhost, else ~/.local/state/toolhost.
std::filesystem::path defaultStateDir();

boost::system::result<Config, ConfigError> loadConfig(const CommandLine& commandLine);

// The configuration in force. A reload (SIGHUP) swaps it whole; any thread may take a snapshot,
// and a connection keeps the one it took when it was accepted.
class ConfigHolder {
 public:
  explicit ConfigHolder(Config initial)
      : current_(std::make_shared<const Config>(std::move(initial))) {}
  std::shared_ptr<const Config> current() const {
    std::lock_guard lock(mutex_);
    return current_;
  }
  void replace(std::shared_ptr<const Config> next) {
    std::lock_guard lock(mutex_);
    current_ = std::move(next);
  }

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<const Config> current_;
};

// What a reload changes, in words for the log ("limits.max_batch: 256 -> 16").
struct ConfigChanges {
  std::vector<std::string> applied;      // in force from now on
  std::vector<std::string> needRestart;  // ignored until the daemon restarts
};
// Compares the configuration in force with a newly loaded one. Settings only a restart can apply
// (socket, socket group, state directory, map size, I/O threads, log format, [policy]
// audit_max_entries, [fetch] allow_private and extra_ca_file, [secrets] key_file, all of
// [runtime]) are copied from `running` into `next`, so `next` describes what is really in force
// once it is swapped in.
ConfigChanges reconcileReload(const Config& running, Config& next);

// The longest path a Unix socket address can hold (sun_path minus its terminating NUL).
inline constexpr std::size_t kMaxSocketPathBytes = 107;

}  // namespace toolhost::daemon
