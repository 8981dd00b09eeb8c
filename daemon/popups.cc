#include "daemon/popups.h"

#include "daemon/errors.h"
#include "daemon/session.h"
#include "protocol/jsonrpc.h"

#include <spdlog/spdlog.h>
#include <boost/json/parse.hpp>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>

namespace toolhost::daemon {
namespace asio = boost::asio;
namespace json = boost::json;

namespace {

std::string randomPrefix() {
  std::random_device device;
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "%08x", static_cast<unsigned>(device()));
  return std::string("popup-") + buffer;
}

void notifyHost(const PopupSink& sink, std::string_view method, json::object params) {
  if (!sink) return;
  try {
    sink(method, std::move(params));
  } catch (const std::exception& error) {
    spdlog::warn("popup: a host could not be notified: {}", error.what());
  }
}

// A host's error code, if it is a plain word ("dismissed", "blocked-by-user"); else the generic
// one.
std::string hostErrorCode(const json::value* code) {
  if (code == nullptr || !code->is_string()) return "popup-failed";
  std::string_view text = code->get_string();
  const bool plain = !text.empty() && text.size() <= 64 && text.front() >= 'a' &&
                     text.front() <= 'z' && std::all_of(text.begin(), text.end(), [](char c) {
                       return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
                     });
  return plain ? std::string(text) : "popup-failed";
}

}  // namespace

PopupHosts::PopupHosts() : prefix_(randomPrefix()) {}

PopupHosts::~PopupHosts() = default;

void PopupHosts::addHost(PopupHostId id, std::string label, PopupSink sink) {
  std::lock_guard lock(mutex_);
  hosts_[id] = Host{std::move(label), std::move(sink), nextOrder_++};
}

