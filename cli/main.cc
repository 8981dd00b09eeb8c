// toolhostctl: talks to toolhostd over its Unix socket. Prints JSON; exit codes a script can rely
// on: 0 result, 1 JSON-RPC error, 2 usage, 3 cannot connect (or the connection failed).

#include "cli/approve.h"
#include "cli/client.h"
#include "cli/popup_host.h"
#include "cli/secret_input.h"
#include "protocol/json_parse.h"
#include "protocol/json_text.h"
#include "protocol/path_trust.h"
#include "protocol/socket_path.h"

#include <unistd.h>
#include <CLI/CLI.hpp>
#include <boost/json/serialize.hpp>
#include <filesystem>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

namespace json = boost::json;
using namespace toolhost;

namespace {

// The longest --timeout: about 115 days, far from overflowing the milliseconds.
constexpr double kMaxTimeoutSeconds = 1e7;

using cli::kExitConnect;
using cli::kExitResult;
using cli::kExitRpcError;
using cli::kExitUsage;

void pretty(std::string& out, const json::value& value, int indent) {
  auto newline = [&](int level) {
    out += '\n';
    out.append(static_cast<std::size_t>(level) * 2, ' ');
  };
  if (const auto* object = value.if_object()) {
    if (object->empty()) {
      out += "{}";
      return;
    }
    out += '{';
    bool first = true;
    for (const auto& [key, member] : *object) {
      if (!first) out += ',';
      first = false;
      newline(indent + 1);
      out += protocol::writeJson(json::string(key));
      out += ": ";
      pretty(out, member, indent + 1);
    }
    newline(indent);
    out += '}';
  } else if (const auto* array = value.if_array()) {
    if (array->empty()) {
      out += "[]";
      return;
    }
    out += '[';
    bool first = true;
    for (const auto& item : *array) {
      if (!first) out += ',';
      first = false;
      newline(indent + 1);
      pretty(out, item, indent + 1);
    }
    newline(indent);
    out += ']';
  } else {
    out += protocol::writeJson(value);
  }
}

// The whole of a file (or of stdin for "-"), or why not.
bool readWhole(const std::string& path, std::string& out, std::string& error) {
  if (path == "-") {
    out.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    return true;
  }
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    error = "cannot read " + path + ": " + std::strerror(errno);
    return false;
  }
  char buffer[65536];
  std::size_t got;
  while ((got = std::fread(buffer, 1, sizeof buffer, file)) > 0) out.append(buffer, got);
  const bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed) error = "cannot read " + path;
  return !failed;
}

// Where `text` stops being UTF-8 (a JSON string must be), or npos.
std::size_t firstInvalidUtf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    std::size_t length = c < 0x80           ? 1
                         : (c >> 5) == 0x6  ? 2
                         : (c >> 4) == 0xE  ? 3
                         : (c >> 3) == 0x1E ? 4
                                            : 0;
    if (length == 0 || i + length > text.size()) return i;
    std::uint32_t code = length == 1 ? c : c & (0x7F >> length);
    for (std::size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next >> 6) != 0x2) return i;
      code = (code << 6) | (next & 0x3F);
    }
    static constexpr std::uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < kSmallest[length] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
      return i;
    }
    i += length;
  }
  return std::string_view::npos;
}

// A text file as a JSON string, or why it cannot be one.
bool readText(const std::string& path, std::string& out, std::string& error) {
  if (!readWhole(path, out, error)) return false;
  if (const std::size_t bad = firstInvalidUtf8(out); bad != std::string_view::npos) {
    error = path + " is not UTF-8 text (at byte " + std::to_string(bad) + ")";
    return false;
  }
  return true;
}

void print(const json::value& value, bool asPretty) {
  std::string out;
  if (asPretty) {
    pretty(out, value, 0);
  } else {
    out = protocol::writeJson(value);
  }
  // Tools and remote servers choose these strings: no C1 controls or bidirectional overrides
  // reach a terminal raw.
  out = cli::terminalSafeJson(out);
  out += '\n';
  std::fwrite(out.data(), 1, out.size(), stdout);
}

// Whether a JSON-RPC response is "method not found".
bool isMethodNotFound(const json::object& response) {
  const auto* error = response.if_contains("error");
  if (error == nullptr || !error->is_object()) return false;
  const auto* code = error->as_object().if_contains("code");
  return code != nullptr && code->is_int64() && code->as_int64() == -32601;
}

