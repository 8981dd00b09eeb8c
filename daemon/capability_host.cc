#include "daemon/capability_host.h"

namespace toolhost::daemon {
namespace json = boost::json;

boost::system::result<json::object, std::string> DaemonCapabilityHost::resolveInvocation(
    const registry::ToolRevision&, const std::string& name) {
  auto tool = registry_.getActive(name);
  if (!tool) return std::string("no active tool named ") + name.substr(0, 80);
  // Only opaque identities: no manifest, no settings values.
  json::object answer{{"toolRevision", (*tool)->revision}};
  if (auto settings = registry_.trySettingsRevision(name, (*tool)->revision)) {
    answer["settingsRevision"] = *settings;
  }
  return answer;
}

boost::system::result<json::array, std::string> DaemonCapabilityHost::createSubtasks(
    const registry::ToolRevision&, const json::value& drafts, const json::object& invocation) {
  if (!drafts.is_array()) return std::string("drafts must be an array of task drafts");
  std::optional<std::string> parentId;
  if (const auto* task = invocation.if_contains("taskId"); task && task->is_string()) {
    parentId = std::string(task->get_string());
  }
  auto compiled = tasks_.compile(drafts.as_array(), parentId);
  if (!compiled) return compiled.error().detail;
  return std::move(*compiled);
}

}  // namespace toolhost::daemon
