#include "daemon/config.h"

#include "protocol/socket_path.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <sstream>
#include <type_traits>
#include <variant>

namespace toolhost::daemon {
namespace fs = std::filesystem;

namespace {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::optional<uid_t> lookupUser(const std::string& name) {
  std::array<char, 16384> buffer{};
  passwd entry{};
  passwd* found = nullptr;
  if (getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found) != 0 || !found) {
    return std::nullopt;
  }
  return found->pw_uid;
}

std::optional<gid_t> lookupGroup(const std::string& name) {
  std::array<char, 16384> buffer{};
  group entry{};
  group* found = nullptr;
  if (getgrnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found) != 0 || !found) {
    return std::nullopt;
  }
  return found->gr_gid;
}

std::string where(const toml::node& node, const std::string& key) {
  std::ostringstream out;
  out << key << " (line " << node.source().begin.line << ")";
  return out.str();
}

using Result = boost::system::result<Config, ConfigError>;

ConfigError fail(const std::string& file, std::string detail) {
  return ConfigError{file + ": " + std::move(detail)};
}

// Reads a positive integer within [low, high] if present.
template <typename T>
std::optional<ConfigError> readCount(const toml::table& table, const std::string& file,
                                     const char* section, const char* key, T& out,
                                     std::int64_t low, std::int64_t high) {
  const toml::node* node = table[section][key].node();
  if (node == nullptr) return std::nullopt;
  // value<>() would also take a float with no fraction (1.0, 2e0): TOML keeps them apart.
  auto value = node->is_integer() ? node->value<std::int64_t>() : std::nullopt;
  std::string name = std::string(section) + "." + key;
  if (!value || *value < low || *value > high) {
    return fail(file, where(*node, name) + " must be an integer from " + std::to_string(low) +
                          " to " + std::to_string(high));
  }
  out = static_cast<T>(*value);
  return std::nullopt;
}

// A section (when present) must be a table holding only `keys`: anything else is a typo, which
// would otherwise leave the setting at its default without a word.
std::optional<ConfigError> checkSection(const toml::table& table, const std::string& file,
                                        const char* section,
                                        std::initializer_list<std::string_view> keys) {
  const toml::node* node = table.get(section);
  if (node == nullptr) return std::nullopt;
  const toml::table* fields = node->as_table();
  if (fields == nullptr) {
    return fail(file, where(*node, section) + " must be a table ([" + section + "])");
  }
  for (const auto& [key, value] : *fields) {
    if (std::find(keys.begin(), keys.end(), key.str()) != keys.end()) continue;
    std::string known;
    for (auto name : keys) known += (known.empty() ? "" : ", ") + std::string(name);
    return fail(file, where(value, std::string(section) + "." + std::string(key.str())) +
                          " is not a known key" +
                          (known.empty() ? " (the section has none yet)" : "; use " + known));
  }
  return std::nullopt;
}

// A string setting: absent, or a string (a number or a table there is an error, not a default).
std::optional<ConfigError> readString(const toml::table& table, const std::string& file,
                                      const char* section, const char* key,
                                      std::optional<std::string>& out) {
  const toml::node* node = table[section][key].node();
  if (node == nullptr) return std::nullopt;
  auto value = node->value_exact<std::string>();
  if (!value) {
    return fail(file, where(*node, std::string(section) + "." + key) + " must be a string");
  }
  out = std::move(*value);
  return std::nullopt;
}

// The per-call limits of [runtime], each a default_* and a max_* key (suffix, CallLimits member).
constexpr std::pair<const char*, std::optional<std::int64_t> runtime::CallLimits::*> kLimitKeys[] =
    {{"wall_ms", &runtime::CallLimits::wallMs},
     {"cpu_ms", &runtime::CallLimits::cpuMs},
     {"heap_mb", &runtime::CallLimits::heapMb},
     {"array_buffer_mb", &runtime::CallLimits::arrayBufferMb},
     {"stack_kb", &runtime::CallLimits::stackKb},
     {"output_bytes", &runtime::CallLimits::outputBytes}};

