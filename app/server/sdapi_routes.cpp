// AUTOMATIC1111's /sdapi/v1 routes.
#include "server/context.h"

namespace atelier::server {

void add_sdapi_routes(httplib::Server&, Context&) {}

}  // namespace atelier::server