// Calls `method` and prints its result (exit 0) or its error (exit 1). With `orTool`, a method
// the daemon does not have is taken as a tool name: the call is repeated as tools.call {name:
// method, arguments: params}, so `toolhostctl call weather-lookup '{"city":"Paris"}'` runs the
// tool. Methods win: a tool named like a method (ping) is called with tools.call.
int callAndPrint(const std::filesystem::path& socket, const std::string& method,
                 const json::value& params, bool asPretty, std::chrono::milliseconds timeout,
                 bool orTool = false) {
  auto client = cli::Client::connect(socket);
  if (!client) {
    std::fprintf(stderr, "toolhostctl: %s\n", client.error().detail.c_str());
    return kExitConnect;
  }
  auto asTool = [&] {
    json::object toolCall{{"name", method},
                          {"arguments", params.is_null() ? json::value(json::object{}) : params}};
    return client->call("tools.call", toolCall, timeout);
  };
  // Every method but ping has a dot in its name, and no tool name has one: a name without one is
  // a tool's, called at once rather than tried as a method first (which would cost a request
  // and leave a "no method" warning in the daemon's log).
  const bool toolName = orTool && method != "ping" && method.find('.') == std::string::npos &&
                        !method.starts_with("$/");
  auto response = toolName ? asTool() : client->call(method, params, timeout);
  if (response && orTool && !toolName && isMethodNotFound(*response)) response = asTool();
  if (!response) {
    std::fprintf(stderr, "toolhostctl: %s\n", response.error().detail.c_str());
    return kExitConnect;
  }
  if (const auto* error = response->if_contains("error")) {
    print(*error, asPretty);
    std::string detail = cli::errorDetail(*response);
    // A mistyped method without a dot was taken for a tool's name: say both were looked for.
    const auto* data = error->is_object() ? error->as_object().if_contains("data") : nullptr;
    const auto* kind =
        data != nullptr && data->is_object() ? data->as_object().if_contains("kind") : nullptr;
    if (toolName && kind != nullptr && *kind == "not-found") {
      detail += " (and no method is named " + method +
                ": `toolhostctl call tools.list` lists the tools, `toolhostctl call rpc.discover` "
                "the methods)";
    }
    std::fprintf(stderr, "toolhostctl: %s\n", detail.c_str());
    return kExitRpcError;
  }
  const auto* result = response->if_contains("result");
  print(result ? *result : json::value(nullptr), asPretty);
  // A secret or decision stored for what the revision's manifest does not request (a mistyped
  // name or origin) is kept, but nothing of that revision will ever use it: said, not hidden.
  if ((method == "secrets.set" || method == "policy.set") && result != nullptr &&
      result->is_object()) {
    if (const auto* requested = result->as_object().if_contains("requested");
        requested != nullptr && *requested == false) {
      std::fprintf(stderr,
                   "toolhostctl: note: stored, but the revision's manifest does not request %s, "
                   "so no call of it will use this (\"requested\": false); check the spelling\n",
                   method == "secrets.set" ? "this secret" : "this action and target");
    }
  }
  return kExitResult;
}

