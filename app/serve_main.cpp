// atelier-serve: the HTTP API (app/server) over the queue of a data dir.
// `atelier serve` executes this program with its own, already checked,
// arguments ("atelier-serve serve ..."; commands.h says why it is apart).
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "commands/commands.h"
#include "commands/serve.h"

namespace atelier::app {

namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_stop_signal(int) { g_stop = true; }

int run_serve(const ServeOptions& o) {
  if (!o.server.default_model.empty())  // a typo in -m is told now, not at the first request
    if (auto r = resolve_model(o.server.default_model, o.server.store_dir); !r.ok()) return fail(r.status());
  EngineConfig c;
  c.data_dir = o.data_dir;
  c.store_dir = o.server.store_dir;
  c.threads = o.threads;
  c.max_batch = o.max_batch;
  c.kv_memory_bytes = o.kv_mib << 20;
  c.kv_type = o.kv_type;
  c.devices = {o.device.device};
  c.precision = o.device.precision;
  c.gpu_memory_fraction = o.device.gpu_memory_fraction;
  auto engine = Engine::open(c);
  if (!engine.ok()) return fail(engine.status());
  std::fprintf(stderr, "atelier serve: %s\n", device_line(engine.value()->device()).c_str());
  server::ApiServerOptions so = o.server;
  // Where unnamed images go (the engine's DATA_DIR/images), and the only folder a client names files in.
  so.output_dir = (std::filesystem::path(o.data_dir) / "images").string();
  std::error_code ec;
  std::filesystem::create_directories(so.output_dir, ec);
  if (ec) return fail(Status::error(StatusCode::Io, so.output_dir + ": cannot create the output folder: " + ec.message()));
  for (const auto& dir : so.models_dirs)
    if (!std::filesystem::is_directory(dir, ec))
      return fail(Status::error(StatusCode::NotFound, "--models-dir " + dir + ": no such folder"));
  server::ApiServer api(*engine.value(), so);
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

}  // namespace atelier::app

int main(int argc, char** argv) {
  CLI::App app{"The Atelier HTTP API (run it as `atelier serve`)", "atelier-serve"};
  app.require_subcommand(1, 1);
  app.set_version_flag("--version", "atelier-serve " ATELIER_VERSION);
  int exit_code = 0;
  atelier::app::add_serve_commands(app, exit_code, argv, atelier::app::run_serve);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "atelier serve: error: %s (see atelier serve --help)\n", e.what());
    return 2;
  }
  return exit_code;
}
