// The headless commands. Each add_* registers its subcommands on the root
// app; the callback it installs runs the command and stores the exit code.
#pragma once

namespace CLI {
class App;
}

namespace atelier::app {

// Exit codes: 0 success, 1 the command failed (message on stderr), 2 bad usage.
void add_text_commands(CLI::App& root, int& exit_code);    // text, tokenize
void add_bench_commands(CLI::App& root, int& exit_code);   // bench text
void add_models_commands(CLI::App& root, int& exit_code);  // models synth, models scan
void add_queue_commands(CLI::App& root, int& exit_code);   // batch, queue ..., metrics, --headless
void add_batch_merge_command(CLI::App& batch, int& exit_code);  // batch merge (batch_merge.cpp)
void add_image_commands(CLI::App& root, int& exit_code);   // image
void add_template_commands(CLI::App& root, int& exit_code);  // template render
// serve (the HTTP API, app/server). With RUN_HERE null the flags are
// checked, then ARGV is handed unchanged to the atelier-serve program beside
// this one (execv: the same process id and stdio). Only atelier-serve links
// the server, so no other command loads cpp-httplib, OpenSSL's TLS or brotli
// (~4 MB resident in every process).
struct ServeOptions;
void add_serve_commands(CLI::App& root, int& exit_code, char** argv, int (*run_here)(const ServeOptions&) = nullptr);

}  // namespace atelier::app