// [runtime]: V8 workers, the retained-sandbox pool, and the limits of sandboxed calls (defaults
// for manifests that say nothing, and caps no manifest or call may exceed).
std::optional<ConfigError> readRuntime(const toml::table& table, const std::string& file,
                                       runtime::RuntimeConfig& runtime) {
  // A result travels in one answer, and no answer may exceed 64 MiB (daemon/session.cc): 63 MiB
  // leaves room for the answer's other members and JSON escapes of ordinary text.
  constexpr std::int64_t kMaxOutputBytes = std::int64_t{63} << 20;
  auto limit = [&](const char* key, std::optional<std::int64_t>& out, std::int64_t high) {
    std::int64_t value = out.value_or(0);
    auto error = readCount(table, file, "runtime", key, value, 1, high);
    if (!error && table["runtime"][key]) out = value;
    return error;
  };
  for (auto error : {
           readCount(table, file, "runtime", "workers", runtime.workers, 1, 256),
           readCount(table, file, "runtime", "max_retained", runtime.maxRetained, 1, 100000),
           readCount(table, file, "runtime", "memory_budget_mb", runtime.memoryBudgetMb, 1,
                     1 << 20),
           readCount(table, file, "runtime", "max_queued_per_sandbox", runtime.maxQueuedPerSandbox,
                     1, 1000000),
           readCount(table, file, "runtime", "processes", runtime.processes, 1, 64),
           readCount(table, file, "runtime", "prewarmed", runtime.prewarmed, 0, 64),
           readCount(table, file, "runtime", "kill_grace_ms", runtime.killGraceMs, 100, 600000),
           readCount(table, file, "runtime", "max_restarts", runtime.maxRestarts, 1, 1000),
           readCount(table, file, "runtime", "restart_window_ms", runtime.restartWindowMs, 1000,
                     86400000),
           limit("default_wall_ms", runtime.defaults.wallMs, 86400000),
           limit("default_cpu_ms", runtime.defaults.cpuMs, 86400000),
           limit("default_heap_mb", runtime.defaults.heapMb, 65536),
           limit("default_array_buffer_mb", runtime.defaults.arrayBufferMb, 65536),
           limit("default_stack_kb", runtime.defaults.stackKb, 65536),
           limit("default_output_bytes", runtime.defaults.outputBytes, kMaxOutputBytes),
           limit("max_wall_ms", runtime.caps.wallMs, 86400000),
           limit("max_cpu_ms", runtime.caps.cpuMs, 86400000),
           limit("max_heap_mb", runtime.caps.heapMb, 65536),
           limit("max_array_buffer_mb", runtime.caps.arrayBufferMb, 65536),
           limit("max_stack_kb", runtime.caps.stackKb, 65536),
           limit("max_output_bytes", runtime.caps.outputBytes, kMaxOutputBytes),
       }) {
    if (error) return error;
  }
  // A default set above its cap would never apply: every call would get the cap instead.
  for (const auto& [suffix, member] : kLimitKeys) {
    const std::string defaultKey = std::string("default_") + suffix;
    const auto& value = runtime.defaults.*member;
    const auto& cap = runtime.caps.*member;
    if (table["runtime"][defaultKey] && value && cap && *value > *cap) {
      return fail(file, "runtime." + defaultKey + " (" + std::to_string(*value) +
                            ") is above runtime.max_" + suffix + " (" + std::to_string(*cap) +
                            "), so it would never apply: lower it or raise the cap");
    }
  }
  if (const toml::node* jit = table["runtime"]["jit"].node()) {
    auto value = jit->value_exact<bool>();
    if (!value) {
      return fail(file, where(*jit, "runtime.jit") + " must be true or false");
    }
    runtime.jit = *value;
  }
  // The worker threads' stacks must hold the deepest JavaScript stack a call may get.
  auto neededMb = static_cast<std::size_t>((*runtime.caps.stackKb + 1023) / 1024 + 2);
  if (runtime.workerStackMb < neededMb) runtime.workerStackMb = neededMb;
  return std::nullopt;
}

// [storage]: the quotas of ctx.storage, per tool name.
std::optional<ConfigError> readStorage(const toml::table& table, const std::string& file,
                                       registry::StorageQuotas& storage) {
  const toml::node* section = table.get("storage");
  if (section == nullptr) return std::nullopt;
  const toml::table* fields = section->as_table();
  if (fields == nullptr) {
    return fail(file, where(*section, "storage") + " must be a table ([storage])");
  }
  for (const auto& [key, value] : *fields) {
    if (key.str() != "max_keys" && key.str() != "max_key_bytes" &&
        key.str() != "max_value_bytes" && key.str() != "max_total_bytes") {
      return fail(file, where(value, "storage." + std::string(key.str())) +
                            " is not a known key; use max_keys, max_key_bytes, max_value_bytes "
                            "or max_total_bytes");
    }
  }
  for (auto error : {
           readCount(table, file, "storage", "max_keys", storage.maxKeys, 1, 100000),
           readCount(table, file, "storage", "max_key_bytes", storage.maxKeyBytes, 1,
                     static_cast<std::int64_t>(registry::kMaxStorageKeyBytes)),
           readCount(table, file, "storage", "max_value_bytes", storage.maxValueBytes, 1,
                     std::int64_t{16} << 20),
           readCount(table, file, "storage", "max_total_bytes", storage.maxTotalBytes, 1,
                     std::int64_t{1} << 40),
       }) {
    if (error) return error;
  }
  return std::nullopt;
}