void PopupHosts::removeHost(PopupHostId id) {
  std::vector<PopupCompletion> closed;
  {
    std::lock_guard lock(mutex_);
    if (hosts_.erase(id) == 0) return;
    for (auto it = popups_.begin(); it != popups_.end();) {
      if (it->second.host == id) {
        closed.push_back(std::move(it->second.done));
        it = popups_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& done : closed) {
    done(runtime::HostOpFailure{
        "popup-closed",
        "the popup host closed its connection before the popup was answered; try again once a "
        "host is connected"});
  }
}

bool PopupHosts::isHost(PopupHostId id) const {
  std::lock_guard lock(mutex_);
  return hosts_.contains(id);
}

std::size_t PopupHosts::hostCount() const {
  std::lock_guard lock(mutex_);
  return hosts_.size();
}

std::optional<std::string> PopupHosts::open(json::object params, PopupCompletion done) {
  PopupSink sink;
  std::string id;
  {
    std::lock_guard lock(mutex_);
    auto chosen = std::max_element(hosts_.begin(), hosts_.end(), [](const auto& a, const auto& b) {
      return a.second.order < b.second.order;
    });
    if (chosen == hosts_.end()) return std::nullopt;
    id = prefix_ + "-" + std::to_string(nextPopup_++);
    popups_.emplace(id, Popup{chosen->first, std::move(done)});
    sink = chosen->second.sink;
    spdlog::info("popup: {} opened on host conn={} ({})", id, chosen->first, chosen->second.label);
  }
  params["popupId"] = id;
  notifyHost(sink, "popup.open", std::move(params));
  return id;
}

void PopupHosts::close(const std::string& popupId) {
  end(popupId, "the tool's call ended",
      runtime::HostOpFailure{"cancelled", "the call ended before the popup was answered"});
}

void PopupHosts::expire(const std::string& popupId, std::chrono::milliseconds timeout) {
  const std::string limit = std::to_string(timeout.count()) + " ms ([popup] timeout_ms)";
  end(popupId, "not answered within " + limit,
      runtime::HostOpFailure{"popup-timeout", "the popup host did not answer the popup within " +
                                                  limit + "; it was closed"});
}

void PopupHosts::end(const std::string& popupId, std::string reason,
                     runtime::HostOpFailure failure) {
  PopupCompletion done;
  PopupSink sink;
  {
    std::lock_guard lock(mutex_);
    auto found = popups_.find(popupId);
    if (found == popups_.end()) return;
    done = std::move(found->second.done);
    if (auto host = hosts_.find(found->second.host); host != hosts_.end()) sink = host->second.sink;
    popups_.erase(found);
  }
  notifyHost(sink, "popup.close",
             json::object{{"popupId", popupId}, {"reason", std::move(reason)}});
  done(std::move(failure));
}

boost::system::result<void, PopupAnswerError> PopupHosts::answer(PopupHostId host,
                                                                 const std::string& popupId,
                                                                 runtime::HostOpResult result) {
  PopupCompletion done;
  {
    std::lock_guard lock(mutex_);
    if (!hosts_.contains(host)) {
      return PopupAnswerError{PopupAnswerErrc::notSubscribed,
                              "this connection is not a popup host; call popup.subscribe first"};
    }
    auto found = popups_.find(popupId);
    if (found == popups_.end() || found->second.host != host) {
      return PopupAnswerError{PopupAnswerErrc::notFound,
                              "no popup " + popupId.substr(0, 80) +
                                  " is open on this connection: it was answered, closed, or sent "
                                  "to another host"};
    }
    done = std::move(found->second.done);
    popups_.erase(found);
  }
  done(std::move(result));
  return {};
}

void registerPopupMethods(MethodTable& methods, PopupHosts& popups) {
  methods.add(MethodSpec{
      "popup.subscribe",
      "Makes this connection a popup host until it closes: the most recently subscribed host "
      "receives a popup.open notification {popupId, tool: {name, revision}, kind: custom-html | "
      "origin, html | url} for every authorized ctx.popup() and answers it with popup.result; "
      "popup.close {popupId, reason} withdraws a popup whose call ended. The daemon never opens "
      "windows itself. Returns {subscribed: true, hosts}.",
      RoleSet{Role::host}, json::parse(R"({"type":"object","additionalProperties":false})"),
      json::parse(R"({"type":"object","required":["subscribed","hosts"]})"),
      [&popups](CallContext& context, json::object) -> asio::awaitable<MethodResult> {
        const PopupHostId id = context.connectionId;
        const bool already = popups.isHost(id);
        std::weak_ptr<Session> weak = context.session;
        popups.addHost(
            id,
            "host uid " + std::to_string(context.peer.uid) + " pid " +
                std::to_string(context.peer.pid),
            [weak](std::string_view method, json::object params) {
              if (auto session = weak.lock()) {
                session->notify(protocol::notification(method, json::value(std::move(params))));
              }
            });
        if (!already && context.session) {
          context.session->onClose([&popups, id] { popups.removeHost(id); });
          context.session->servesOthers();
        }
        if (!already) spdlog::info("conn={} subscribed as a popup host", id);
        co_return json::value(json::object{{"subscribed", true}, {"hosts", popups.hostCount()}});
      }});

  methods.add(MethodSpec{
      "popup.result",
      "Answers a popup this connection received (popup.open): result (any JSON, given to the "
      "tool) or error {code?, message} (the tool's promise rejects with that code, default "
      "popup-failed).",
      RoleSet{Role::host},
      json::parse(R"({"type":"object","additionalProperties":false,"required":["popupId"],
        "properties":{"popupId":{"type":"string","minLength":1,"maxLength":200},
                      "result":{},
                      "error":{"type":"object","required":["message"],"properties":{
                        "code":{"type":"string","maxLength":64},
                        "message":{"type":"string","maxLength":2000}}}}})"),
      json::parse(R"({"type":"object","required":["popupId","accepted"]})"),
      [&popups](CallContext& context, json::object params) -> asio::awaitable<MethodResult> {
        const std::string popupId(params.at("popupId").as_string());
        const auto* result = params.if_contains("result");
        const auto* error = params.if_contains("error");
        if (result != nullptr && error != nullptr) {
          co_return invalidParams("params: give result or error, not both");
        }
        runtime::HostOpResult outcome = result != nullptr ? *result : json::value(nullptr);
        if (error != nullptr) {
          const auto& fields = error->as_object();
          outcome = runtime::HostOpFailure{hostErrorCode(fields.if_contains("code")),
                                           std::string(fields.at("message").as_string())};
        }
        auto answered = popups.answer(context.connectionId, popupId, std::move(outcome));
        if (!answered) {
          switch (answered.error().code) {
            case PopupAnswerErrc::notSubscribed:
              co_return appError(app_error::kUnauthorized, "not-subscribed",
                                 answered.error().detail);
            case PopupAnswerErrc::notFound:
              co_return appError(app_error::kNotFound, "not-found", answered.error().detail);
          }
        }
        co_return json::value(json::object{{"popupId", popupId}, {"accepted", true}});
      }});
}

}  // namespace toolhost::daemon
