#include "protocol/jsonrpc.h"

#include "protocol/json_parse.h"
#include "protocol/json_text.h"

namespace toolhost::protocol {
namespace json = boost::json;

std::string_view standardMessage(int code) {
  switch (code) {
    case rpc_error::kParseError: return "Parse error";
    case rpc_error::kInvalidRequest: return "Invalid Request";
    case rpc_error::kMethodNotFound: return "Method not found";
    case rpc_error::kInvalidParams: return "Invalid params";
    case rpc_error::kInternalError: return "Internal error";
    default: return "Server error";
  }
}

RpcError makeError(int code, std::string kind, std::string detail) {
  return RpcError{code, std::string(standardMessage(code)), std::move(kind), std::move(detail)};
}

namespace {

InvalidEntry invalid(json::value id, std::string detail) {
  return InvalidEntry{std::move(id), makeError(rpc_error::kInvalidRequest, "invalid-request",
                                               std::move(detail))};
}

bool validIdType(const json::value& id) {
  return id.is_string() || id.is_int64() || id.is_uint64() || id.is_double() || id.is_null();
}

}  // namespace

Entry decodeEntry(json::value&& value) {
  auto* object = value.if_object();
  if (object == nullptr) return invalid(nullptr, "a request must be a JSON object");

  // The id is read first so that an otherwise invalid request is answered under its own id.
  std::optional<json::value> id;
  if (const auto* found = object->if_contains("id")) {
    if (!validIdType(*found)) {
      return invalid(nullptr, "\"id\" must be a string, a number or null");
    }
    // The parser keeps every integer within 64 bits as one; an integral double was written
    // beyond them, and its answer could not carry it back exactly, so no client would find it.
    if (found->is_double() && std::trunc(found->get_double()) == found->get_double()) {
      return invalid(nullptr,
                     "\"id\": an integer id must fit in 64 bits (an answer carries its id back "
                     "exactly); use a string for larger ones");
    }
    id = *found;
  }
  json::value answerId = id ? *id : json::value(nullptr);

  const auto* version = object->if_contains("jsonrpc");
  if (version == nullptr) return invalid(answerId, "\"jsonrpc\" is missing; it must be \"2.0\"");
  if (!version->is_string() || version->get_string() != "2.0") {
    return invalid(answerId, "\"jsonrpc\" must be exactly \"2.0\"");
  }
  const auto* method = object->if_contains("method");
  if (method == nullptr) return invalid(answerId, "\"method\" is missing");
  if (!method->is_string()) return invalid(answerId, "\"method\" must be a string");

  json::value params = nullptr;
  if (auto* found = object->if_contains("params")) {
    if (!found->is_object() && !found->is_array()) {
      return invalid(answerId, "\"params\" must be an object or an array when present");
    }
    params = std::move(*found);  // a request's params may be large: never copied
  }
  return Request{std::move(id), std::string(method->get_string()), std::move(params)};
}

boost::system::result<Incoming, RpcError> decodeMessage(std::string_view line,
                                                         const WireLimits& limits) {
  auto parsed = parseJson(line, JsonParseLimits{limits.maxDepth});
  if (!parsed) {
    const auto& failure = parsed.error();
    switch (failure.kind) {
      case JsonParseError::Kind::tooDeep:
      case JsonParseError::Kind::tooManyValues:
        return makeError(rpc_error::kInvalidRequest, "limit-exceeded", failure.detail);
      case JsonParseError::Kind::duplicateKey:
      case JsonParseError::Kind::numberOutOfRange:
      case JsonParseError::Kind::syntax:
        return makeError(rpc_error::kParseError, "parse-error", failure.detail);
    }
  }
  Incoming incoming;
  if (auto* array = parsed->if_array()) {
    if (array->empty()) {
      return makeError(rpc_error::kInvalidRequest, "invalid-request",
                       "an empty batch is not a request");
    }
    if (array->size() > limits.maxBatch) {
      return makeError(rpc_error::kInvalidRequest, "limit-exceeded",
                       "a batch holds " + std::to_string(array->size()) +
                           " entries; the limit is " + std::to_string(limits.maxBatch));
    }
    incoming.batch = true;
    incoming.entries.reserve(array->size());
    for (auto& item : *array) incoming.entries.push_back(decodeEntry(std::move(item)));
    return incoming;
  }
  incoming.entries.push_back(decodeEntry(std::move(*parsed)));
  return incoming;
}

json::object resultResponse(const json::value& id, json::value result) {
  json::object response;
  response["jsonrpc"] = "2.0";
  response["id"] = id;
  response["result"] = std::move(result);
  return response;
}

json::object errorResponse(const json::value& id, const RpcError& error) {
  json::object data = error.extra;
  if (!error.kind.empty()) data["kind"] = error.kind;
  if (!error.detail.empty()) data["detail"] = error.detail;
  json::object body;
  body["code"] = error.code;
  body["message"] = error.message.empty() ? std::string(standardMessage(error.code)) : error.message;
  if (!data.empty()) body["data"] = std::move(data);
  json::object response;
  response["jsonrpc"] = "2.0";
  response["id"] = id;
  response["error"] = std::move(body);
  return response;
}

json::object notification(std::string_view method, json::value params) {
  json::object message;
  message["jsonrpc"] = "2.0";
  message["method"] = method;
  if (!params.is_null()) message["params"] = std::move(params);
  return message;
}

namespace {

// An integer id JavaScript cannot hold exactly (beyond 2^53), which writeJson would print the way
// JavaScript does, rounded.
bool hasInexactId(const json::object& message) {
  constexpr std::int64_t kExact = std::int64_t{1} << 53;
  const auto* id = message.if_contains("id");
  if (id == nullptr) return false;
  if (id->is_int64()) return id->get_int64() >= kExact || id->get_int64() <= -kExact;
  return id->is_uint64() && id->get_uint64() >= static_cast<std::uint64_t>(kExact);
}

// A message as writeJson writes it, but its id exactly as the request had it: an answer's id
// must equal the request's.
void appendMessage(std::string& out, const json::object& message) {
  if (!hasInexactId(message)) {
    appendJson(out, message);
    return;
  }
  out.push_back('{');
  bool first = true;
  for (const auto& member : message) {
    if (!first) out.push_back(',');
    first = false;
    appendJson(out, json::value(json::string(member.key())));
    out.push_back(':');
    const json::value& value = member.value();
    if (member.key() == "id") {
      out +=
          value.is_int64() ? std::to_string(value.get_int64()) : std::to_string(value.get_uint64());
    } else {
      appendJson(out, value);
    }
  }
  out.push_back('}');
}

}  // namespace

std::string encodeLine(const json::value& message) {
  std::string out;
  if (const auto* object = message.if_object()) {
    appendMessage(out, *object);
  } else if (const auto* batch = message.if_array()) {
    out.push_back('[');
    for (std::size_t i = 0; i < batch->size(); ++i) {
      if (i != 0) out.push_back(',');
      if (const auto* entry = (*batch)[i].if_object()) {
        appendMessage(out, *entry);
      } else {
        appendJson(out, (*batch)[i]);
      }
    }
    out.push_back(']');
  } else {
    appendJson(out, message);
  }
  out.push_back('\n');
  return out;
}

std::string encodeLine(const json::object& message) {
  std::string out;
  appendMessage(out, message);
  out.push_back('\n');
  return out;
}

}  // namespace toolhost::protocol
