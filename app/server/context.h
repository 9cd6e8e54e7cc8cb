// What every route file shares: the engine, the options, the job event
// router, request-body field readers that name the field on a wrong type,
// and errors in OpenAI's shape. Internal to app/server.
#pragma once

#include <atelier/engine.h>
#include <atelier/models.h>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

#include "server/api_server.h"
#include "server/job_events.h"

namespace atelier::server {

using nlohmann::json;

// Thrown inside a handler, turned into {"error": {...}} with STATUS by the
// route wrapper: exceptions never leave the server.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = "", std::string type = "",
           std::string code = "")
      : std::runtime_error(message), status(status), param(std::move(param)), type(std::move(type)), code(std::move(code)) {}
  int status;
  std::string param, type, code;
};
ApiError bad_field(const std::string& field, const std::string& what);  // 400 naming the field
ApiError from_status(const Status& status, const std::string& param = "");

json error_body(int status, const std::string& message, const std::string& param = "", std::string type = "",
                std::string code = "");
void send_json(httplib::Response& res, const json& body, int status = 200);

json parse_body(const httplib::Request& req);  // 400 when not a JSON object

// Optional typed fields: absent or null gives nullopt; a wrong type or a value
// out of [lo, hi] is a 400 naming the field.
std::optional<double> opt_number(const json& body, const char* field, double lo, double hi);
std::optional<int64_t> opt_int(const json& body, const char* field, int64_t lo, int64_t hi);
std::optional<bool> opt_bool(const json& body, const char* field);
std::optional<std::string> opt_string(const json& body, const char* field);
// A string or a list of strings (OpenAI's stop, prompt).
std::vector<std::string> string_or_list(const json& body, const char* field);

struct Connection;  // connections.cpp

// The connection of the request this thread is handling (cpp-httplib 0.11
// hands handlers no socket; the connection layer knows it, connections.h), so
// a handler that waits on a job notices a client that went away and cancels it.
class ClientWatch {
 public:
  explicit ClientWatch(const httplib::Request& req);
  // The client closed or reset the connection (one that only half-closed
  // after its request is still there), or the server is stopping.
  bool gone() const;

 private:
  std::shared_ptr<Connection> conn_;
};

int64_t unix_seconds();

struct ModelEntry {
  ResolvedModel resolved;
  ModelInfo info;          // text models
  std::string fingerprint;  // "fp_" + 12 hex: sha256 of the model digest and the engine build
};

struct Context {
  Engine& engine;
  ApiServerOptions options;
  JobEvents events;
  std::atomic<bool> ready{false};  // /health: the default model is loaded
  std::atomic<int64_t> requests{0}, errors{0};
  std::mutex mu;
  std::map<std::string, ModelEntry> models;  // by reference
  std::map<std::string, std::shared_ptr<Vocabulary>> vocabularies;  // by model file
  std::string sd_model;  // A1111 options' sd_model_checkpoint ("" = the first image model)

  Context(Engine& e, ApiServerOptions o) : engine(e), options(std::move(o)), events(e) {}
  // The request's model (or the default), resolved and described; 404 in OpenAI's shape when unknown.
  // A client's reference must name what the server shares (shared_model_ref): 403 naming FIELD otherwise.
  ModelEntry model(const std::string& ref, const std::string& field = "model");
  std::shared_ptr<Vocabulary> vocabulary(const ModelEntry& model);  // 400 when it has none

};

// ---------------------------------------------------------------- access (access.cpp)

// What a client may name. Each throws a 403 that says which flag allows more,
// decided from the name alone (so a 403 never tells whether a file exists),
// and a 400 for a malformed one.
//
// A model: a store reference as it is, or a file under --models-dir (a
// relative path there) or the store's blobs, as an absolute path.
std::string shared_model_ref(const Context& ctx, const std::string& field, const std::string& ref);
// A file a model needs (tokenizer, preview decoder): the same folders, no store references.
std::string shared_model_file(const Context& ctx, const std::string& field, const std::string& path);
// A new file in the output folder: a name there that exists in no form yet
// (409), for the COUNT images of a request (numbered as the engine numbers them).
std::string output_file(const Context& ctx, const std::string& field, const std::string& name, int count);
// A picture already in the output folder (404 when it is not there).
std::string output_picture(const Context& ctx, const std::string& field, const std::string& name);

// The Host header names this server (bound to HOST:PORT) or an --allow-host name.
bool host_allowed(const ApiServerOptions& options, int port, const std::string& host_header);
// A request body, when there is one, says it is JSON.
bool json_body_or_none(const httplib::Request& req);
// KEY and GIVEN are the same secret, compared in time that depends on neither.
bool same_secret(const std::string& key, const std::string& given);

void add_openai_routes(httplib::Server& http, Context& ctx);
void add_llama_routes(httplib::Server& http, Context& ctx);
void add_native_routes(httplib::Server& http, Context& ctx);
void add_sdapi_routes(httplib::Server& http, Context& ctx);

// OpenAI's messages (content a string or a list of text parts); 400 naming the field otherwise.
std::vector<ChatMessage> chat_messages(const json& body);

std::string base64_encode(const std::string& bytes);
std::string base64_decode(const std::string& text);  // "" when malformed
std::string sse_line(const json& j);                  // "data: {...}\n\n"
json job_json(const JobInfo& job);                    // the native form of a job
std::string preview_png(const ImageProgress& progress);  // PNG bytes of a preview ("" when none)

// Wraps a handler: ApiError and any other exception become an error response.
httplib::Server::Handler guarded(Context& ctx, std::function<void(const httplib::Request&, httplib::Response&)> fn);

}  // namespace atelier::server
