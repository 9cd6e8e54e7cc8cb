// `atelier serve`'s options, shared by atelier (which checks them) and
// atelier-serve (serve_main.cpp, which runs the server).
#pragma once

#include <atelier/engine.h>

#include <cstdint>
#include <string>

#include "commands/output.h"
#include "commands/request_options.h"
#include "server/api_server.h"  // ApiServerOptions only: a plain struct, nothing to link

namespace atelier::app {

struct ServeOptions {
  server::ApiServerOptions server;
  std::string data_dir = default_data_dir();
  int threads = 0;
  int max_batch = 0;  // 0: the device's default (EngineConfig::max_batch)
  int64_t kv_mib = 1024;
  KvType kv_type = KvType::F16;
  DeviceOptions device;
};

}  // namespace atelier::app