// [fetch]: opened private ranges, an extra CA file (relative paths are read from the config
// file's directory) and the limits of one mediated request.
std::optional<ConfigError> readFetch(const toml::table& table, const std::string& file,
                                     FetchConfig& fetch) {
  const toml::node* section = table.get("fetch");
  if (section == nullptr) return std::nullopt;
  const toml::table* fields = section->as_table();
  if (fields == nullptr) return fail(file, where(*section, "fetch") + " must be a table ([fetch])");
  for (const auto& [key, value] : *fields) {
    static constexpr std::array<std::string_view, 7> kKeys{"allow_private",
                                                           "extra_ca_file",
                                                           "timeout_ms",
                                                           "max_response_bytes",
                                                           "max_request_bytes",
                                                           "max_buffered_bytes",
                                                           "max_buffered_bytes_per_tool"};
    if (std::find(kKeys.begin(), kKeys.end(), key.str()) == kKeys.end()) {
      return fail(file, where(value, "fetch." + std::string(key.str())) +
                            " is not a known key; use allow_private, extra_ca_file, timeout_ms, "
                            "max_response_bytes, max_request_bytes, max_buffered_bytes or "
                            "max_buffered_bytes_per_tool");
    }
  }
  if (const toml::node* node = fields->get("allow_private")) {
    const toml::array* ranges = node->as_array();
    if (ranges == nullptr) {
      return fail(file, where(*node, "fetch.allow_private") +
                            " must be a list of address ranges, such as [\"10.1.2.0/24\"]");
    }
    std::size_t index = 0;
    for (const toml::node& item : *ranges) {
      const std::string name = "fetch.allow_private[" + std::to_string(index++) + "]";
      auto text = item.value<std::string>();
      if (!text) return fail(file, where(item, name) + " must be a string such as \"10.1.2.0/24\"");
      auto cidr = policy::parseCidr(*text);
      if (!cidr) return fail(file, where(item, name) + ": " + cidr.error().message);
      fetch.allowPrivate.push_back(*cidr);
    }
  }
  if (const toml::node* node = fields->get("extra_ca_file")) {
    auto path = node->value<std::string>();
    if (!path || path->empty()) {
      return fail(file, where(*node, "fetch.extra_ca_file") + " must be the path of a PEM file");
    }
    fs::path caFile = *path;
    if (caFile.is_relative()) caFile = fs::absolute(fs::path(file)).parent_path() / caFile;
    std::error_code ec;
    if (!fs::is_regular_file(caFile, ec)) {
      return fail(file, where(*node, "fetch.extra_ca_file") + ": " + caFile.string() +
                            " is not a readable file of PEM certificates");
    }
    fetch.extraCaFile = caFile;
  }
  std::int64_t timeoutMs = fetch.timeout.count();
  for (auto error : {
           readCount(table, file, "fetch", "timeout_ms", timeoutMs, 1, 3600000),
           // A body crosses to the sandbox host base64-encoded in one message, and a request
           // body within the call's 64 MiB of outstanding requests: larger ones could never
           // arrive.
           readCount(table, file, "fetch", "max_response_bytes", fetch.maxResponseBytes, 1,
                     kMaxFetchResponseBytes),
           readCount(table, file, "fetch", "max_request_bytes", fetch.maxRequestBytes, 0,
                     kMaxFetchRequestBytes),
           readCount(table, file, "fetch", "max_buffered_bytes", fetch.maxBufferedBytes, 1,
                     std::int64_t{1} << 40),
       }) {
    if (error) return error;
  }
  if (fetch.maxBufferedBytes < fetch.maxResponseBytes) {
    return fail(file, "fetch.max_buffered_bytes (" + std::to_string(fetch.maxBufferedBytes) +
                          ") must be at least fetch.max_response_bytes (" +
                          std::to_string(fetch.maxResponseBytes) +
                          "): a response of the largest size must fit");
  }
  // Unset: a quarter of the whole, so that three other tools still find room, and at least one
  // response of the largest size.
  fetch.maxBufferedBytesPerTool = std::max(fetch.maxBufferedBytes / 4, fetch.maxResponseBytes);
  if (auto error = readCount(table, file, "fetch", "max_buffered_bytes_per_tool",
                             fetch.maxBufferedBytesPerTool, 1, std::int64_t{1} << 40)) {
    return error;
  }
  if (fetch.maxBufferedBytesPerTool < fetch.maxResponseBytes ||
      fetch.maxBufferedBytesPerTool > fetch.maxBufferedBytes) {
    return fail(file, "fetch.max_buffered_bytes_per_tool (" +
                          std::to_string(fetch.maxBufferedBytesPerTool) +
                          ") must be at least fetch.max_response_bytes (" +
                          std::to_string(fetch.maxResponseBytes) +
                          ") and at most fetch.max_buffered_bytes (" +
                          std::to_string(fetch.maxBufferedBytes) + ")");
  }
  fetch.timeout = std::chrono::milliseconds(timeoutMs);
  return std::nullopt;
}

