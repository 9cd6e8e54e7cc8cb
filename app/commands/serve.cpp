// `atelier serve`'s flags. The server itself runs in atelier-serve
// (app/serve_main.cpp): atelier checks the flags, then executes that program
// with the same arguments (commands.h says why).
#include "commands/serve.h"

#include <CLI/CLI.hpp>
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "commands/commands.h"
#include "commands/request_options.h"

namespace atelier::app {

namespace {

// atelier-serve beside this program: the build tree's app/, or the bin/ it
// was installed to.
int exec_serve_program(char** argv) {
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    std::fprintf(stderr, "atelier serve: cannot find this program's folder (/proc/self/exe: %s)\n", std::strerror(errno));
    return 1;
  }
  self[n] = '\0';
  const std::string program = (std::filesystem::path(self).parent_path() / "atelier-serve").string();
  ::execv(program.c_str(), argv);
  std::fprintf(stderr,
               "atelier serve: cannot run %s (%s); it is built and installed beside atelier "
               "(cmake --build build --target atelier-serve)\n",
               program.c_str(), std::strerror(errno));
  return 1;
}

}  // namespace

void add_serve_commands(CLI::App& root, int& exit_code, char** argv, int (*run_here)(const ServeOptions&)) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = root.add_subcommand("serve", "Serve the OpenAI-, llama-server- and AUTOMATIC1111-compatible HTTP API over the queue");
  auto& s = o->server;
  cmd->add_option("--host", s.host, "Address to listen on (loopback unless told otherwise)")->capture_default_str();
  cmd->add_option("--port", s.port, "Port (0: any free one, printed on stdout)")->check(CLI::Range(0, 65535))->capture_default_str();
  cmd->add_option("--api-key", s.api_key, "Require 'Authorization: Bearer KEY' (or HTTP Basic with KEY as password)")
      ->envname("ATELIER_API_KEY");
  cmd->add_option("--cors", s.cors_origins, "Allow browser requests from this Origin (repeatable; * for any, without credentials)");
  cmd->add_option("--allow-host", s.allowed_hosts,
                  "Also answer requests whose Host header is NAME (repeatable; default: the --host address, localhost, 127.0.0.1, [::1])");
  cmd->add_option("--models-dir", s.models_dirs,
                  "Let clients name model files under this folder by path (repeatable; default: store references only)");
  cmd->add_option("-m,--model", s.default_model, "Model for requests that name none (loaded at start; /health is 503 until then)");
  cmd->add_option("--store", s.store_dir, "Model store folder (default: $ATELIER_HOME, else $XDG_DATA_HOME/atelier, else ~/.local/share/atelier)");
  cmd->add_option("--data-dir", o->data_dir, "Queue and job database folder")->capture_default_str();
  cmd->add_option("--max-body-bytes", s.max_body_bytes, "Largest request body, chunked ones included (413 before it is read)")->check(CLI::Range(int64_t{1024}, int64_t{1} << 34))->capture_default_str();
  cmd->add_option("--max-connections", s.max_connections,
                  "Connections open at once; at the cap the one idle or stalled longest is closed, and when all are busy a new one gets 503")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  cmd->add_option("--header-timeout", s.header_timeout_s, "Seconds a request's head may take from its first byte (408 after)")
      ->check(CLI::Range(1, 3600))->capture_default_str();
  cmd->add_option("--body-timeout", s.body_timeout_s, "Seconds a request's body may take after its head (408 after)")
      ->check(CLI::Range(1, 86400))->capture_default_str();
  cmd->add_option("--max-tokens", s.max_tokens, "Most new tokens a request may ask per choice")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--max-choices", s.max_choices, "Most choices (n x prompts) per request")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--max-image-pixels", s.max_image_pixels, "Largest width x height of an image")->check(CLI::Range(64, 1 << 26))->capture_default_str();
  cmd->add_option("--max-images", s.max_images, "Most images per request (batch_size x n_iter)")->check(CLI::Range(1, 1600))->capture_default_str();
  cmd->add_option("--threads", o->threads, "Engine threads (default: one per core)")->check(CLI::Range(1, 1024));
  cmd->add_option("--max-batch", o->max_batch, "Sequences decoded together per step (default: 256 on a GPU, 32 on the CPU)")->check(CLI::Range(1, 1024));
  cmd->add_option("--kv-mib", o->kv_mib, "KV cache budget per model, MiB")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  add_kv_type_option(*cmd, o->kv_type);
  add_device_options(*cmd, o->device);
  cmd->callback([o, cmd, &exit_code, argv, run_here] {
    // An empty key would turn the key check off without a word.
    const char* env = std::getenv("ATELIER_API_KEY");
    if (o->server.api_key.empty() && (cmd->count("--api-key") > 0 || (env && !*env))) {
      std::fprintf(stderr, "atelier serve: error: %s is empty, which would serve without a key: give a key (e.g. --api-key "
                           "\"$(openssl rand -hex 16)\"), or %s to serve without one\n",
                   cmd->count("--api-key") > 0 ? "--api-key" : "ATELIER_API_KEY",
                   cmd->count("--api-key") > 0 ? "leave --api-key out" : "unset ATELIER_API_KEY");
      exit_code = 2;
      return;
    }
    exit_code = run_here ? run_here(*o) : exec_serve_program(argv);
  });
}

}  // namespace atelier::app