// "unknown command ..." when parsing stopped at a word that names no command of the deepest
// command given (toolhostctl frobnicate, toolhostctl policy frob); empty otherwise.
std::string unknownCommand(CLI::App& app) {
  CLI::App* deepest = &app;
  for (;;) {
    auto parsed = deepest->get_subcommands();
    if (parsed.empty()) break;
    deepest = parsed.front();
  }
  const auto extra = deepest->remaining();
  if (extra.empty() || deepest->get_subcommands({}).empty()) return {};
  std::string out = "unknown command \"" + extra.front() + "\"";
  if (deepest != &app) out += " for " + deepest->get_name();
  out += "; the commands are:";
  for (const auto* command : deepest->get_subcommands({})) out += " " + command->get_name();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "toolhostctl: talk to toolhostd. Prints JSON. Exit codes: 0 result, 1 JSON-RPC "
      "error, 2 usage, 3 cannot connect, the connection failed, or no answer in time."};
  app.require_subcommand(1);
  std::string socketFlag;
  bool compact = false;
  bool forcePretty = false;
  double timeoutSeconds = 0;
  app.add_option("--socket", socketFlag,
                 "the daemon's socket (else $TOOLHOST_SOCKET, else the default path)");
  app.add_flag("--compact", compact, "print one line of JSON (the default when not a terminal)");
  app.add_flag("--pretty", forcePretty, "print indented JSON (the default on a terminal)");
  app.add_option("--timeout", timeoutSeconds, "seconds to wait for the answer (default: no limit)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            // NaN passes every comparison, and a huge number overflows the milliseconds.
            const double seconds = std::strtod(text.c_str(), nullptr);
            if (!std::isfinite(seconds) || seconds < 0 || seconds > kMaxTimeoutSeconds) {
              return "--timeout must be a number of seconds from 0 to " +
                     std::to_string(static_cast<long>(kMaxTimeoutSeconds));
            }
            return {};
          },
          "SECONDS"));

  auto* ping = app.add_subcommand("ping", "check that the daemon answers");
  auto* info = app.add_subcommand("info", "version, V8 version, uptime, your roles, limits");
  auto* health = app.add_subcommand("health", "whether the daemon and its parts work");
  auto* discover = app.add_subcommand("discover", "the OpenRPC document of every method");
  auto* call = app.add_subcommand(
      "call",
      "call any method: call METHOD [PARAMS_JSON | -]; a name the daemon has no method for is "
      "taken as a tool: call TOOL [ARGUMENTS_JSON | -] runs tools.call");
  std::string method;
  std::string paramsText;
  call->add_option("method", method, "method name, e.g. tools.list")->required();
  call->add_option("params", paramsText, "params as a JSON object, or - to read them from stdin");

  auto* backup = app.add_subcommand(
      "backup",
      "write a copy of the daemon's state database to PATH (a new file; relative to this "
      "directory; the daemon's user writes it): store.backup");
  std::string backupPath;
  backup->add_option("path", backupPath, "where the copy goes")->required();

  auto* install = app.add_subcommand(
      "install",
      "install a tool: install MANIFEST.json [--source FILE.js] [--module NAME=FILE ...] "
      "[--activate [--replace]]; the files' text goes into the manifest's execution");
  std::string manifestPath;
  std::string sourcePath;
  std::vector<std::string> modulePaths;
  bool activate = false;
  bool replace = false;
  install->add_option("manifest", manifestPath, "the manifest as JSON, or - for stdin")->required();
  install->add_option("--source", sourcePath, "a JavaScript file: the execution's source");
  install->add_option("--module", modulePaths,
                      "NAME=FILE: a module the source imports as NAME (repeatable)");
  install->add_flag("--activate", activate, "bind the tool's name to the new revision");
  install->add_flag("--replace", replace, "with --activate: move a name bound to another revision");

  auto* approve = app.add_subcommand(
      "approve",
      "be asked about each undecided request (tool, target, read/write) and answer it; "
      "answers are read from stdin line by line");

  auto* popupHost = app.add_subcommand(
      "popup-host",
      "be the host that opens tools' popups: prints each popup.open and popup.close as a JSON "
      "line, and sends each stdin line ({popupId, result} or {popupId, error}) as popup.result");

  // policy list|set|revoke|reset|check: thin wrappers over the policy.* methods.
  auto* policy = app.add_subcommand("policy", "decisions: list, set ahead, revoke, reset, check");
  policy->require_subcommand(1);
  std::string revision, action, target, access, verdict, scope = "always";
  auto addKey = [&](CLI::App* command) {
    command->add_option("revision", revision, "tool revision (sha256:...)")->required();
    command->add_option("action", action, "fetch, popup or invoke")
        ->required()
        ->check(CLI::IsMember({"fetch", "popup", "invoke"}));
    command->add_option("target", target, "origin (https://host[:port]), custom-html, or endpoint")
        ->required();
    command->add_option("access", access, "read or write")
        ->required()
        ->check(CLI::IsMember({"read", "write"}));
  };
  auto* policyList = policy->add_subcommand("list", "decisions in force and prompts pending");
  policyList->add_option("--revision", revision, "only this tool revision");
  auto* policySet = policy->add_subcommand(
      "set", "decide ahead: set REVISION ACTION TARGET ACCESS allow|deny [--scope session|always]");
  addKey(policySet);
  policySet->add_option("verdict", verdict, "allow or deny")
      ->required()
      ->check(CLI::IsMember({"allow", "deny"}));
  policySet->add_option("--scope", scope, "session (until the daemon restarts) or always (default)")
      ->check(CLI::IsMember({"session", "always"}));
  auto* policyRevoke = policy->add_subcommand("revoke", "forget the decision for one key");
  addKey(policyRevoke);
  auto* policyReset = policy->add_subcommand("reset", "forget every decision (or one revision's)");
  policyReset->add_option("revision", revision, "only this tool revision");
  auto* policyCheck = policy->add_subcommand(
      "check", "what would happen: runs the authorization, prompting approvers if undecided");
  addKey(policyCheck);

  auto* auditCommand = app.add_subcommand("audit", "the newest audit entries, oldest first");
  std::int64_t auditLimit = 100;
  auditCommand->add_option("--limit", auditLimit, "how many entries (1 to 10000)")
      ->check(CLI::Range(1, 10000));
  auditCommand->add_option("--revision", revision, "only this tool revision");

  // secrets set|list|delete: the value of set is read from stdin or a hidden prompt, never from
  // the command line (which ps and shell histories show).
  auto* secrets =
      app.add_subcommand("secrets", "secrets tools use but never read: set, list, delete");
  secrets->require_subcommand(1);
  std::string secretTool, secretName, secretRevision;
  std::vector<std::string> secretOrigins;
  bool secretCarry = false;
  bool secretAllowBody = false;
  auto* secretsSet = secrets->add_subcommand(
      "set",
      "store a secret: set TOOL NAME --origin https://api.example [--origin ...] [--revision REV] "
      "[--carry] [--allow-body]; the value is read from stdin, or typed at a hidden prompt");
  secretsSet->add_option("tool", secretTool, "tool name")->required();
  secretsSet
      ->add_option("name", secretName, "secret name, as in the manifest's capabilities.secrets")
      ->required();
  secretsSet->add_option("--origin", secretOrigins, "an exact https origin the value may go to")
      ->required();
  secretsSet->add_option("--revision", secretRevision,
                         "the tool revision (default: the active one)");
  secretsSet->add_flag("--carry", secretCarry,
                       "later revisions of the tool that request the secret use it too");
  secretsSet->add_flag("--allow-body", secretAllowBody,
                       "also substitute it in request bodies (default: headers only)");
  // Anything more is refused below without being repeated: it may be the value itself.
  secretsSet->allow_extras();
  auto* secretsList = secrets->add_subcommand("list", "stored secrets: names, scopes, origins");
  secretsList->add_option("tool", secretTool, "only this tool");
  auto* secretsDelete = secrets->add_subcommand("delete", "remove a secret: delete TOOL NAME");
  secretsDelete->add_option("tool", secretTool, "tool name")->required();
  secretsDelete->add_option("name", secretName, "secret name")->required();
  secretsDelete->add_option("--revision", secretRevision,
                            "the tool revision (default: the active one)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // A word where a command belongs: CLI11 says only that a command is required.
    if (auto unknown = unknownCommand(app); !unknown.empty()) {
      std::cerr << "toolhostctl: " << unknown << "\nRun with --help for more information.\n";
      return kExitUsage;
    }
    int code = app.exit(error);
    return code == 0 ? 0 : kExitUsage;
  }
  bool asPretty = forcePretty || (!compact && ::isatty(STDOUT_FILENO));
  if (app.count("--socket") > 0 && socketFlag.empty()) {
    std::cerr << "toolhostctl: --socket is empty: leave it out for the default socket, or name "
                 "one\n";
    return kExitUsage;
  }
  std::filesystem::path socket;
  try {
    socket = protocol::chooseSocketPath(socketFlag);
  } catch (const std::invalid_argument& error) {
    std::cerr << "toolhostctl: " << error.what() << "\n";
    return kExitUsage;
  }
  // The default under /tmp (no XDG_RUNTIME_DIR): another user may have made that directory
  // first, to put their own socket there and read what this command sends.
  if (socket == protocol::defaultSocketPath() && socket.parent_path().parent_path() == "/tmp") {
    if (auto reason = protocol::untrustedPathReason(socket.parent_path())) {
      std::cerr << "toolhostctl: not connecting to " << socket.string() << ": " << *reason << "\n";
      return kExitConnect;
    }
  }
  // At least a millisecond: a tiny positive timeout still waits.
  auto timeout = timeoutSeconds > 0 ? std::chrono::milliseconds(std::max<std::int64_t>(
                                          1, std::llround(timeoutSeconds * 1000)))
                                    : std::chrono::milliseconds::max();

  if (*ping) return callAndPrint(socket, "ping", nullptr, asPretty, timeout);
  if (*info) return callAndPrint(socket, "daemon.info", nullptr, asPretty, timeout);
  if (*health) return callAndPrint(socket, "daemon.health", nullptr, asPretty, timeout);
  if (*discover) return callAndPrint(socket, "rpc.discover", nullptr, asPretty, timeout);
  if (*backup) {
    std::error_code error;
    const auto absolute = std::filesystem::absolute(backupPath, error);
    if (error || backupPath.empty()) {
      std::cerr << "toolhostctl: backup needs a path\n";
      return kExitUsage;
    }
    // As it is: ".." after a symbolic link is the kernel's to resolve, not this text's.
    return callAndPrint(socket, "store.backup", json::object{{"path", absolute.string()}}, asPretty,
                        timeout);
  }
  if (*install) {
    std::string text, error;
    if (!readText(manifestPath, text, error)) {
      std::fprintf(stderr, "toolhostctl: %s\n", error.c_str());
      return kExitUsage;
    }
    auto parsed = protocol::parseJson(text);
    if (!parsed || !parsed->is_object()) {
      std::fprintf(stderr, "toolhostctl: %s is not a JSON object%s%s\n", manifestPath.c_str(),
                   parsed ? "" : ": ", parsed ? "" : parsed.error().detail.c_str());
      return kExitUsage;
    }
    json::object manifest = std::move(parsed->as_object());
    if (!sourcePath.empty() || !modulePaths.empty()) {
      json::value& execution = manifest["execution"];
      if (execution.is_null()) {
        execution = json::object{{"class", "sandboxed-code"}, {"runtime", "javascript"}};
      }
      if (!execution.is_object()) {
        std::fprintf(stderr, "toolhostctl: the manifest's execution is not an object\n");
        return kExitUsage;
      }
      if (!sourcePath.empty()) {
        std::string source;
        if (!readText(sourcePath, source, error)) {
          std::fprintf(stderr, "toolhostctl: %s\n", error.c_str());
          return kExitUsage;
        }
        execution.as_object()["source"] = json::string(source);
      }
      for (const auto& module : modulePaths) {
        const auto equals = module.find('=');
        if (equals == std::string::npos || equals == 0 || equals + 1 == module.size()) {
          std::fprintf(stderr, "toolhostctl: --module takes NAME=FILE, not %s\n", module.c_str());
          return kExitUsage;
        }
        std::string code;
        if (!readText(module.substr(equals + 1), code, error)) {
          std::fprintf(stderr, "toolhostctl: %s\n", error.c_str());
          return kExitUsage;
        }
        json::value& modules = execution.as_object()["modules"];
        if (!modules.is_object()) modules = json::object{};
        modules.as_object()[module.substr(0, equals)] = json::string(code);
      }
    }
    if (replace && !activate) {
      std::fprintf(stderr, "toolhostctl: --replace goes with --activate\n");
      return kExitUsage;
    }
    json::object params{{"manifest", std::move(manifest)}};
    if (!activate) return callAndPrint(socket, "tools.install", params, asPretty, timeout);
    auto client = cli::Client::connect(socket);
    if (!client) {
      std::fprintf(stderr, "toolhostctl: %s\n", client.error().detail.c_str());
      return kExitConnect;
    }
    // Installed, then bound: each answer as the method gives it, the second under "activated".
    auto installed = client->call("tools.install", params, timeout);
    if (!installed) {
      std::fprintf(stderr, "toolhostctl: %s\n", installed.error().detail.c_str());
      return kExitConnect;
    }
    if (const auto* failed = installed->if_contains("error")) {
      print(*failed, asPretty);
      std::fprintf(stderr, "toolhostctl: %s\n", cli::errorDetail(*installed).c_str());
      return kExitRpcError;
    }
    json::object result = installed->at("result").as_object();
    json::object binding{{"name", result.at("name")}, {"revision", result.at("revision")}};
    if (replace) binding["replace"] = true;
    auto activated = client->call("tools.activate", binding, timeout);
    if (!activated) {
      std::fprintf(stderr, "toolhostctl: installed %s, but: %s\n",
                   std::string(result.at("revision").as_string()).c_str(),
                   activated.error().detail.c_str());
      return kExitConnect;
    }
    if (const auto* failed = activated->if_contains("error")) {
      print(*failed, asPretty);
      std::fprintf(stderr, "toolhostctl: installed %s, but not activated: %s\n",
                   std::string(result.at("revision").as_string()).c_str(),
                   cli::errorDetail(*activated).c_str());
      return kExitRpcError;
    }
    result["activated"] = activated->at("result");
    print(result, asPretty);
    return kExitResult;
  }
  if (*approve) return cli::runApprove(socket);
  if (*popupHost) return cli::runPopupHost(socket);
  if (*policy) {
    json::object key{
        {"toolRevision", revision}, {"action", action}, {"target", target}, {"access", access}};
    if (*policyList) {
      json::object params;
      if (!revision.empty()) params["toolRevision"] = revision;
      return callAndPrint(socket, "policy.list", params, asPretty, timeout);
    }
    if (*policySet) {
      key["verdict"] = verdict;
      key["scope"] = scope;
      return callAndPrint(socket, "policy.set", key, asPretty, timeout);
    }
    if (*policyRevoke) return callAndPrint(socket, "policy.revoke", key, asPretty, timeout);
    if (*policyCheck) return callAndPrint(socket, "policy.check", key, asPretty, timeout);
    if (*policyReset) {
      json::object params;
      if (!revision.empty()) params["toolRevision"] = revision;
      return callAndPrint(socket, "policy.reset", params, asPretty, timeout);
    }
    return kExitUsage;
  }
  if (*secrets) {
    if (*secretsList) {
      json::object params;
      if (!secretTool.empty()) params["tool"] = secretTool;
      return callAndPrint(socket, "secrets.list", params, asPretty, timeout);
    }
    json::object params{{"tool", secretTool}, {"name", secretName}};
    if (!secretRevision.empty()) params["revision"] = secretRevision;
    if (*secretsDelete) return callAndPrint(socket, "secrets.delete", params, asPretty, timeout);
    if (!secretsSet->remaining().empty()) {
      std::fprintf(stderr,
                   "toolhostctl: secrets set takes TOOL NAME and options only; the value is never "
                   "taken from the command line (ps and shell histories would show it): pipe it "
                   "on stdin, or run it on a terminal and type it at the prompt\n");
      return kExitUsage;
    }
    json::array origins;
    for (const auto& origin : secretOrigins) origins.emplace_back(origin);
    params["origins"] = std::move(origins);
    if (secretCarry) params["carry"] = true;
    if (secretAllowBody) params["allowBody"] = true;
    std::string value, error;
    if (!cli::readSecretValue("Value of " + secretName + " for " + secretTool + ": ", value,
                              error)) {
      std::fprintf(stderr, "toolhostctl: %s\n", error.c_str());
      return kExitUsage;
    }
    params["value"] = json::string(value);
    cli::wipeString(value);
    const int status = callAndPrint(socket, "secrets.set", params, asPretty, timeout);
    if (auto* stored = params.if_contains("value"); stored && stored->is_string()) {
      json::string& text = stored->get_string();
      if (!text.empty()) explicit_bzero(text.data(), text.size());
    }
    return status;
  }
  if (*auditCommand) {
    json::object params{{"limit", auditLimit}};
    if (!revision.empty()) params["toolRevision"] = revision;
    return callAndPrint(socket, "audit.tail", params, asPretty, timeout);
  }
  if (*call) {
    json::value params = nullptr;
    if (paramsText == "-") {
      paramsText.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    }
    if (!paramsText.empty()) {
      auto parsed = protocol::parseJson(paramsText);
      if (!parsed) {
        std::fprintf(stderr, "toolhostctl: PARAMS_JSON is not valid JSON: %s\n",
                     parsed.error().detail.c_str());
        return kExitUsage;
      }
      if (!parsed->is_object() && !parsed->is_array()) {
        std::fprintf(stderr, "toolhostctl: PARAMS_JSON must be a JSON object (or array)\n");
        return kExitUsage;
      }
      params = std::move(*parsed);
    }
    // Tool names never hold '.' or '$'; method names mostly do.
    const bool mayBeTool = method.find_first_of(".$") == std::string::npos;
    return callAndPrint(socket, method, params, asPretty, timeout, mayBeTool);
  }
  return kExitUsage;
}