// [secrets]: the vault's key file (relative paths are read from the config file's directory) and
// the largest value secrets.set accepts.
std::optional<ConfigError> readSecrets(const toml::table& table, const std::string& file,
                                       SecretsConfig& secrets) {
  const toml::node* section = table.get("secrets");
  if (section == nullptr) return std::nullopt;
  const toml::table* fields = section->as_table();
  if (fields == nullptr) {
    return fail(file, where(*section, "secrets") + " must be a table ([secrets])");
  }
  for (const auto& [key, value] : *fields) {
    if (key.str() != "key_file" && key.str() != "max_value_bytes") {
      return fail(file, where(value, "secrets." + std::string(key.str())) +
                            " is not a known key; use key_file or max_value_bytes");
    }
  }
  if (const toml::node* node = fields->get("key_file")) {
    auto path = node->value<std::string>();
    if (!path || path->empty()) {
      return fail(file,
                  where(*node, "secrets.key_file") + " must be the path of the secrets key file");
    }
    fs::path keyFile = *path;
    if (keyFile.is_relative()) keyFile = fs::absolute(fs::path(file)).parent_path() / keyFile;
    secrets.keyFile = keyFile;
  }
  return readCount(table, file, "secrets", "max_value_bytes", secrets.maxValueBytes, 1,
                   std::int64_t{1} << 20);
}

std::optional<ConfigError> readAccess(const toml::table& table, const std::string& file,
                                      AccessRules& access) {
  const toml::node* node = table.get("access");
  if (node == nullptr) return std::nullopt;
  const toml::array* rules = node->as_array();
  if (rules == nullptr) {
    return fail(file, where(*node, "access") + " must be an array of tables ([[access]])");
  }
  for (const toml::node& item : *rules) {
    const toml::table* rule = item.as_table();
    if (rule == nullptr) return fail(file, where(item, "access") + " entries must be tables");
    for (const auto& [key, value] : *rule) {
      static constexpr std::array<std::string_view, 5> kKeys{"user", "uid", "group", "gid",
                                                             "roles"};
      if (std::find(kKeys.begin(), kKeys.end(), key.str()) == kKeys.end()) {
        return fail(file, where(value, "access." + std::string(key.str())) +
                              " is not a known key; use user, uid, group, gid or roles");
      }
    }
    // One identity per rule: two would have to say whether the peer needs both or either.
    std::vector<std::string_view> identities;
    for (std::string_view key : {"user", "uid", "group", "gid"}) {
      if (rule->contains(key)) identities.push_back(key);
    }
    if (identities.size() > 1) {
      return fail(file, where(item, "access") + " names both " + std::string(identities[0]) +
                            " and " + std::string(identities[1]) +
                            "; a rule names one user or one group (write one rule for each)");
    }
    for (std::string_view key : {"user", "group"}) {
      if (const toml::node* name = rule->get(key); name != nullptr && !name->is_string()) {
        return fail(file, where(*name, "access." + std::string(key)) + " must be a string");
      }
    }
    AccessRule parsed;
    if (auto user = (*rule)["user"].value<std::string>()) {
      parsed.uid = lookupUser(*user);
      if (!parsed.uid) return fail(file, where(item, "access.user") + ": no user \"" + *user + "\"");
    } else if (const toml::node* uid = (*rule)["uid"].node()) {
      auto value = uid->value_exact<std::int64_t>();
      if (!value || *value < 0 || *value >= 4294967295) {
        return fail(file, where(*uid, "access.uid") + " must be an integer from 0 to 4294967294");
      }
      parsed.uid = static_cast<uid_t>(*value);
    }
    if (auto groupName = (*rule)["group"].value<std::string>()) {
      parsed.gid = lookupGroup(*groupName);
      if (!parsed.gid) {
        return fail(file, where(item, "access.group") + ": no group \"" + *groupName + "\"");
      }
    } else if (const toml::node* gid = (*rule)["gid"].node()) {
      auto value = gid->value_exact<std::int64_t>();
      if (!value || *value < 0 || *value >= 4294967295) {
        return fail(file, where(*gid, "access.gid") + " must be an integer from 0 to 4294967294");
      }
      parsed.gid = static_cast<gid_t>(*value);
    }
    if (!parsed.uid && !parsed.gid) {
      return fail(file, where(item, "access") + " needs one of user, uid, group or gid");
    }
    const toml::array* roles = (*rule)["roles"].as_array();
    if (roles == nullptr || roles->empty()) {
      return fail(file, where(item, "access.roles") +
                            " must list roles: admin, agent, approver, host");
    }
    for (const toml::node& roleNode : *roles) {
      auto name = roleNode.value<std::string>();
      auto role = name ? parseRole(*name) : std::nullopt;
      if (!role) {
        return fail(file, where(roleNode, "access.roles") +
                              ": unknown role; use admin, agent, approver or host");
      }
      parsed.roles.add(*role);
    }
    access.addRule(parsed);
  }
  return std::nullopt;
}

