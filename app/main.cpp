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

// The Range CLI11 was given, out of the type name it built ("INT:INT in [1 - 1048576]",
// "FLOAT:FLOAT in [0.000000 - 100.000000]"); words "" when none was checked.
struct NumberRange {
  long double lo = 0, hi = 0;
  std::string words;  // " from 1 to 1048576"
};
NumberRange range_of(const std::string& type_name) {
  NumberRange r;
  const size_t open = type_name.find(" in ["), dash = type_name.find(" - ", open), close = type_name.find(']', dash);
  if (open == std::string::npos || dash == std::string::npos || close == std::string::npos) return r;
  const std::string lo = type_name.substr(open + 5, dash - open - 5), hi = type_name.substr(dash + 3, close - dash - 3);
  char *lo_end = nullptr, *hi_end = nullptr;
  r.lo = std::strtold(lo.c_str(), &lo_end);
  r.hi = std::strtold(hi.c_str(), &hi_end);
  if (*lo_end != '\0' || *hi_end != '\0') return r;
  auto tidy = [](std::string n) {  // 100.000000 -> 100, 0.500000 -> 0.5
    if (n.find('.') == std::string::npos) return n;
    while (!n.empty() && n.back() == '0') n.pop_back();
    if (!n.empty() && n.back() == '.') n.pop_back();
    return n;
  };
  r.words = " from " + tidy(lo) + " to " + tidy(hi);
  return r;
}

// What was wrong and the form wanted, before anything else looks at the value:
// "-n abc" said "Value abc not in range 1 to 1048576" (Range's words) and
// "queue cancel abc" or "--priority nan" "Could not convert".
CLI::Validator number_form(bool whole, bool is_unsigned, const NumberRange& range) {
  return CLI::Validator(
      [whole, is_unsigned, range](std::string& v) -> std::string {
        if (v.empty()) return "an empty value is not a number";
        const std::string want = whole ? "; give a whole number" + (range.words.empty() ? std::string(" (such as 42)") : range.words)
                                       : "; give a number" + (range.words.empty() ? std::string(" (such as 0.5)") : range.words);
        if (whole) {
          const size_t sign = (v[0] == '+' || v[0] == '-') ? 1 : 0;
          if (v.size() == sign || v.find_first_not_of("0123456789", sign) != std::string::npos)
            return "'" + v + "' is not a whole number" + want;
          if (v[0] == '-' && is_unsigned && v.find_first_not_of('0', 1) != std::string::npos) return "'" + v + "' is below zero" + want;
        } else {
          char* end = nullptr;
          const long double d = std::strtold(v.c_str(), &end);
          if (end == v.c_str() || *end != '\0') return "'" + v + "' is not a number" + want;
          if (!std::isfinite(d)) return "'" + v + "' is not a finite number" + want;
        }
        if (!range.words.empty()) {
          const long double d = std::strtold(v.c_str(), nullptr);
          if (!(d >= range.lo && d <= range.hi)) return "'" + v + "' is out of range" + want;
        }
        return "";
      },
      "", "number form");
}

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
    if (number) o->transform(number_form(whole, is("UINT"), range_of(t)));  // in front of the Range
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
  app.set_version_flag("--version", "atelier " ATELIER_VERSION);  // the project version (CMakeLists.txt)
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
