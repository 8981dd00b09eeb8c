// Shared by the end-to-end tests of mediated requests and of policy (fetch_test.cc,
// popup_test.cc, external_test.cc, policy_test.cc): a connection that keeps notifications while
// it waits for responses, a program approver, a popup host, tool manifests, and the [fetch]
// configuration that trusts the local HTTPS test server (its CA as extra_ca_file, 127.0.0.1
// opened with allow_private).
#pragma once

#include "tests/support/daemon_process.h"
#include "tests/support/https_test_server.h"

#include "protocol/json_text.h"
#include "protocol/jsonrpc.h"

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <catch2/catch.hpp>

#include <cctype>
#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>

namespace toolhost::testing::e2e {

namespace json = boost::json;

inline json::object resultOf(const json::object& response) {
  INFO(toolhost::protocol::encodeLine(response));
  REQUIRE(response.contains("result"));
  REQUIRE(response.at("result").is_object());
  return response.at("result").as_object();
}

inline std::int64_t errorCode(const json::object& response) {
  INFO(toolhost::protocol::encodeLine(response));
  REQUIRE(response.contains("error"));
  return response.at("error").at("code").as_int64();
}

inline std::string text(const json::value& value) {
  INFO(json::serialize(value));
  REQUIRE(value.is_string());
  return std::string(value.get_string());
}

// `text` with every byte but letters, digits and those in `keep` percent-encoded: a URL as a
// query parameter of a test server's route.
inline std::string percentEncoded(std::string_view text, std::string_view keep = "") {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : text) {
    if (std::isalnum(static_cast<unsigned char>(c)) || keep.find(c) != std::string_view::npos) {
      out += c;
    } else {
      out += '%';
      out += kHex[static_cast<unsigned char>(c) >> 4];
      out += kHex[static_cast<unsigned char>(c) & 0xF];
    }
  }
  return out;
}

// The [fetch] section that lets the daemon reach `server`.
inline std::string fetchConfig(const HttpsTestServer& server, std::string_view more = "") {
  return "[fetch]\nextra_ca_file = \"" + server.caFile().string() +
         "\"\nallow_private = [\"127.0.0.1/32\"]\n" + std::string(more);
}

// A sandboxed JavaScript tool with these capabilities (and limits, if any).
inline json::object jsTool(std::string_view name, std::string_view source,
                           json::object capabilities = {}, json::object limits = {}) {
  json::object manifest{
      {"name", name},
      {"description", "a tool of the mediation tests"},
      {"parameters", json::parse(R"({"type":"object"})")},
      {"execution",
       json::object{{"class", "sandboxed-code"}, {"runtime", "javascript"}, {"source", source}}},
      {"capabilities", std::move(capabilities)}};
  if (!limits.empty()) manifest["limits"] = std::move(limits);
  return manifest;
}

// A connection that sends requests without waiting and keeps the notifications it reads.
class Peer {
 public:
  explicit Peer(const std::filesystem::path& socket) : client_(socket) {}

  void send(const std::string& method, json::value params, json::value id) {
    json::object request{{"jsonrpc", "2.0"}, {"id", id}, {"method", method}};
    if (!params.is_null()) request["params"] = std::move(params);
    client_.send(toolhost::protocol::encodeLine(request));
  }
  void notify(const std::string& method, json::value params) {
    json::object message{{"jsonrpc", "2.0"}, {"method", method}, {"params", std::move(params)}};
    client_.send(toolhost::protocol::encodeLine(message));
  }
  // The response to `id`; notifications and other responses read meanwhile are kept.
  json::object response(std::int64_t id,
                        std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    if (auto kept = responses_.find(id); kept != responses_.end()) {
      auto message = std::move(kept->second);
      responses_.erase(kept);
      return message;
    }
    for (;;) {
      auto message = client_.readJson(timeout).as_object();
      if (const auto* got = message.if_contains("id")) {
        if (*got == id) return message;
        REQUIRE(got->is_int64());
        responses_.emplace(got->get_int64(), std::move(message));
        continue;
      }
      notifications_.push_back(std::move(message));
    }
  }
  // Whether the response to `id` was read already (and kept for response()).
  bool answered(std::int64_t id) const { return responses_.contains(id); }
  json::object call(const std::string& method, json::value params = nullptr) {
    std::int64_t id = nextId_++;
    send(method, std::move(params), id);
    return response(id);
  }
  // The next notification (kept or read now); fails the test if none comes.
  json::object notification(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    if (!notifications_.empty()) {
      auto first = std::move(notifications_.front());
      notifications_.pop_front();
      return first;
    }
    for (;;) {
      auto message = client_.readJson(timeout).as_object();
      if (const auto* got = message.if_contains("id"); got && got->is_int64()) {
        responses_.emplace(got->get_int64(), std::move(message));
        continue;
      }
      return message;
    }
  }
  // No notification has arrived before now: a ping's answer comes first (a connection's
  // messages are sent in order).
  void expectNoNotification() {
    CHECK(notifications_.empty());
    std::int64_t id = nextId_++;
    send("ping", nullptr, id);
    auto message = client_.readJson().as_object();
    INFO(toolhost::protocol::encodeLine(message));
    CHECK(message.contains("id"));
    notifications_.clear();
  }
  std::int64_t nextId() { return nextId_++; }