std::optional<LogFormat> parseLogFormat(const std::string& name) {
  if (name == "auto") return LogFormat::automatic;
  if (name == "text") return LogFormat::text;
  if (name == "json") return LogFormat::json;
  return std::nullopt;
}

bool validLogLevel(const std::string& level) {
  for (const char* known : {"trace", "debug", "info", "warn", "error", "critical", "off"}) {
    if (level == known) return true;
  }
  return false;
}

}  // namespace

fs::path defaultSocketPath() {
  // Under systemd without socket activation: RuntimeDirectory=toolhost, where toolhost.socket
  // would put it too. toolhostctl does not see this variable; it finds the same path by uid.
  if (auto runtime = env("RUNTIME_DIRECTORY")) {
    return fs::path(runtime->substr(0, runtime->find(':'))) / "toolhost.sock";
  }
  return protocol::defaultSocketPath();
}

fs::path defaultStateDir() {
  if (auto systemd = env("STATE_DIRECTORY")) {
    // systemd may pass several, separated by ':'; the first is ours.
    return fs::path(systemd->substr(0, systemd->find(':')));
  }
  if (geteuid() == 0) return "/var/lib/toolhost";
  if (auto state = env("XDG_STATE_HOME")) return fs::path(*state) / "toolhost";
  if (auto home = env("HOME")) return fs::path(*home) / ".local/state/toolhost";
  return fs::path("/tmp") / ("toolhost-" + std::to_string(geteuid())) / "state";
}

namespace {

// More than any config needs: a bigger file is a mistake (the wrong file given).
constexpr std::size_t kMaxConfigBytes = std::size_t{16} << 20;

// The config file's text. Only a regular file: a FIFO or a device would block the reader (on a
// reload, the daemon's I/O thread) until someone writes to it.
std::variant<std::string, ConfigError> readConfigText(const std::string& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return ConfigError{file + ": cannot be opened: " + std::strerror(errno)};
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat status {};
  if (::fstat(fd, &status) != 0) {
    return ConfigError{file + ": cannot be read: " + std::strerror(errno)};
  }
  if (!S_ISREG(status.st_mode)) {
    return ConfigError{file +
                       ": is not a regular file (a FIFO, a device or a directory cannot "
                       "be a config file)"};
  }
  if (static_cast<std::uint64_t>(status.st_size) > kMaxConfigBytes) {
    return ConfigError{file + ": is larger than " + std::to_string(kMaxConfigBytes >> 20) +
                       " MiB; is it the right file?"};
  }
  std::string text;
  char buffer[65536];
  for (;;) {
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ConfigError{file + ": cannot be read: " + std::strerror(errno)};
    if (got == 0) break;
    text.append(buffer, static_cast<std::size_t>(got));
    if (text.size() > kMaxConfigBytes) {
      return ConfigError{file + ": is larger than " + std::to_string(kMaxConfigBytes >> 20) +
                         " MiB; is it the right file?"};
    }
  }
  return text;
}

}  // namespace

