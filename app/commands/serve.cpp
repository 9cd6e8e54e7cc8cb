// `atelier serve`: the local HTTP API (app/server) over the queue of a data dir.
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "commands/commands.h"
#include "commands/output.h"
#include "server/api_server.h"

namespace atelier::app {

namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_stop_signal(int) { g_stop = true; }

struct ServeOptions {
  server::ApiServerOptions server;
  std::string data_dir = default_data_dir();
  int threads = 0;
  int max_batch = 32;
  int64_t kv_mib = 1024;
};

int run_serve(ServeOptions o) {
  if (!o.server.default_model.empty())  // a typo in -m is told now, not at the first request
    if (auto r = resolve_model(o.server.default_model, o.server.store_dir); !r.ok()) return fail(r.status());
  EngineConfig c;
  c.data_dir = o.data_dir;
  c.store_dir = o.server.store_dir;
  c.threads = o.threads;
  c.max_batch = o.max_batch;
  c.kv_memory_bytes = o.kv_mib << 20;
  auto engine = Engine::open(c);
  if (!engine.ok()) return fail(engine.status());
  server::ApiServer api(*engine.value(), o.server);
  if (Status s = api.start(); !s.ok()) return fail(s);
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  // One line on stdout (scripts read the port from it when --port 0).
  write_stdout("atelier serve: listening on " + api.address() + "\n");
  if (o.server.host != "127.0.0.1" && o.server.host != "localhost" && o.server.host != "::1")
    std::fprintf(stderr, "atelier serve: warning: listening on %s, not only this machine%s\n", o.server.host.c_str(),
                 o.server.api_key.empty() ? ", and without --api-key" : "");
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  api.stop();
  return 0;
}

}  // namespace

void add_serve_commands(CLI::App& root, int& exit_code) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = root.add_subcommand("serve", "Serve the OpenAI-, llama-server- and AUTOMATIC1111-compatible HTTP API over the queue");
  auto& s = o->server;
  cmd->add_option("--host", s.host, "Address to listen on (loopback unless told otherwise)")->capture_default_str();
  cmd->add_option("--port", s.port, "Port (0: any free one, printed on stdout)")->check(CLI::Range(0, 65535))->capture_default_str();
  cmd->add_option("--api-key", s.api_key, "Require 'Authorization: Bearer KEY' (or HTTP Basic with KEY as password)")
      ->envname("ATELIER_API_KEY");
  cmd->add_option("--cors", s.cors_origins, "Allow browser requests from this Origin (repeatable; * for any)");
  cmd->add_option("-m,--model", s.default_model, "Model for requests that name none (loaded at start; /health is 503 until then)");
  cmd->add_option("--store", s.store_dir, "Model store folder (default: $ATELIER_HOME, else $XDG_DATA_HOME/atelier, else ~/.local/share/atelier)");
  cmd->add_option("--data-dir", o->data_dir, "Queue and job database folder")->capture_default_str();
  cmd->add_option("--max-body-bytes", s.max_body_bytes, "Largest request body")->check(CLI::Range(int64_t{1024}, int64_t{1} << 34))->capture_default_str();
  cmd->add_option("--max-connections", s.max_connections, "Connections served at once (more wait)")->check(CLI::Range(1, 4096))->capture_default_str();
  cmd->add_option("--max-tokens", s.max_tokens, "Most new tokens a request may ask per choice")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--max-choices", s.max_choices, "Most choices (n x prompts) per request")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--max-image-pixels", s.max_image_pixels, "Largest width x height of an image")->check(CLI::Range(64, 1 << 26))->capture_default_str();
  cmd->add_option("--max-images", s.max_images, "Most images per request (batch_size x n_iter)")->check(CLI::Range(1, 1600))->capture_default_str();
  cmd->add_option("--threads", o->threads, "Engine threads (default: one per core)")->check(CLI::Range(1, 1024));
  cmd->add_option("--max-batch", o->max_batch, "Sequences decoded together per step")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--kv-mib", o->kv_mib, "KV cache budget per model, MiB")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->callback([o, &exit_code] { exit_code = run_serve(*o); });
}

}  // namespace atelier::app
