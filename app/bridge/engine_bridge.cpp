#include "bridge/engine_bridge.h"

#include "server/api_server.h"

#include <atelier/store.h>
#include <atelier/tools.h>

#include <QDir>
#include <QFileInfo>
#include <QLocale>
#include <QMetaObject>

#include <algorithm>

namespace atelier::bridge {

QString defaultDataDir() { return QString::fromStdString(atelier::default_store_dir()); }

namespace {
// Two snapshots of a job differ in anything the queue dock or a result view shows.
bool sameJob(const JobInfo& a, const JobInfo& b) {
  return a.state == b.state && a.priority == b.priority && a.started_ms == b.started_ms &&
         a.finished_ms == b.finished_ms && a.stats.new_tokens == b.stats.new_tokens && a.model_name == b.model_name &&
         a.error == b.error && a.files == b.files && a.text.size() == b.text.size();
}
}  // namespace

EngineBridge::EngineBridge(Options options, QObject* parent) : QObject(parent), options_(std::move(options)) {
  qRegisterMetaType<atelier::Event>();
  qRegisterMetaType<atelier::JobInfo>();
  qRegisterMetaType<atelier::ModelInfo>();
  qRegisterMetaType<atelier::bridge::ModelChoice>();
  if (options_.dataDir.isEmpty()) options_.dataDir = defaultDataDir();
  if (options_.storeDir.isEmpty()) options_.storeDir = options_.dataDir;
  worker_.setObjectName(QStringLiteral("atelier-bridge"));
  workerContext_ = new QObject;
  workerContext_->moveToThread(&worker_);
  connect(&worker_, &QThread::finished, workerContext_, &QObject::deleteLater);
  worker_.start();
  pollTimer_.setInterval(options_.pollMs);
  connect(&pollTimer_, &QTimer::timeout, this, &EngineBridge::refreshJobs);
}

EngineBridge::~EngineBridge() {
  *alive_ = false;
  pollTimer_.stop();
  // The engine closes on the worker (its destructor stops the runner, which
  // may take a step); the subscription goes first so no event outlives us.
  // Blocking, not posted: quit() ends the worker's loop without running what
  // was posted after its current batch of events, so a posted teardown (and
  // a Resume posted just before it) could be dropped: the queue stayed
  // paused in jobs.db, and the engine was destroyed here on the GUI thread.
  // Everything posted earlier runs first (the worker's queue is in order).
  QMetaObject::invokeMethod(
      workerContext_,
      [this] {
        stopApiServer();
        if (engine_ && subscription_) engine_->unsubscribe(subscription_);
        engine_.reset();
      },
      Qt::BlockingQueuedConnection);
  worker_.quit();
  worker_.wait();
}

void EngineBridge::post(std::function<void()> work) {
  QMetaObject::invokeMethod(workerContext_, std::move(work), Qt::QueuedConnection);
}

void EngineBridge::restart(Options options) {
  if (options.dataDir.isEmpty()) options.dataDir = defaultDataDir();
  if (options.storeDir.isEmpty()) options.storeDir = options.dataDir;
  options_ = options;
  open_ = false;
  pollTimer_.stop();
  post([this] {
    stopApiServer();
    if (engine_ && subscription_) engine_->unsubscribe(subscription_);
    subscription_ = 0;
    engine_.reset();
    infoCache_.clear();
  });
  start();
}

void EngineBridge::start() {
  const Options o = options_;
  post([this, o] {
    EngineConfig config;
    config.data_dir = o.dataDir.toStdString();
    config.store_dir = o.storeDir.toStdString();
    config.threads = o.threads;
    config.poll_ms = 200;
    config.nice = o.engineNice;
    config.max_batch = o.maxBatch;
    config.max_wait_ms = o.maxWaitMs;
    config.kv_memory_bytes = o.kvMemoryBytes;
    config.model_cache_bytes = o.modelCacheBytes;
    config.image_memory_bytes = o.imageMemoryBytes;
    config.kv_type = o.kvType;
    config.devices = {o.device};
    auto result = Engine::open(config);
    bool executes = true;
    QString message;
    if (!result.ok()) {
      message = QString::fromStdString(result.status().message);
      // A setting this machine cannot run (a GPU's KV type on the CPU, a GPU
      // it lacks) is the reason, not another runner: say so, rather than be
      // the client of a runner that does not exist while jobs wait forever.
      if (auto device = select_device(config.devices.front(), config.precision, config.kv_type); !device.ok()) {
        const QString why = QString::fromStdString(device.status().message);
        QMetaObject::invokeMethod(this, [this, why] { emit this->opened(false, false, why); }, Qt::QueuedConnection);
        return;
      }
      // Another process runs this queue: be its client.
      config.execute = false;
      executes = false;
      result = Engine::open(config);
    }
    if (!result.ok()) {
      const QString why = QString::fromStdString(result.status().message);
      QMetaObject::invokeMethod(this, [this, why] { emit this->opened(false, false, why); }, Qt::QueuedConnection);
      return;
    }
    engine_ = std::move(result.value());
    auto alive = alive_;
    subscription_ = engine_->subscribe(0, [this, alive](const Event& ev) {
      if (!*alive) return;
      // Copied here, on the engine's thread; delivered on the bridge's.
      QMetaObject::invokeMethod(
          this, [this, alive, ev] {
            if (!*alive) return;
            emit event(ev);
            // Terminal and start events change the queue: re-read it soon.
            if (ev.type == EventType::Queued || ev.type == EventType::Started || ev.type == EventType::Completed ||
                ev.type == EventType::Failed || ev.type == EventType::Cancelled)
              refreshJobs();
          },
          Qt::QueuedConnection);
    });
    const bool paused = engine_->paused();
    const DeviceSelection dev = engine_->device();
    const QString deviceName = QString::fromStdString(dev.name), deviceWhy = QString::fromStdString(dev.why);
    applyApiServer();  // the server, when on, serves the engine just opened
    open_ = true;
    executes_ = executes;
    paused_ = paused;
    QMetaObject::invokeMethod(
        this, [this, executes, message, paused, deviceName, deviceWhy] {
          if (executes) emit deviceChosen(deviceName, deviceWhy);
          emit opened(true, executes, executes ? QString() : message);
          emit pausedChanged(paused);
          pollTimer_.start();
          refreshJobs();
        },
        Qt::QueuedConnection);
  });
}

void EngineBridge::setApiServer(bool enabled, const QString& address, const QString& key) {
  post([this, enabled, address, key] {
    api_ = {enabled, address, key};
    applyApiServer();
  });
}

void EngineBridge::stopApiServer() {
  if (!apiServer_) return;
  apiServer_->stop();
  apiServer_.reset();
  QMetaObject::invokeMethod(this, [this] { emit apiServerChanged(false, QString(), QString()); }, Qt::QueuedConnection);
}

void EngineBridge::applyApiServer() {
  stopApiServer();
  if (!api_.enabled || !engine_) return;
  server::ApiServerOptions o;
  // HOST:PORT; a bare port means loopback.
  const int colon = api_.address.lastIndexOf(QLatin1Char(':'));
  const QString host = colon > 0 ? api_.address.left(colon) : QStringLiteral("127.0.0.1");
  bool ok = false;
  const int port = (colon >= 0 ? api_.address.mid(colon + 1) : api_.address).toInt(&ok);
  if (!ok || port < 0 || port > 65535) {
    const QString why = tr("API server: \"%1\" is not HOST:PORT (a port from 0 to 65535)").arg(api_.address);
    QMetaObject::invokeMethod(this, [this, why] { emit apiServerChanged(false, QString(), why); }, Qt::QueuedConnection);
    return;
  }
  o.host = host.toStdString();
  o.port = port;
  o.api_key = api_.key.toStdString();
  o.store_dir = options_.storeDir.toStdString();
  o.output_dir = (options_.dataDir + QStringLiteral("/images")).toStdString();  // where the engine puts unnamed images
  auto server = std::make_unique<server::ApiServer>(*engine_, o);
  const Status st = server->start();
  if (!st.ok()) {
    const QString why = tr("API server: %1").arg(QString::fromStdString(st.message));
    QMetaObject::invokeMethod(this, [this, why] { emit apiServerChanged(false, QString(), why); }, Qt::QueuedConnection);
    return;
  }
  const QString address = QString::fromStdString(server->address());
  apiServer_ = std::move(server);
  QMetaObject::invokeMethod(this, [this, address] { emit apiServerChanged(true, address, QString()); }, Qt::QueuedConnection);
}

void EngineBridge::submitText(const TextRequest& request, SubmitDone done) {
  run<Result<JobId>>(
      [request](Engine* e) -> Result<JobId> {
        if (!e) return Status::error(StatusCode::Internal, "the engine is not open yet");
        return e->submit(request);
      },
      std::move(done));
}

void EngineBridge::submitImage(const ImageRequest& request, SubmitDone done) {
  run<Result<JobId>>(
      [request](Engine* e) -> Result<JobId> {
        if (!e) return Status::error(StatusCode::Internal, "the engine is not open yet");
        return e->submit(request);
      },
      std::move(done));
}

void EngineBridge::cancel(JobId id, StatusDone done) {
  run<Status>(
      [id](Engine* e) -> Status {
        if (!e) return Status::error(StatusCode::Internal, "the engine is not open yet");
        return e->cancel(id);
      },
      [this, done](Status s) {
        if (done) done(s);
        refreshJobs();
      });
}

void EngineBridge::setPriority(JobId id, int priority, StatusDone done) {
  run<Status>(
      [id, priority](Engine* e) -> Status {
        if (!e) return Status::error(StatusCode::Internal, "the engine is not open yet");
        return e->set_priority(id, priority);
      },
      [this, done](Status s) {
        if (done) done(s);
        refreshJobs();
      });
}

void EngineBridge::retry(JobId id, SubmitDone done) {
  run<Result<JobId>>(
      [id](Engine* e) -> Result<JobId> {
        if (!e) return Status::error(StatusCode::Internal, "the engine is not open yet");
        auto job = e->job(id);
        if (!job.ok()) return job.status();
        // The stored request carries the seed the job ran with, so the retry reproduces it.
        if (job->kind == "image") return e->submit(job->image_request);
        return e->submit(job->request);
      },
      std::move(done));
}

void EngineBridge::setPaused(bool paused) {
  paused_ = paused;
  emit pausedChanged(paused);
  post([this, paused] {
    if (!engine_) return;
    if (paused) engine_->pause();
    else engine_->resume();
  });
}

void EngineBridge::clearFinished(std::function<void(int)> done) {
  run<int>([](Engine* e) {
             if (!e) return 0;
             const auto n = e->clear_finished();
             return n.ok() ? n.value() : 0;
           },
           [this, done](int n) {
             if (done) done(n);
             refreshJobs();
           });
}

void EngineBridge::refreshJobs() {
  if (!open_ || polling_.exchange(true)) return;  // one list read in flight at a time
  run<std::vector<JobInfo>>(
      [](Engine* e) {
        std::vector<JobInfo> list;
        if (!e) return list;
        JobFilter f;
        f.limit = 2000;
        f.newest_first = true;
        list = e->list(f);
        // The list reads the database; a running job's live token count comes from the runner.
        for (JobInfo& j : list)
          if (j.state == JobState::Running)
            if (auto live = e->job(j.id); live.ok()) j.stats.new_tokens = live->stats.new_tokens;
        return list;
      },
      [this](std::vector<JobInfo> list) {
        polling_ = false;
        applyList(std::move(list));
      });
  run<bool>([](Engine* e) { return e && e->paused(); },
            [this](bool p) {
              if (p != paused_.load()) {
                paused_ = p;
                emit pausedChanged(p);
              }
            });
}

void EngineBridge::applyList(std::vector<JobInfo> list) {
  QVector<JobInfo> changed;
  QVector<JobId> removed;
  {
    std::lock_guard lock(jobsMutex_);
    QHash<JobId, bool> seen;
    std::vector<JobId> order;
    order.reserve(list.size());
    for (JobInfo& j : list) {
      seen.insert(j.id, true);
      order.push_back(j.id);
      auto it = jobs_.find(j.id);
      if (it == jobs_.end() || !sameJob(*it, j)) {
        changed.push_back(j);
        jobs_.insert(j.id, std::move(j));
      }
    }
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      if (!seen.contains(it.key())) {
        removed.push_back(it.key());
        it = jobs_.erase(it);
      } else {
        ++it;
      }
    }
    order_ = std::move(order);
  }
  if (!changed.isEmpty() || !removed.isEmpty()) emit jobsChanged(changed, removed);
}