Result loadConfig(const CommandLine& commandLine) {
  Config config;
  config.access = AccessRules::defaultFor(geteuid());
  std::optional<fs::path> configSocket;
  std::optional<fs::path> configState;

  if (commandLine.configFile) {
    const std::string file = commandLine.configFile->string();
    config.configFile = *commandLine.configFile;
    auto text = readConfigText(file);
    if (auto* error = std::get_if<ConfigError>(&text)) return *error;
    toml::table table;
    try {
      table = toml::parse(std::get<std::string>(text), file);
    } catch (const toml::parse_error& error) {
      std::ostringstream out;
      out << file << ":" << error.source().begin.line << ": " << error.description();
      return ConfigError{out.str()};
    }
    static const std::array<const char*, 6> kSections{"server", "state", "store", "limits",
                                                      "log",    "access"};
    for (const auto& [key, value] : table) {
      bool known = false;
      for (const char* section : kSections) known = known || key.str() == section;
      // Sections of later subsystems are read by them; unknown top-level keys are typos.
      for (const char* later : {"runtime", "fetch", "policy", "secrets", "storage", "popup"}) {
        known = known || key.str() == later;
      }
      if (!known) return fail(file, where(value, std::string(key.str())) + " is not a known section");
    }
    for (auto error : {
             checkSection(table, file, "server",
                          {"socket", "socket_group", "io_threads", "shutdown_grace_ms"}),
             checkSection(table, file, "state", {"dir"}),
             checkSection(table, file, "store", {"map_size_mb"}),
             checkSection(table, file, "limits",
                          {"max_message_bytes", "max_depth", "max_batch", "max_in_flight",
                           "max_connections"}),
             checkSection(table, file, "log", {"level", "format"}),
             checkSection(table, file, "policy", {"prompt_timeout_ms", "audit_max_entries"}),
             checkSection(table, file, "popup", {"timeout_ms"}),
             checkSection(table, file, "runtime",
                          {"workers",
                           "max_retained",
                           "memory_budget_mb",
                           "max_queued_per_sandbox",
                           "processes",
                           "prewarmed",
                           "kill_grace_ms",
                           "max_restarts",
                           "restart_window_ms",
                           "default_wall_ms",
                           "default_cpu_ms",
                           "default_heap_mb",
                           "default_array_buffer_mb",
                           "default_stack_kb",
                           "default_output_bytes",
                           "max_wall_ms",
                           "max_cpu_ms",
                           "max_heap_mb",
                           "max_array_buffer_mb",
                           "max_stack_kb",
                           "max_output_bytes",
                           "jit"}),
         }) {
      if (error) return *error;
    }
    std::optional<std::string> socket, groupName, dir, level, format;
    for (auto error : {readString(table, file, "server", "socket", socket),
                       readString(table, file, "server", "socket_group", groupName),
                       readString(table, file, "state", "dir", dir),
                       readString(table, file, "log", "level", level),
                       readString(table, file, "log", "format", format)}) {
      if (error) return *error;
    }
    // Relative paths in the file are relative to its folder, like key_file and extra_ca_file:
    // not to wherever the daemon was started (under systemd, "/").
    auto fromFile = [&](const std::string& path) {
      fs::path resolved = path;
      if (resolved.is_relative()) resolved = fs::absolute(fs::path(file)).parent_path() / resolved;
      return resolved;
    };
    if (socket) configSocket = fromFile(*socket);
    if (groupName) {
      config.socketGroup = lookupGroup(*groupName);
      if (!config.socketGroup) return fail(file, "server.socket_group: no group \"" + *groupName + "\"");
    }
    if (dir) configState = fromFile(*dir);
    std::int64_t graceMs = config.shutdownGrace.count();
    for (auto error : {
             readCount(table, file, "server", "io_threads", config.ioThreads, 1, 64),
             readCount(table, file, "server", "shutdown_grace_ms", graceMs, 0, 600000),
             readCount(table, file, "store", "map_size_mb", config.mapSizeMb, 1, 1 << 20),
             readCount(table, file, "limits", "max_message_bytes", config.limits.maxMessageBytes,
                       1024, std::int64_t{1} << 30),
             readCount(table, file, "limits", "max_depth", config.limits.maxDepth, 2, 1000),
             readCount(table, file, "limits", "max_batch", config.limits.maxBatch, 1, 100000),
             readCount(table, file, "limits", "max_in_flight", config.limits.maxInFlight, 1,
                       100000),
             readCount(table, file, "limits", "max_connections", config.maxConnections, 1, 100000),
         }) {
      if (error) return *error;
    }
    config.shutdownGrace = std::chrono::milliseconds(graceMs);
    std::int64_t promptTimeoutMs = config.promptTimeout.count();
    std::int64_t popupTimeoutMs = config.popupTimeout.count();
    for (auto error : {
             readCount(table, file, "policy", "prompt_timeout_ms", promptTimeoutMs, 1, 86400000),
             readCount(table, file, "popup", "timeout_ms", popupTimeoutMs, 1, 86400000),
             readCount(table, file, "policy", "audit_max_entries", config.auditMaxEntries, 1,
                       100000000),
         }) {
      if (error) return *error;
    }
    config.promptTimeout = std::chrono::milliseconds(promptTimeoutMs);
    config.popupTimeout = std::chrono::milliseconds(popupTimeoutMs);
    if (auto error = readRuntime(table, file, config.runtime)) return *error;
    if (auto error = readFetch(table, file, config.fetch)) return *error;
    if (auto error = readStorage(table, file, config.storage)) return *error;
    if (auto error = readSecrets(table, file, config.secrets)) return *error;
    if (level) {
      if (!validLogLevel(*level)) {
        return fail(file, "log.level must be trace, debug, info, warn, error, critical or off");
      }
      config.logLevel = *level;
    }
    if (format) {
      auto parsed = parseLogFormat(*format);
      if (!parsed) return fail(file, "log.format must be auto, text or json");
      config.logFormat = *parsed;
    }
    if (table.contains("access")) {
      // Listing access rules replaces the default; the daemon's own uid stays admin so the
      // operator can never lock themselves out.
      config.access = AccessRules::defaultFor(geteuid());
      if (auto error = readAccess(table, file, config.access)) return *error;
    }
  }

  if (commandLine.socketPath) {
    if (commandLine.socketPath->empty()) {
      return ConfigError{"--socket is empty: leave it out for the default socket, or name one"};
    }
    config.socketPath = *commandLine.socketPath;
  } else if (const char* socket = std::getenv("TOOLHOST_SOCKET"); socket != nullptr) {
    if (*socket == '\0') {
      return ConfigError{
          "TOOLHOST_SOCKET is set but empty: unset it for the default socket, or name one"};
    }
    config.socketPath = socket;
  } else if (configSocket) {
    config.socketPath = *configSocket;
  } else {
    config.socketPath = defaultSocketPath();
  }
  if (commandLine.stateDir && commandLine.stateDir->empty()) {
    return ConfigError{
        "--state-dir is empty: leave it out for the default state directory, or name one"};
  }
  config.stateDir = commandLine.stateDir ? *commandLine.stateDir
                    : configState        ? *configState
                                         : defaultStateDir();
  if (commandLine.logLevel) {
    if (!validLogLevel(*commandLine.logLevel)) {
      return ConfigError{"--log-level must be trace, debug, info, warn, error, critical or off"};
    }
    config.logLevel = *commandLine.logLevel;
  }
  if (commandLine.logFormat) {
    auto parsed = parseLogFormat(*commandLine.logFormat);
    if (!parsed) return ConfigError{"--log-format must be auto, text or json"};
    config.logFormat = *parsed;
  }
  if (config.socketPath.native().size() > kMaxSocketPathBytes) {
    return ConfigError{"socket path " + config.socketPath.string() + " is " +
                       std::to_string(config.socketPath.native().size()) +
                       " bytes; a Unix socket path may be at most " +
                       std::to_string(kMaxSocketPathBytes) + " bytes"};
  }
  if (config.socketPath.empty()) return ConfigError{"the socket path is empty"};
  return config;
}

