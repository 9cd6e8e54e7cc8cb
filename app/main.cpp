// atelier: the headless command line. Every job the window can run, a script
// can run from here with the same request values.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "commands/commands.h"

namespace {

// CLI11 reads an empty value of a number option as the default ("--cfg ''"
// ran with 7.5): refuse it, on every number option of every command.
void refuse_empty_numbers(CLI::App& app) {
  static const CLI::Validator not_empty(
      [](std::string& v) { return v.empty() ? std::string("an empty value is not a number") : std::string(); }, "", "not empty");
  // CLI11 saturates a whole number too large for 64 bits (to 9223372036854775807) instead of refusing it.
  static const CLI::Validator fits(
      [](std::string& v) {
        const bool digits = !v.empty() && v.find_first_not_of("+-0123456789") == std::string::npos;
        if (!digits) return std::string();
        errno = 0;
        if (v[0] == '-') (void)std::strtoll(v.c_str(), nullptr, 10);
        else (void)std::strtoull(v.c_str(), nullptr, 10);
        return errno == ERANGE ? "'" + v + "' is too large a number" : std::string();
      },
      "", "fits");
  // CLI11's Range lets NaN through (every comparison with it is false).
  static const CLI::Validator finite(
      [](std::string& v) {
        char* end = nullptr;
        const double d = std::strtod(v.c_str(), &end);
        return end != v.c_str() && *end == '\0' && !std::isfinite(d) ? "'" + v + "' is not a finite number" : std::string();
      },
      "", "finite");
  for (CLI::Option* o : app.get_options()) {
    if (o->get_type_size() == 0) continue;  // a flag
    // text/image/queue's --seed parse (and explain) their whole range themselves: "a seed is a whole number from 0 to ...".
    if (o->get_name() == "--seed" && o->get_type_name() == "UINT") continue;
    // "FLOAT", or "FLOAT:FLOAT in [0 - 100]" once a Range is checked.
    const std::string t = o->get_type_name();
    const auto is = [&t](const char* kind) { return t.rfind(kind, 0) == 0; };
    const bool whole = is("INT") || is("UINT"), number = whole || is("FLOAT") || is("NUMBER");
    if (number) o->check(not_empty);
    if (is("FLOAT")) o->check(finite);
    if (whole) o->check(fits);
  }
  for (CLI::App* sub : app.get_subcommands(std::function<bool(CLI::App*)>{})) refuse_empty_numbers(*sub);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Atelier: local text and image generation", "atelier"};
  app.require_subcommand(0, 1);  // none only with --headless
  app.set_version_flag("--version", "atelier 0.1.0");
  int exit_code = 0;
  atelier::app::add_text_commands(app, exit_code);
  atelier::app::add_bench_commands(app, exit_code);
  atelier::app::add_models_commands(app, exit_code);
  atelier::app::add_image_commands(app, exit_code);
  atelier::app::add_queue_commands(app, exit_code);
  atelier::app::add_template_commands(app, exit_code);
  atelier::app::add_serve_commands(app, exit_code, argv);
  refuse_empty_numbers(app);
  try {
    app.parse(argc, argv);
    if (app.get_subcommands().empty() && app.count("--headless") == 0)
      throw CLI::RequiredError("A subcommand (text, tokenize, batch, queue, metrics, bench, models, image, template, serve) or --headless");
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line that says what was wrong; --help says what is allowed.
    std::fprintf(stderr, "atelier: error: %s (see --help)\n", e.what());
    return 2;
  }
  return exit_code;
}