QVector<JobInfo> EngineBridge::jobs() const {
  std::lock_guard lock(jobsMutex_);
  QVector<JobInfo> out;
  out.reserve(static_cast<int>(order_.size()));
  for (JobId id : order_)
    if (auto it = jobs_.find(id); it != jobs_.end()) out.push_back(*it);
  return out;
}

void EngineBridge::scanModels() {
  const QString storeDir = options_.storeDir;
  const QStringList folders = options_.modelFolders;
  run<QVector<ModelChoice>>(
      [storeDir, folders](Engine*) {
        QVector<ModelChoice> out;
        if (auto store = Store::open(storeDir.toStdString(), /*create=*/false); store.ok()) {
          if (auto models = store.value()->list(); models.ok()) {
            for (const StoreModel& m : models.value()) {
              // Newest first, so the picker's first entry for a model is its latest version.
              for (auto v = m.versions.rbegin(); v != m.versions.rend(); ++v) {
                ModelChoice c;
                c.reference = QString::fromStdString(m.name + "@" + std::to_string(v->number));
                QStringList channels;
                for (const auto& ch : v->channels) channels << QString::fromStdString(ch);
                c.label = c.reference + (channels.isEmpty() ? QString() : QStringLiteral("  [%1]").arg(channels.join(',')));
                c.kind = QString::fromStdString(v->kind.empty() ? m.kind : v->kind);
                int64_t bytes = 0;
                for (const auto& f : v->files) bytes += f.size;
                c.detail = QStringLiteral("%1 %2, %3, sha256:%4")
                               .arg(QString::fromStdString(v->format), QString::fromStdString(v->architecture),
                                    QLocale().formattedDataSize(bytes), QString::fromStdString(v->digest.substr(0, 12)));
                c.inStore = true;
                out.push_back(c);
              }
            }
          }
        }
        std::vector<std::string> dirs;
        for (const QString& f : folders) dirs.push_back(f.toStdString());
        for (const ModelFile& f : scan_model_folders(dirs)) {
          ModelChoice c;
          c.reference = QString::fromStdString(f.path);
          const QFileInfo fi(c.reference);
          c.label = QStringLiteral("%1 (%2)").arg(fi.fileName(), fi.dir().dirName());
          c.kind = QString::fromStdString(f.kind);
          c.detail = QStringLiteral("%1: %2").arg(QString::fromStdString(f.format), QString::fromStdString(f.summary));
          out.push_back(c);
        }
        return out;
      },
      [this](QVector<ModelChoice> models) { emit modelsScanned(models); });
}

void EngineBridge::requestModelInfo(const QString& reference) {
  const std::string storeDir = options_.storeDir.toStdString();
  post([this, reference, storeDir] {
    bool ok = true;
    ModelInfo info;
    QString error;
    if (auto hit = infoCache_.find(reference); hit != infoCache_.end()) {
      info = *hit;
    } else {
      auto resolved = resolve_model(reference.toStdString(), storeDir);
      if (!resolved.ok()) {
        ok = false;
        error = QString::fromStdString(resolved.status().message);
      } else {
        // The header only: the engine loads the weights itself when the job runs.
        auto read = read_model_info(resolved->path, resolved->file("tokenizer"));
        if (!read.ok()) {
          ok = false;
          error = QString::fromStdString(read.status().message);
        } else {
          info = read.value();
          infoCache_.insert(reference, info);
        }
      }
    }
    QMetaObject::invokeMethod(
        this, [this, reference, ok, info, error] { emit modelInfoReady(reference, ok, info, error); }, Qt::QueuedConnection);
  });
}

}  // namespace atelier::bridge