namespace {

const char* logFormatName(LogFormat format) {
  switch (format) {
    case LogFormat::automatic: return "auto";
    case LogFormat::text: return "text";
    case LogFormat::json: return "json";
  }
  return "?";
}

bool sameRules(const AccessRules& a, const AccessRules& b) {
  const auto& x = a.rules();
  const auto& y = b.rules();
  if (x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i].uid != y[i].uid || x[i].gid != y[i].gid || !(x[i].roles == y[i].roles)) return false;
  }
  return true;
}

template <typename T>
std::string text(const T& value) {
  if constexpr (std::is_same_v<T, fs::path>) {
    return value.string();
  } else if constexpr (std::is_same_v<T, std::string>) {
    return value;
  } else {
    return std::to_string(value);
  }
}

template <typename T>
void compare(std::vector<std::string>& out, const char* name, const T& before, const T& after) {
  if (before != after) {
    out.push_back(std::string(name) + ": " + text(before) + " -> " + text(after));
  }
}

std::string groupText(const std::optional<gid_t>& gid) {
  return gid ? "gid " + std::to_string(*gid) : "none";
}

std::string rangesText(const std::vector<policy::Cidr>& ranges) {
  std::string out = "[";
  for (const auto& range : ranges) out += (out.size() > 1 ? ", " : "") + range.toString();
  return out + "]";
}

std::string optionalPathText(const std::optional<fs::path>& path) {
  return path ? path->string() : "none";
}

}  // namespace

