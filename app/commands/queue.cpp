// The persistent queue from the command line: `atelier batch`, `atelier
// queue ...`, `atelier --headless` and `atelier metrics`. Every command works
// on a data dir (default: $ATELIER_HOME or ~/.local/share/atelier); one
// process at a time executes its queue, the others read and write it.
#include <atelier/engine.h>
#include <atelier/json_input.h>
#include <atelier/models.h>
#include <atelier/store.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <thread>

#include "commands/commands.h"
#include "commands/output.h"
#include "commands/request_options.h"

namespace atelier::app {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<bool> g_interrupted{false};
std::atomic<int> g_signal{0};  // the signal that set g_interrupted
extern "C" void on_signal(int sig) {
  g_signal = sig;
  g_interrupted = true;
}

struct RunnerOptions {
  std::string data_dir = default_data_dir();
  std::string store;  // "" = default_store_dir()
  int threads = 0;
  int max_batch = 0;  // 0: the device's default
  int max_wait_ms = 100;
  int64_t kv_mib = 1024;
  KvType kv_type = KvType::F16;
  bool metrics = false;
  DeviceOptions device;
};

void add_data_dir_option(CLI::App& cmd, RunnerOptions& o) {
  cmd.add_option("--data-dir", o.data_dir, "Queue and job database folder")->capture_default_str();
  cmd.add_option("--store", o.store, "Model store folder that requests' model names resolve in (default: $ATELIER_HOME, else $XDG_DATA_HOME/atelier, else ~/.local/share/atelier)");
}

void add_runner_options(CLI::App& cmd, RunnerOptions& o) {
  add_data_dir_option(cmd, o);
  cmd.add_option("--threads", o.threads, "Threads (default: one per core)")->check(CLI::Range(1, 1024));
  cmd.add_option("--max-batch", o.max_batch, "Sequences decoded together per step (default: 256 on a GPU, 32 on the CPU)")->check(CLI::Range(1, 1024));
  cmd.add_option("--max-wait-ms", o.max_wait_ms, "Dynamic batching window from idle")->check(CLI::Range(0, 60000))->capture_default_str();
  cmd.add_option("--kv-mib", o.kv_mib, "KV cache budget per model, MiB")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  add_kv_type_option(cmd, o.kv_type);
  add_device_options(cmd, o.device);
  cmd.add_flag("--metrics", o.metrics, "Print the engine metrics as JSON on stdout at the end");
}

// --device checked before any work: a GPU named outright but missing is an
// error (what is missing, how to get it); auto says where it runs.
Status check_device(const RunnerOptions& o) {
  auto d = select_device(o.device.device, o.device.precision, o.kv_type);
  if (!d.ok()) return d.status();
  std::fprintf(stderr, "%s\n", device_line(d.value()).c_str());
  return Status{};
}

EngineConfig engine_config(const RunnerOptions& o, bool execute) {
  EngineConfig c;
  c.data_dir = o.data_dir;
  c.store_dir = o.store;
  c.threads = o.threads;
  c.max_batch = o.max_batch;
  c.max_wait_ms = o.max_wait_ms;
  c.kv_memory_bytes = o.kv_mib << 20;
  c.kv_type = o.kv_type;
  c.devices = {o.device.device};
  c.precision = o.device.precision;
  c.gpu_memory_fraction = o.device.gpu_memory_fraction;
  c.execute = execute;
  return c;
}

// The runner's metrics for other processes (`atelier metrics`): written atomically.
void write_metrics_snapshot(const std::string& dir, const EngineMetrics& m) {
  const fs::path tmp = fs::path(dir) / "metrics.json.tmp", dst = fs::path(dir) / "metrics.json";
  json j = metrics_json(m);
  j["written_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  j["pid"] = static_cast<int64_t>(::getpid());
  {
    std::ofstream out(tmp);
    out << j.dump() << "\n";
    if (!out) return;  // metrics are best effort; the queue itself is in the database
  }
  std::error_code ec;
  fs::rename(tmp, dst, ec);
}

std::string format_eta(double s) {
  if (!(s >= 0) || s > 359999) return "--:--";
  const int t = static_cast<int>(s + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
  return buf;
}

// Announces finished jobs and alerts on stderr, as the runner works.
uint64_t subscribe_log(Engine& e) {
  return e.subscribe(0, [](const Event& ev) {
    switch (ev.type) {
      case EventType::Completed:
        std::fprintf(stderr, "job %lld completed: %d tokens, %.1f tokens/s\n", static_cast<long long>(ev.job),
                     ev.stats.new_tokens, ev.stats.tokens_per_s);
        break;
      case EventType::Failed:
        std::fprintf(stderr, "job %lld failed: %s\n", static_cast<long long>(ev.job), ev.message.c_str());
        break;
      case EventType::Cancelled:
        std::fprintf(stderr, "job %lld cancelled\n", static_cast<long long>(ev.job));
        break;
      case EventType::Alert:
        std::fprintf(stderr, "alert: %s\n", ev.message.c_str());
        break;
      default:
        break;
    }
  });
}

int run_headless(const RunnerOptions& o, bool watch) {
  auto opened = Engine::open(engine_config(o, true));
  if (!opened.ok()) return fail(opened.status());
  Engine& e = *opened.value();
  std::fprintf(stderr, "%s\n", device_line(e.device()).c_str());
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  subscribe_log(e);
  std::fprintf(stderr, "running the queue in %s%s\n", o.data_dir.c_str(), watch ? " (until stopped)" : " until it is empty");
  int code = 0;
  int blocked_s = 0;  // seconds in a row the runner could not write its database with nothing running
  while (!g_interrupted) {
    const bool idle = e.wait_idle(1000);
    const EngineMetrics m = e.metrics();
    write_metrics_snapshot(o.data_dir, m);
    if (idle && !watch) break;
    // A full disk: nothing can start. --watch waits for room (the alert said
    // why); a run "until the queue is empty" would never end, so it stops.
    const Status storage = e.storage_status();
    blocked_s = storage.ok() || m.running > 0 ? 0 : blocked_s + 1;
    if (!watch && blocked_s >= 3) {
      std::fprintf(stderr, "atelier: error: %s\natelier: %d job(s) stay queued: free some space, then run `atelier --headless` again\n",
                   storage.message.c_str(), m.queue_depth);
      code = 1;
      break;
    }
    if (!watch && e.paused() && m.running == 0) {
      std::fprintf(stderr, "the queue is paused with %d job(s) waiting; `atelier queue resume` lets them run\n", m.queue_depth);
      break;
    }
  }
  if (g_interrupted) std::fprintf(stderr, "stopping: running jobs go back to the queue\n");
  if (o.metrics) print_json_line(metrics_json(e.metrics()));
  return code;
}

struct BatchOptions {
  std::string file, out_dir = "batch-out", shard;
  bool shard_given = false;  // --shard '' is a mistake, not "no shard"
  bool overwrite = false, allow_any_output = false;
  RunnerOptions runner;
};

// What identifies a batch line's job across reruns: its text, its number and
// the output folder (sha256 of the three), so a rerun after a kill finds the
// job it queued before instead of adding another.
Result<std::string> line_key(const std::string& out_dir_abs, int number, const std::string& text) {
  auto digest = sha256_hex(out_dir_abs + '\n' + std::to_string(number) + '\n' + text);
  if (!digest.ok()) return digest.status();
  return "batch:" + digest.value();
}

}  // namespace

// (output.h) Writes TEXT to PATH atomically: a temporary file beside it, every write
// checked, fsync, rename, then the folder synced. On any failure the
// temporary file is removed and PATH is left as it was.
Status write_file_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  auto io = [&](const std::string& what) {
    const int err = errno;  // before unlink() can change it
    ::unlink(tmp.c_str());
    return Status::error(err == ENOSPC ? StatusCode::DiskFull : StatusCode::Io,
                         path.string() + ": " + what + ": " + std::strerror(err) +
                             (err == ENOSPC ? " (the disk is full: free some space and rerun the same command)" : ""));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io("cannot create the temporary file");
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      ::close(fd);
      return io("cannot write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    return io("cannot sync");
  }
  if (::close(fd) != 0) return io("cannot close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) return io("cannot rename the temporary file into place");
  const std::string dir = path.parent_path().empty() ? "." : path.parent_path().string();
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return {};
}

namespace {

// A batch line's "output": relative values land inside --out; an absolute
// path or a ".." escape is refused unless --allow-any-output. "" = OUT/line-N.png.
Result<std::string> line_output(const BatchOptions& o, int number, const std::string& output) {
  if (output.empty()) return (fs::path(o.out_dir) / ("line-" + std::to_string(number) + ".png")).string();
  const fs::path p(output);
  bool escapes = p.is_absolute();
  for (const auto& part : p)
    if (part == "..") escapes = true;
  if (escapes && !o.allow_any_output)
    return Status::error(StatusCode::InvalidArgument,
                         "output \"" + output + "\" is outside the --out folder (an absolute path or a \"..\"): write a path "
                         "relative to --out, or pass --allow-any-output to write it where it says");
  if (p.is_absolute()) return output;
  return (fs::path(o.out_dir) / p).string();
}

int run_batch(const BatchOptions& o) {
  // From the start: an interrupt at any point still ends with results.jsonl.
  g_interrupted = false;
  g_signal = 0;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  int shard_i = 0, shard_n = 1;
  if (o.shard_given) {
    // from_chars, not sscanf: "1/99999999999999999999" is refused, not wrapped.
    const char* s = o.shard.data();
    const char* end = s + o.shard.size();
    const auto [p1, e1] = std::from_chars(s, end, shard_i);
    const bool slash = e1 == std::errc() && p1 < end && *p1 == '/';
    const auto [p2, e2] = slash ? std::from_chars(p1 + 1, end, shard_n) : std::from_chars_result{p1, std::errc::invalid_argument};
    if (!slash || e2 != std::errc() || p2 != end || shard_n < 1 || shard_i < 0 || shard_i >= shard_n)
      return fail(Status::error(StatusCode::InvalidArgument, "--shard wants I/N with 0 <= I < N, e.g. 0/4; got '" + o.shard + "'"));
  }
  if (Status d = check_device(o.runner); !d.ok()) return fail(d);
  {
    std::error_code ec;
    const auto st = fs::status(o.file, ec);
    if (!fs::exists(st)) return fail(Status::error(StatusCode::NotFound, o.file + ": no such batch file"));
    if (fs::is_directory(st))
      return fail(Status::error(StatusCode::InvalidArgument, o.file + " is a folder: pass a JSON Lines file, one request per line"));
    if (!fs::is_regular_file(st))
      return fail(Status::error(StatusCode::InvalidArgument, o.file + " is not a regular file (a FIFO or device): pass a JSON Lines file"));
  }
  std::ifstream in(o.file);
  if (!in) return fail(Status::error(StatusCode::NotFound, o.file + ": cannot open the batch file"));
  struct Line {
    int number = 0;
    std::string key;
    TextRequest request;
    JobId job = 0;
    bool image = false;  // "kind": "image": an ImageRequest
    ImageRequest image_request;
  };
  std::vector<Line> lines;
  std::vector<std::string> errors;
  std::string text;
  std::error_code abs_ec;
  const std::string out_abs = fs::absolute(o.out_dir, abs_ec).lexically_normal().string();
  for (int number = 1; std::getline(in, text); ++number) {
    if (g_interrupted) {
      std::fprintf(stderr, "atelier: interrupted while reading %s (at line %d): nothing was queued\n", o.file.c_str(), number);
      return 128 + g_signal;
    }
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines are not jobs
    if (number % shard_n != shard_i) continue;
    const std::string where = o.file + ":" + std::to_string(number) + ": ";
    Line l;
    l.number = number;
    auto key = line_key(out_abs, number, text);
    if (!key.ok()) {
      errors.push_back(where + key.status().message);
      continue;
    }
    l.key = key.value();
    if (is_image_request_json(text)) {
      auto req = image_request_from_json(text);
      if (!req.ok()) {
        errors.push_back(where + req.status().message);
        continue;
      }
      l.image = true;
      l.image_request = req.value();
      auto out = line_output(o, number, l.image_request.output);
      if (!out.ok()) {
        errors.push_back(where + out.status().message);
        continue;
      }
      l.image_request.output = out.value();
      lines.push_back(std::move(l));
      continue;
    }
    auto req = request_from_json(text);
    if (!req.ok()) {
      errors.push_back(where + req.status().message);
      continue;
    }
    l.request = req.value();
    lines.push_back(std::move(l));
  }
  if (in.bad()) return fail(Status::error(StatusCode::Io, o.file + ": cannot read the batch file"));
  if (!errors.empty()) {
    for (const auto& e : errors) std::fprintf(stderr, "atelier: error: %s\n", e.c_str());
    std::fprintf(stderr, "atelier: nothing was queued: fix the %zu line(s) above\n", errors.size());
    return 2;
  }
  if (lines.empty())
    return fail(Status::error(StatusCode::InvalidArgument,
                              o.file + " holds no request" + (o.shard.empty() ? "" : " in shard " + o.shard) +
                                  ": write one JSON request per line (see README)"));
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return fail(Status::error(StatusCode::Io, o.out_dir + ": cannot create the output folder: " + ec.message()));
  // Temporary results of runs killed while writing (kill -9): their process is gone.
  for (fs::directory_iterator it(o.out_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("results.jsonl.tmp.", 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + 18, nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove(it->path(), ec);
  }
  ec.clear();

  // Queue first, through an engine that runs nothing: no executor competes
  // with the inserts (its queue refresh after every chunk would read the
  // whole queue each time). A job an earlier run left running is recovered
  // before: one the crash rule fails is then queued afresh for its line, as
  // a rerun promises, rather than found "running" and failed after.
  if (Status st = Engine::recover_queue(o.runner.data_dir); !st.ok()) return fail(st);
  auto opened = Engine::open(engine_config(o.runner, false));
  if (!opened.ok()) return fail(opened.status());
  std::unique_ptr<Engine> engine = std::move(opened.value());
  // A request the engine refuses (a missing model file, say) is a failed line, not the end of the batch.
  // Text lines go in chunks of kQueueChunk, one transaction (one sync) each; a chunk holding a refused
  // line is queued one by one. A signal stops the queueing between chunks: what is queued stays queued
  // under its key, so the same command run again queues the rest and nothing twice.
  constexpr size_t kQueueChunk = 1000;
  std::map<int, std::string> refused;
  std::vector<TextRequest> all;
  std::vector<std::string> keys;
  std::vector<Line*> text_lines;
  int resumed = 0;
  bool stopped = false;  // by a signal, before every line was queued
  {
    Engine& e = *engine;
    const auto queue_t0 = Clock::now();
    std::fprintf(stderr, "queueing %zu line(s) in %s\n", lines.size(), o.runner.data_dir.c_str());
    // Checked after each chunk, not before: once queueing starts, a signal stops it
    // after the chunk in hand, so what it leaves is always whole chunks.
    for (auto& l : lines) {
      if (auto earlier = e.find_submitted(l.key); earlier.ok()) {
        l.job = earlier.value();
        ++resumed;
        continue;
      }
      if (!l.image) {
        all.push_back(l.request);
        keys.push_back(l.key);
        text_lines.push_back(&l);
      }
    }
    for (size_t begin = 0; begin < text_lines.size(); begin += kQueueChunk) {
      const size_t end = std::min(text_lines.size(), begin + kQueueChunk);
      const std::vector<TextRequest> chunk(all.begin() + static_cast<ptrdiff_t>(begin), all.begin() + static_cast<ptrdiff_t>(end));
      const std::vector<std::string> chunk_keys(keys.begin() + static_cast<ptrdiff_t>(begin), keys.begin() + static_cast<ptrdiff_t>(end));
      if (auto ids = e.submit_many(chunk, chunk_keys); ids.ok()) {
        for (size_t i = begin; i < end; ++i) text_lines[i]->job = ids.value()[i - begin];
      } else {
        for (size_t i = begin; i < end; ++i) {
          auto id = e.submit_many({all[i]}, {keys[i]});
          if (id.ok()) text_lines[i]->job = id.value().front();
          else refused[text_lines[i]->number] = id.status().message;
        }
      }
      if (g_interrupted) break;
    }
    for (auto& l : lines) {  // image lines: one transaction each
      if (g_interrupted) break;
      if (!l.image || l.job != 0) continue;
      // Never replace a file the user has, unless asked to.
      const ImageRequest& r = l.image_request;
      // At most the 100 x 16 images a request may ask; submit refuses more below (a line asking 1e9 looped here for hours).
      const int n = static_cast<int>(std::clamp<int64_t>(int64_t{r.batch_count} * r.batch_size, 0, 1600));
      std::string exists;
      for (int i = 0; i < n && exists.empty(); ++i)
        if (const std::string f = numbered_output_path(r.output, i, n); fs::exists(fs::symlink_status(f, ec))) exists = f;
      if (!exists.empty() && !o.overwrite) {
        refused[l.number] = exists + " already exists: pass --overwrite to replace it, or name another output";
        continue;
      }
      if (const fs::path parent = fs::path(r.output).parent_path(); !parent.empty() && !o.allow_any_output)
        fs::create_directories(parent, ec);  // inside --out (checked above)
      auto id = e.submit(l.image_request, l.key);
      if (id.ok()) l.job = id.value();
      else refused[l.number] = id.status().message;
      // Accepted but unusually long: said now, not discovered hours later (the estimate is cached from submit).
      if (auto est = e.estimate(l.image_request); id.ok() && est.ok() && !est->warning.empty())
        std::fprintf(stderr, "line %d: warning: %s\n", l.number, est->warning.c_str());
    }
    if (g_interrupted) {
      size_t queued = 0;
      for (const auto& l : lines) {
        if (l.job != 0) ++queued;
        else if (!refused.count(l.number)) stopped = true;
      }
      if (stopped)
        std::fprintf(stderr, "atelier: interrupted while queueing: %zu of %zu line(s) are queued and stay queued; "
                             "run the same command again to queue the rest and run them (nothing is queued twice)\n",
                     queued, lines.size());
    }
    if (!stopped)
      std::fprintf(stderr, "queued %zu of %zu line(s) in %.1f s\n",
                   static_cast<size_t>(std::count_if(lines.begin(), lines.end(), [](const Line& l) { return l.job != 0; })),
                   lines.size(), std::chrono::duration<double>(Clock::now() - queue_t0).count());
  }
  // Run the queue here, or, when another process already runs it, wait for it.
  if (!stopped) {
    if (auto runner = Engine::open(engine_config(o.runner, true)); runner.ok())
      engine = std::move(runner.value());
    else
      std::fprintf(stderr, "another process runs the queue in %s; waiting for it to run these jobs\n", o.runner.data_dir.c_str());
  }
  Engine& e = *engine;
  if (resumed > 0) std::fprintf(stderr, "%d of %zu line(s) were queued by an earlier run; not queued again\n", resumed, lines.size());
  const auto t0 = Clock::now();
  const bool tty = ::isatty(STDERR_FILENO);
  std::map<JobId, JobInfo> finished;
  int last_decile = -1;
  Status stuck;        // the runner here cannot write the job database (a full disk) and runs nothing
  int stuck_polls = 0;
  while (!g_interrupted) {
    int64_t tokens = 0;
    for (const auto& l : lines) {
      if (l.job == 0) continue;  // refused at submission
      if (finished.count(l.job)) {
        tokens += finished[l.job].stats.new_tokens;
        continue;
      }
      auto j = e.job(l.job);
      if (!j.ok()) continue;
      if (j->state == JobState::Completed || j->state == JobState::Failed || j->state == JobState::Cancelled)
        finished[l.job] = j.value();
      tokens += j->stats.new_tokens;
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    const size_t done = finished.size() + refused.size(), total = lines.size();
    const double rate = elapsed > 0 ? tokens / elapsed : 0;
    const double eta = done > 0 ? elapsed * static_cast<double>(total - done) / static_cast<double>(done) : -1;
    const int width = 30, filled = total ? static_cast<int>(width * done / total) : width;
    char bar[256];
    std::snprintf(bar, sizeof bar, "[%s%s] %zu/%zu jobs | %.1f tokens/s | ETA %s", std::string(static_cast<size_t>(filled), '#').c_str(),
                  std::string(static_cast<size_t>(width - filled), '.').c_str(), done, total, rate, format_eta(eta).c_str());
    const int decile = total ? static_cast<int>(10 * done / total) : 10;
    if (tty) std::fprintf(stderr, "\r%s", bar);
    else if (decile != last_decile) std::fprintf(stderr, "%s\n", bar);
    last_decile = decile;
    if (done >= total) break;
    // Nothing can start while the database takes no writes: after 3 s of
    // that with nothing running, the lines not run are reported as failed.
    const Status storage = e.storage_status();
    stuck_polls = storage.ok() || e.metrics().running > 0 ? 0 : stuck_polls + 1;
    if (stuck_polls >= 15) {
      stuck = storage;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (tty) std::fprintf(stderr, "\n");
  const bool interrupted = g_interrupted;
  // Every line once, finished or not (on an interrupt too), then one atomic write.
  std::string body;
  std::vector<std::string> failed;
  for (const auto& l : lines) {
    JobInfo j;
    if (l.job == 0) {
      j.state = JobState::Failed;
      if (auto why = refused.find(l.number); why != refused.end()) j.error = why->second;
    } else if (auto f = finished.find(l.job); f != finished.end()) {
      j = f->second;
    } else if (auto now = e.job(l.job); now.ok()) {
      j = now.value();
    }
    const bool complete = j.state == JobState::Completed;
    const bool pending = j.state == JobState::Queued || j.state == JobState::Running;
    json r = {{"line", l.number},
              {"job", l.job},
              {"state", job_state_name(j.state)},
              {"seed", j.seed},
              {"model_version", j.model_version},
              {"model_name", j.model_name},
              {"device", j.device},
              {"precision", j.precision},
              {"engine_build", j.engine_build}};
    if (o.shard_given) r["shard"] = o.shard;  // for `atelier batch merge`: which shards it has
    if (l.image) {
      r["kind"] = "image";
      r["files"] = j.files;
    } else {
      r["text"] = j.text;
      r["stop_reason"] = j.stop_reason;
      r["prompt_tokens"] = j.stats.prompt_tokens;
      r["new_tokens"] = j.stats.new_tokens;
      r["tokens_per_s"] = j.stats.tokens_per_s;
    }
    if (l.job == 0 && !refused.count(l.number)) {  // a signal stopped the queueing before this line
      r["state"] = "not_queued";
      r["error"] = "not queued: the batch was interrupted while queueing; run the same command again to queue and run it";
    } else if (!complete) {
      r["error"] = pending && !stuck.ok()
                       ? "not run (" + stuck.message + "); the job stays queued: rerun the same command once there is room"
                   : pending ? std::string("interrupted before it finished: the job stays queued; rerun the same command to finish it")
                             : (j.error.empty() ? std::string(job_state_name(j.state)) : j.error);
      failed.push_back("line " + std::to_string(l.number) + " (job " + std::to_string(l.job) + "): " + r["error"].get<std::string>());
    }
    body += r.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  }
  auto list_failed = [&] {
    if (failed.empty()) return;
    std::fprintf(stderr, "atelier: %zu of %zu jobs did not complete:\n", failed.size(), lines.size());
    for (const auto& f : failed) std::fprintf(stderr, "  %s\n", f.c_str());
  };
  const fs::path results = fs::path(o.out_dir) / "results.jsonl";
  if (Status st = write_file_atomically(results, body); !st.ok()) {
    list_failed();
    std::fprintf(stderr, "atelier: error: %s; no results file was written (an earlier results.jsonl is left as it was); "
                         "the finished jobs stay in the queue, so rerunning the same command writes it without redoing them\n",
                 st.message.c_str());
    return 1;
  }
  std::fprintf(stderr, "wrote %s (%zu results)\n", results.string().c_str(), lines.size());
  if (o.runner.metrics) print_json_line(metrics_json(e.metrics()));
  list_failed();
  if (stopped) return 128 + g_signal;  // as a shell reports a process the signal ended: 130 SIGINT, 143 SIGTERM
  if (interrupted) {
    std::fprintf(stderr, "interrupted: unfinished jobs stay in the queue (rerun the same command, or `atelier --headless`, to finish them)\n");
    return 1;
  }
  if (!stuck.ok()) std::fprintf(stderr, "atelier: error: %s\n", stuck.message.c_str());
  return failed.empty() ? 0 : 1;
}

std::string excerpt(const std::string& s, size_t n) {
  std::string r;
  for (char c : s) r += (c == '\n' || c == '\t') ? ' ' : c;
  if (r.size() > n) r = r.substr(0, n - 3) + "...";
  return r;
}

}  // namespace

void add_queue_commands(CLI::App& root, int& exit_code) {
  // atelier --headless [--watch]: flags of the root command, valid only together.
  struct HeadlessOptions {
    RunnerOptions runner;
    bool headless = false, watch = false;
  };
  auto h = std::make_shared<HeadlessOptions>();
  CLI::Option* headless_flag = root.add_flag("--headless", h->headless, "Run the persistent queue until it is empty (no window)");
  root.add_flag("--watch", h->watch, "With --headless: keep running and wait for new jobs until stopped")->needs(headless_flag);
  add_runner_options(root, h->runner);
  for (const char* name : {"--data-dir", "--store", "--threads", "--max-batch", "--max-wait-ms", "--kv-mib", "--kv-type", "--metrics",
                           "--device", "--precision", "--gpu-memory-fraction"})
    root.get_option(name)->needs(headless_flag);
  root.callback([&root, h, &exit_code] {
    if (h->headless && root.get_subcommands().empty()) exit_code = run_headless(h->runner, h->watch);
  });

  // atelier batch FILE.jsonl
  auto b = std::make_shared<BatchOptions>();
  CLI::App* batch = root.add_subcommand("batch", "Run a JSON Lines file of requests through the queue; results to DIR/results.jsonl");
  // Not ->required(): `batch merge DIR...` has none (checked in the callback).
  batch->add_option("file", b->file, "One request per line, in the JSON form (see README)");
  batch->add_option("--out", b->out_dir, "Output folder")->capture_default_str();
  batch->add_flag("--overwrite", b->overwrite, "Replace image files that already exist (default: such a line fails)");
  batch->add_flag("--allow-any-output", b->allow_any_output, "Let lines' \"output\" be absolute or leave --out with \"..\" (default: refused)");
  batch->add_option_function<std::string>(
      "--shard",
      [b](const std::string& v) {
        b->shard = v;
        b->shard_given = true;
      },
      "Run only lines whose number (1-based) is I modulo N, e.g. 0/4 (a Kubernetes indexed Job or Slurm array task)");
  add_runner_options(*batch, b->runner);
  add_batch_merge_command(*batch, exit_code);
  batch->callback([b, batch, &exit_code] {
    if (batch->got_subcommand("merge")) return;
    if (b->file.empty()) throw CLI::RequiredError("file");
    exit_code = run_batch(*b);
  });

  // atelier queue ...
  CLI::App* queue = root.add_subcommand("queue", "The persistent job queue");
  queue->require_subcommand(1);
  auto dir = std::make_shared<RunnerOptions>();
  add_data_dir_option(*queue, *dir);
  auto client = [dir]() { return Engine::open(engine_config(*dir, false)); };

  struct AddOptions {
    TextRequest req;
  };
  auto a = std::make_shared<AddOptions>();
  CLI::App* add = queue->add_subcommand("add", "Queue a text job (run by `atelier --headless` or a running studio)");
  add->add_option("-m,--model", a->req.model, "Model: a store reference (NAME, NAME@VERSION, NAME:CHANNEL, sha256:DIGEST) or a file")->required();
  add_request_options(*add, a->req);
  add->add_option("--priority", a->req.priority, "Higher runs first")->check(CLI::Range(INT_MIN, INT_MAX))->capture_default_str();
  add->add_flag("--interactive", a->req.interactive, "Interactive job: admitted above batch jobs, with a latency target");
  add->callback([a, client, &exit_code] {
    auto e = client();
    if (!e.ok()) return void(exit_code = fail(e.status()));
    auto id = e.value()->submit(a->req);
    if (!id.ok()) return void(exit_code = fail(id.status()));
    write_stdout(std::to_string(id.value()) + "\n");
    exit_code = 0;
  });

  struct ListOptions {
    std::string state;
    int limit = 100;
    bool json = false;
  };
  auto l = std::make_shared<ListOptions>();
  CLI::App* list = queue->add_subcommand("list", "List jobs, newest first");
  list->add_option("--state", l->state, "Only jobs in this state")->check(CLI::IsMember({"queued", "running", "completed", "failed", "cancelled"}));
  list->add_option("--limit", l->limit, "At most this many")->check(CLI::Range(1, 1000000))->capture_default_str();
  list->add_flag("--json", l->json, "JSON Lines");
  list->callback([l, client, &exit_code] {
    auto e = client();
    if (!e.ok()) return void(exit_code = fail(e.status()));
    JobFilter f;
    f.limit = l->limit;
    f.newest_first = true;
    for (JobState s : {JobState::Queued, JobState::Running, JobState::Completed, JobState::Failed, JobState::Cancelled})
      if (job_state_name(s) == l->state) f.state = s;
    const auto jobs = e.value()->list(f);
    // MODEL VERSION: the short digest and name@version a finished job used (what produced it), else the request's model.
    if (!l->json) std::printf("%6s  %-9s  %4s  %6s  %-36s  %s\n", "ID", "STATE", "PRIO", "TOKENS", "MODEL VERSION", "PROMPT");
    for (const JobInfo& j : jobs) {
      if (l->json) {
        const bool image = j.kind == "image";
        print_json_line({{"id", j.id}, {"kind", j.kind}, {"state", job_state_name(j.state)}, {"priority", j.priority},
                         {"interactive", image ? j.image_request.interactive : j.request.interactive},
                         {"model", image ? j.image_request.model : j.request.model}, {"model_version", j.model_version},
                         {"model_name", j.model_name}, {"device", j.device}, {"precision", j.precision},
                         {"engine_build", j.engine_build}, {"prompt", image ? j.image_request.prompt : j.request.prompt},
                         {"created_ms", j.created_ms}, {"started_ms", j.started_ms}, {"finished_ms", j.finished_ms}, {"seed", j.seed},
                         {"attempts", j.attempts}, {"new_tokens", j.stats.new_tokens}, {"text", j.text}, {"files", j.files},
                         {"error", j.error}});
      } else {
        std::string model = j.request.model;
        if (j.model_version.rfind("sha256:", 0) == 0) {
          // A store version by name@version; a plain file by its file name.
          const std::string name = j.model_name.find('/') == std::string::npos ? j.model_name : fs::path(j.model_name).filename().string();
          model = j.model_version.substr(7, 12);
          model.append(" ").append(name);
        }
        std::printf("%6lld  %-9s  %4d  %6d  %-36s  %s\n", static_cast<long long>(j.id), std::string(job_state_name(j.state)).c_str(),
                    j.priority, j.stats.new_tokens, excerpt(model, 36).c_str(), excerpt(j.request.prompt, 40).c_str());
      }
    }
    exit_code = 0;
  });

  auto ids = std::make_shared<std::vector<int64_t>>();
  CLI::App* cancel = queue->add_subcommand("cancel", "Cancel jobs (queued at once, running within a step)");
  cancel->add_option("ids", *ids, "Job ids")->required();
  cancel->callback([ids, client, &exit_code] {
    auto e = client();
    if (!e.ok()) return void(exit_code = fail(e.status()));
    exit_code = 0;
    for (int64_t id : *ids)
      if (Status s = e.value()->cancel(id); !s.ok()) exit_code = fail(s);
  });

  CLI::App* pause = queue->add_subcommand("pause", "Stop starting new jobs (running ones finish)");
  pause->callback([client, &exit_code] {
    auto e = client();
    if (!e.ok()) return void(exit_code = fail(e.status()));
    if (Status st = e.value()->pause(); !st.ok()) return void(exit_code = fail(st));
    exit_code = 0;
  });
  CLI::App* resume = queue->add_subcommand("resume", "Start jobs again");
  resume->callback([client, &exit_code] {
    auto e = client();
    if (!e.ok()) return void(exit_code = fail(e.status()));
    if (Status st = e.value()->resume(); !st.ok()) return void(exit_code = fail(st));
    exit_code = 0;
  });
  auto also_queued = std::make_shared<bool>(false);
  CLI::App* clear = queue->add_subcommand("clear", "Forget finished jobs");
  clear->add_flag("--queued", *also_queued, "Also cancel every queued job");
  clear->callback([client, also_queued, &exit_code] {
    auto e = client();
    if (!e.ok()) return void(exit_code = fail(e.status()));
    Result<int> cancelled = 0;
    if (*also_queued) cancelled = e.value()->cancel_queued();
    if (!cancelled.ok()) return void(exit_code = fail(cancelled.status()));
    const Result<int> cleared = e.value()->clear_finished();
    if (!cleared.ok()) return void(exit_code = fail(cleared.status()));
    std::fprintf(stderr, "cleared %d finished job(s)%s\n", cleared.value(),
                 *also_queued ? (", cancelled " + std::to_string(cancelled.value()) + " queued").c_str() : "");
    exit_code = 0;
  });

  CLI::App* repair = queue->add_subcommand("repair", "Rebuild a damaged jobs.db from what is readable (the damaged file is kept beside it)");
  repair->callback([dir, &exit_code] {
    auto r = Engine::repair_queue(dir->data_dir);
    if (!r.ok()) return void(exit_code = fail(r.status()));
    if (!r->damaged) std::fprintf(stderr, "%s/jobs.db is not damaged; nothing to do\n", dir->data_dir.c_str());
    else
      std::fprintf(stderr, "rebuilt %s/jobs.db: %lld row(s) recovered; the damaged file is kept as %s\n", dir->data_dir.c_str(),
                   static_cast<long long>(r->rows), r->backup.c_str());
    exit_code = 0;
  });

  // `atelier queue add ... --store DIR` and `--data-dir` after the subcommand reach the queue's options.
  for (CLI::App* sub : queue->get_subcommands({})) sub->fallthrough();

  // atelier metrics
  auto m = std::make_shared<RunnerOptions>();
  auto mjson = std::make_shared<bool>(false);
  CLI::App* metrics = root.add_subcommand("metrics", "The queue runner's metrics (throughput, latency percentiles, KV use, alerts)");
  add_data_dir_option(*metrics, *m);
  metrics->add_flag("--json", *mjson, "One JSON object");
  metrics->callback([m, mjson, &exit_code] {
    std::ifstream in(fs::path(m->data_dir) / "metrics.json");
    const bool have = static_cast<bool>(in);
    auto parsed = parse_json(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()), "metrics.json");
    json j;
    if (have && parsed.ok() && parsed->is_object()) {
      j = std::move(parsed.value());
    } else {
      auto e = Engine::open(engine_config(*m, false));
      if (!e.ok()) return void(exit_code = fail(e.status()));
      j = metrics_json(e.value()->metrics());
      j["note"] = "no runner has written metrics in this data dir yet; only the queue depth is known";
    }
    if (*mjson) {
      print_json_line(j);
    } else {
      std::printf("throughput      %.1f tokens/s (last minute %.1f)\n", j.value("tokens_per_s", 0.0), j.value("recent_tokens_per_s", 0.0));
      std::printf("first token     p50 %.1f ms, p99 %.1f ms\n", j["time_to_first_token_ms"].value("p50", 0.0), j["time_to_first_token_ms"].value("p99", 0.0));
      std::printf("inter-token     p50 %.1f ms, p99 %.1f ms\n", j["inter_token_ms"].value("p50", 0.0), j["inter_token_ms"].value("p99", 0.0));
      std::printf("queue           %d waiting, %d running; %lld completed, %lld failed, %lld cancelled\n", j.value("queue_depth", 0),
                  j.value("running", 0), static_cast<long long>(j.value("completed", 0)), static_cast<long long>(j.value("failed", 0)),
                  static_cast<long long>(j.value("cancelled", 0)));
      std::printf("KV blocks       %d used, %d free (%d cached); prefix hit rate %.1f %%\n", j.value("kv_blocks_used", 0),
                  j.value("kv_blocks_free", 0), j.value("kv_blocks_cached", 0), 100 * j.value("prefix_cache_hit_rate", 0.0));
      std::printf("busy            %.1f %%\n", 100 * j.value("busy_fraction", 0.0));
      std::printf("device          %s, %.1f of %.1f GiB free%s\n", j.value("device", std::string("cpu")).c_str(),
                  j.value("device_memory_free_bytes", int64_t{0}) / 1073741824.0,
                  j.value("device_memory_total_bytes", int64_t{0}) / 1073741824.0,
                  j.value("device_losses", int64_t{0}) > 0 ? " (a GPU was lost: running on the CPU)" : "");
      if (j.contains("gpu") && j["gpu"].is_object()) {
        const json& g = j["gpu"];
        std::printf("GPU             %.0f %% busy, %.0f C, memory %.1f of %.1f GiB used\n", g.value("utilization_percent", 0.0),
                    g.value("temperature_c", 0.0), g.value("memory_used_bytes", int64_t{0}) / 1073741824.0,
                    g.value("memory_total_bytes", int64_t{0}) / 1073741824.0);
      }
      for (const auto& a : j.value("alerts", std::vector<std::string>{})) std::printf("ALERT           %s\n", a.c_str());
    }
    exit_code = 0;
  });
}

}  // namespace atelier::app