 private:
  RawClient client_;
  std::deque<json::object> notifications_;
  std::map<std::int64_t, json::object> responses_;
  std::int64_t nextId_ = 1000;
};

// Installs and activates `manifest`; returns the revision.
inline std::string deploy(Peer& admin, const json::object& manifest) {
  auto installed = resultOf(admin.call("tools.install", json::object{{"manifest", manifest}}));
  std::string revision = text(installed.at("revision"));
  resultOf(admin.call(
      "tools.activate",
      json::object{{"name", manifest.at("name")}, {"revision", revision}, {"replace", true}}));
  return revision;
}

// Decides ahead with policy.set.
inline void decideAhead(Peer& admin, const std::string& revision, std::string_view action,
                        const std::string& target, std::string_view access,
                        std::string_view verdict = "allow", std::string_view scope = "always") {
  auto set = resultOf(admin.call("policy.set", json::object{{"toolRevision", revision},
                                                            {"action", action},
                                                            {"target", target},
                                                            {"access", access},
                                                            {"verdict", verdict},
                                                            {"scope", scope}}));
  CHECK(set.at("requested") == true);
}

// A program approver: subscribed at construction; `pending` holds the prompts already waiting
// then.
class Approver : public Peer {
 public:
  explicit Approver(const std::filesystem::path& socket) : Peer(socket) {
    auto subscribed = resultOf(call("policy.subscribe"));
    CHECK(subscribed.at("subscribed") == true);
    pending = subscribed.at("pending").as_array();
  }
  json::object prompt() {
    auto message = notification();
    INFO(toolhost::protocol::encodeLine(message));
    REQUIRE(message.at("method") == "policy.prompt");
    return message.at("params").as_object();
  }
  json::object decide(const json::object& prompt, std::string_view verdict,
                      std::string_view scope) {
    return call(
        "policy.decide",
        json::object{{"promptId", prompt.at("promptId")}, {"verdict", verdict}, {"scope", scope}});
  }
  json::array pending;
};

// A program popup host: subscribed at construction.
class PopupHost : public Peer {
 public:
  explicit PopupHost(const std::filesystem::path& socket) : Peer(socket) {
    CHECK(resultOf(call("popup.subscribe")).at("subscribed") == true);
  }
  // The next popup.open's params.
  json::object opened() {
    auto message = notification();
    INFO(toolhost::protocol::encodeLine(message));
    REQUIRE(message.at("method") == "popup.open");
    return message.at("params").as_object();
  }
  json::object answer(const json::object& open, json::value result) {
    return call("popup.result",
                json::object{{"popupId", open.at("popupId")}, {"result", std::move(result)}});
  }
};

// tools.call by name, sent now, answered later (response(id)).
inline std::int64_t startCall(Peer& agent, std::string_view name, json::object arguments = {}) {
  auto id = agent.nextId();
  agent.send("tools.call", json::object{{"name", name}, {"arguments", std::move(arguments)}}, id);
  return id;
}

// The tool's result of a tools.call response.
inline json::value toolResult(const json::object& response) {
  return resultOf(response).at("result");
}

}  // namespace toolhost::testing::e2e
