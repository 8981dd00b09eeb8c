// Popup hosts: the clients that open windows for tools. A connection with the host role calls
// popup.subscribe and becomes a popup host until it closes; an authorized ctx.popup() reaches ONE
// host, the most recently subscribed one still connected, as a popup.open notification, and the
// host answers with popup.result. The daemon never opens a window itself.
// Thread-safe: any thread may open, answer, close, add or remove; sinks and completions are
// called without the lock held.
#pragma once

#include "daemon/method_table.h"
#include "runtime/capability_host.h"

#include <boost/json/object.hpp>
#include <boost/system/result.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace toolhost::daemon {

// What a host is sent: popup.open {popupId, tool: {name, revision}, kind, html | url} and
// popup.close {popupId, reason}. The sink must not block (Session::notify posts).
using PopupSink = std::function<void(std::string_view method, boost::json::object params)>;
// How a popup ended: the host's result, or a failure ("popup-closed" when its host went away,
// "cancelled" when the tool's call ended, or the code the host answered with).
using PopupCompletion = std::function<void(runtime::HostOpResult)>;
using PopupHostId = std::uint64_t;  // the host's connection id

enum class PopupAnswerErrc {
  notSubscribed,  // the caller is not a popup host
  notFound,       // no such popup is open on this host (finished, closed, or never sent here)
};
struct PopupAnswerError {
  PopupAnswerErrc code;
  std::string detail;
};

class PopupHosts {
 public:
  PopupHosts();
  ~PopupHosts();
  PopupHosts(const PopupHosts&) = delete;
  PopupHosts& operator=(const PopupHosts&) = delete;

  // Registers (or re-registers, moving it to the front) a host. `label` says who it is in logs.
  void addHost(PopupHostId id, std::string label, PopupSink sink);
  // The host's connection closed: the popups it had open fail with "popup-closed".
  void removeHost(PopupHostId id);
  bool isHost(PopupHostId id) const;
  std::size_t hostCount() const;

  // Sends popup.open with `params` (tool, kind, html or url; the popupId is added) to the most
  // recently subscribed host. `done` runs exactly once, later, with how the popup ended. Returns
  // the popup id, or nullopt (and never runs `done`) when no host is subscribed.
  std::optional<std::string> open(boost::json::object params, PopupCompletion done);
  // The tool's call ended first: the host is told (popup.close) and the popup fails as cancelled.
  // Nothing happens if it already ended.
  void close(const std::string& popupId);
  // The host did not answer within `timeout`: it is told (popup.close) and the popup fails with
  // popup-timeout. Nothing happens if it already ended.
  void expire(const std::string& popupId, std::chrono::milliseconds timeout);
  // popup.result from host `host` for one of its popups.
  boost::system::result<void, PopupAnswerError> answer(PopupHostId host, const std::string& popupId,
                                                       runtime::HostOpResult result);

 private:
  struct Host {
    std::string label;
    PopupSink sink;
    std::uint64_t order = 0;  // when it subscribed; the highest is chosen
  };
  struct Popup {
    PopupHostId host = 0;
    PopupCompletion done;
  };

  // Ends an open popup without its host's answer: popup.close {popupId, reason} to the host, then
  // `failure` to the tool.
  void end(const std::string& popupId, std::string reason, runtime::HostOpFailure failure);

  mutable std::mutex mutex_;
  std::map<PopupHostId, Host> hosts_;
  std::map<std::string, Popup, std::less<>> popups_;  // open popups by id
  std::uint64_t nextOrder_ = 1;
  std::uint64_t nextPopup_ = 1;
  std::string prefix_;  // random per daemon run, so ids of another run never match
};

// popup.subscribe and popup.result (role host). `popups` must outlive the server.
void registerPopupMethods(MethodTable& methods, PopupHosts& popups);

}  // namespace toolhost::daemon
