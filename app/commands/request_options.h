// Flag sets shared by several commands.
#pragma once

#include <atelier/requests.h>

namespace CLI {
class App;
}

namespace atelier::app {

// -p, -n, --temp, --top-k, --top-p, --min-p, the penalties, --seed, --stop.
// (-m is registered by each command: its meaning differs.)
void add_request_options(CLI::App& cmd, TextRequest& req);

}  // namespace atelier::app