ConfigChanges reconcileReload(const Config& running, Config& next) {
  ConfigChanges changes;
  auto& applied = changes.applied;
  compare(applied, "limits.max_message_bytes", running.limits.maxMessageBytes,
          next.limits.maxMessageBytes);
  compare(applied, "limits.max_depth", running.limits.maxDepth, next.limits.maxDepth);
  compare(applied, "limits.max_batch", running.limits.maxBatch, next.limits.maxBatch);
  compare(applied, "limits.max_in_flight", running.limits.maxInFlight, next.limits.maxInFlight);
  compare(applied, "limits.max_connections", running.maxConnections, next.maxConnections);
  compare(applied, "log.level", running.logLevel, next.logLevel);
  compare(applied, "server.shutdown_grace_ms", running.shutdownGrace.count(),
          next.shutdownGrace.count());
  compare(applied, "policy.prompt_timeout_ms", running.promptTimeout.count(),
          next.promptTimeout.count());
  compare(applied, "popup.timeout_ms", running.popupTimeout.count(), next.popupTimeout.count());
  compare(applied, "fetch.timeout_ms", running.fetch.timeout.count(), next.fetch.timeout.count());
  compare(applied, "fetch.max_response_bytes", running.fetch.maxResponseBytes,
          next.fetch.maxResponseBytes);
  compare(applied, "fetch.max_request_bytes", running.fetch.maxRequestBytes,
          next.fetch.maxRequestBytes);
  compare(applied, "fetch.max_buffered_bytes", running.fetch.maxBufferedBytes,
          next.fetch.maxBufferedBytes);
  compare(applied, "fetch.max_buffered_bytes_per_tool", running.fetch.maxBufferedBytesPerTool,
          next.fetch.maxBufferedBytesPerTool);
  compare(applied, "storage.max_keys", running.storage.maxKeys, next.storage.maxKeys);
  compare(applied, "storage.max_key_bytes", running.storage.maxKeyBytes, next.storage.maxKeyBytes);
  compare(applied, "storage.max_value_bytes", running.storage.maxValueBytes,
          next.storage.maxValueBytes);
  compare(applied, "storage.max_total_bytes", running.storage.maxTotalBytes,
          next.storage.maxTotalBytes);
  compare(applied, "secrets.max_value_bytes", running.secrets.maxValueBytes,
          next.secrets.maxValueBytes);
  if (!sameRules(running.access, next.access)) {
    applied.push_back("access: " + std::to_string(running.access.rules().size()) + " rule(s) -> " +
                      std::to_string(next.access.rules().size()) + " rule(s)");
  }

  auto& restart = changes.needRestart;
  compare(restart, "server.socket", running.socketPath, next.socketPath);
  if (running.socketGroup != next.socketGroup) {
    restart.push_back("server.socket_group: " + groupText(running.socketGroup) + " -> " +
                      groupText(next.socketGroup));
  }
  compare(restart, "state.dir", running.stateDir, next.stateDir);
  compare(restart, "store.map_size_mb", running.mapSizeMb, next.mapSizeMb);
  compare(restart, "server.io_threads", running.ioThreads, next.ioThreads);
  compare(restart, "policy.audit_max_entries", running.auditMaxEntries, next.auditMaxEntries);
  if (running.fetch.allowPrivate != next.fetch.allowPrivate) {
    restart.push_back("fetch.allow_private: " + rangesText(running.fetch.allowPrivate) + " -> " +
                      rangesText(next.fetch.allowPrivate));
  }
  if (running.fetch.extraCaFile != next.fetch.extraCaFile) {
    restart.push_back("fetch.extra_ca_file: " + optionalPathText(running.fetch.extraCaFile) +
                      " -> " + optionalPathText(next.fetch.extraCaFile));
  }
  if (running.secrets.keyFile != next.secrets.keyFile) {
    restart.push_back("secrets.key_file: " + optionalPathText(running.secrets.keyFile) + " -> " +
                      optionalPathText(next.secrets.keyFile));
  }
  if (running.logFormat != next.logFormat) {
    restart.push_back(std::string("log.format: ") + logFormatName(running.logFormat) + " -> " +
                      logFormatName(next.logFormat));
  }
  // [runtime] is read once, when the sandbox pool starts.
  const runtime::RuntimeConfig& was = running.runtime;
  const runtime::RuntimeConfig& now = next.runtime;
  compare(restart, "runtime.workers", was.workers, now.workers);
  compare(restart, "runtime.max_retained", was.maxRetained, now.maxRetained);
  compare(restart, "runtime.memory_budget_mb", was.memoryBudgetMb, now.memoryBudgetMb);
  compare(restart, "runtime.max_queued_per_sandbox", was.maxQueuedPerSandbox,
          now.maxQueuedPerSandbox);
  compare(restart, "runtime.processes", was.processes, now.processes);
  compare(restart, "runtime.prewarmed", was.prewarmed, now.prewarmed);
  compare(restart, "runtime.kill_grace_ms", was.killGraceMs, now.killGraceMs);
  compare(restart, "runtime.max_restarts", was.maxRestarts, now.maxRestarts);
  compare(restart, "runtime.restart_window_ms", was.restartWindowMs, now.restartWindowMs);
  compare(restart, "runtime.jit", was.jit, now.jit);
  for (const auto& [name, field] : kLimitKeys) {
    compare(restart, (std::string("runtime.default_") + name).c_str(),
            (was.defaults.*field).value_or(0), (now.defaults.*field).value_or(0));
    compare(restart, (std::string("runtime.max_") + name).c_str(), (was.caps.*field).value_or(0),
            (now.caps.*field).value_or(0));
  }
  next.runtime = running.runtime;
  next.socketPath = running.socketPath;
  next.socketGroup = running.socketGroup;
  next.stateDir = running.stateDir;
  next.mapSizeMb = running.mapSizeMb;
  next.ioThreads = running.ioThreads;
  next.logFormat = running.logFormat;
  next.auditMaxEntries = running.auditMaxEntries;
  next.fetch.allowPrivate = running.fetch.allowPrivate;
  next.fetch.extraCaFile = running.fetch.extraCaFile;
  next.secrets.keyFile = running.secrets.keyFile;
  return changes;
}

}  // namespace toolhost::daemon
