// EngineBridge: the engine seen from Qt (QtCore only). Engine events are
// copied on the engine's thread and re-emitted as queued signals on the
// thread that owns the bridge (the UI thread); every call that may touch the
// disk or the store (open, submit, list, cancel, model scans) runs on the
// bridge's worker thread, and its answer comes back as a queued callback.
// The UI thread never waits on the engine.
#pragma once

#include <atelier/engine.h>
#include <atelier/models.h>

#include <QHash>
#include <QObject>
#include <QString>
#include <QThread>
#include <QTimer>
#include <QVector>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

Q_DECLARE_METATYPE(atelier::Event)
Q_DECLARE_METATYPE(atelier::JobInfo)
Q_DECLARE_METATYPE(atelier::ModelInfo)

namespace atelier::server {
class ApiServer;
}

namespace atelier::bridge {

// A model the pickers offer: a store version or a loose file.
struct ModelChoice {
  QString reference;  // what a request names: "stories260k@1", or a file path
  QString label;      // "stories260k@1  [prod]" / "file.gguf (folder)"
  QString kind;       // "text" or "image"
  QString detail;     // format, architecture, size, digest
  bool inStore = false;
};

class EngineBridge : public QObject {
  Q_OBJECT

 public:
  struct Options {
    QString dataDir;    // the queue (jobs.db) and, by default, the store
    QString storeDir;   // "" = dataDir
    QStringList modelFolders;  // loose model files the pickers list too
    int threads = 0;
    int pollMs = 500;   // how often the job list is re-read (client mode: the only source of news)
    int engineNice = 5; // the engine's threads yield to the window's (EngineConfig::nice)
    // EngineConfig's batching and memory settings (the studio's Settings).
    int maxBatch = 32;
    int maxWaitMs = 100;
    int64_t kvMemoryBytes = int64_t{1} << 30;
    int64_t modelCacheBytes = int64_t{8} << 30;
    int64_t imageMemoryBytes = 0;  // EngineConfig::image_memory_bytes: an image job's cap (0: the machine's memory)
    KvType kvType = KvType::F16;
    std::string device = "auto";  // EngineConfig::devices (--device)
  };
  explicit EngineBridge(Options options, QObject* parent = nullptr);
  ~EngineBridge() override;  // closes the engine on the worker thread and waits for it

  // Opens the engine off the UI thread: in-process runner when this data
  // dir's queue is free, else a client of the process that runs it.
  // Emits opened() when done.
  void start();
  // Closes the engine (running jobs go back to the queue) and opens it again
  // with OPTIONS; opened() follows. The queue and its jobs survive.
  void restart(Options options);
  bool isOpen() const { return open_; }
  bool executes() const { return executes_; }  // false: another process runs the queue
  const Options& options() const { return options_; }

  using SubmitDone = std::function<void(atelier::Result<atelier::JobId>)>;
  using StatusDone = std::function<void(atelier::Status)>;
  // Each callback runs later on the bridge's thread, never inside the call.
  void submitText(const atelier::TextRequest& request, SubmitDone done = {});
  void submitImage(const atelier::ImageRequest& request, SubmitDone done = {});
  void cancel(atelier::JobId id, StatusDone done = {});
  void setPriority(atelier::JobId id, int priority, StatusDone done = {});
  // A new job with the same request (and so the same seed) as job ID.
  void retry(atelier::JobId id, SubmitDone done = {});
  void setPaused(bool paused);
  bool paused() const { return paused_; }
  void clearFinished(std::function<void(int)> done = {});
  void refreshJobs();  // re-read the job list now (jobsChanged follows if anything changed)
  void scanModels();   // -> modelsScanned
  // Loads the text model's header (info, chat template) once per reference -> modelInfoReady.
  void requestModelInfo(const QString& reference);
  // The local HTTP API (app/server/) over this engine: on at ADDRESS
  // ("HOST:PORT", port 0 = any free one) with KEY ("" = any token), or off.
  // Kept across restarts. -> apiServerChanged
  void setApiServer(bool enabled, const QString& address, const QString& key);
  // Any slow read: runs WORK on the worker thread, then DONE(result) here.
  template <class T>
  void run(std::function<T(atelier::Engine*)> work, std::function<void(T)> done);

  // The last known state of every job (newest first), as the list poll and events made it.
  QVector<atelier::JobInfo> jobs() const;

 signals:
  void opened(bool ok, bool executes, const QString& message);
  // Before opened(true, true, ...): the device the engine chose, and why (Engine::device()).
  void deviceChosen(const QString& name, const QString& why);
  void event(const atelier::Event& event);          // every engine event, in order per job
  void jobsChanged(const QVector<atelier::JobInfo>& changed, const QVector<atelier::JobId>& removed);
  void pausedChanged(bool paused);
  void modelsScanned(const QVector<atelier::bridge::ModelChoice>& models);
  void modelInfoReady(const QString& reference, bool ok, const atelier::ModelInfo& info, const QString& error);
  void errorOccurred(const QString& message);      // a slow call failed with nobody to tell
  // The API server is listening at ADDRESS ("http://HOST:PORT"), or is off
  // (ADDRESS empty; ERROR says why when it could not start).
  void apiServerChanged(bool running, const QString& address, const QString& error);

 private:
  void post(std::function<void()> work);  // to the worker thread
  void poll();                            // worker: list, diff, emit
  void applyList(std::vector<atelier::JobInfo> list);

  Options options_;
  QThread worker_;
  QObject* workerContext_ = nullptr;  // lives on worker_
  void applyApiServer();                  // worker: (re)start or stop the server as api_ says
  void stopApiServer();                   // worker: before the engine closes
  std::unique_ptr<atelier::Engine> engine_;  // touched only on the worker thread (and its own threads)
  struct ApiSettings {
    bool enabled = false;
    QString address, key;
  } api_;                                 // worker thread only
  std::unique_ptr<atelier::server::ApiServer> apiServer_;  // worker thread only; stopped before engine_ closes
  uint64_t subscription_ = 0;
  std::atomic<bool> open_{false}, executes_{false}, paused_{false};
  std::atomic<bool> polling_{false};
  QTimer pollTimer_;
  mutable std::mutex jobsMutex_;
  QHash<atelier::JobId, atelier::JobInfo> jobs_;  // UI thread writes, any thread reads under the mutex
  std::vector<atelier::JobId> order_;
  std::shared_ptr<std::atomic<bool>> alive_ = std::make_shared<std::atomic<bool>>(true);
  QHash<QString, atelier::ModelInfo> infoCache_;  // worker thread only
};

template <class T>
void EngineBridge::run(std::function<T(atelier::Engine*)> work, std::function<void(T)> done) {
  post([this, work = std::move(work), done = std::move(done)] {
    T value = work(engine_.get());
    QMetaObject::invokeMethod(this, [done, value = std::move(value)] { if (done) done(value); }, Qt::QueuedConnection);
  });
}

// Where the studio keeps its data by default: the engine's default data dir.
QString defaultDataDir();

}  // namespace atelier::bridge

Q_DECLARE_METATYPE(atelier::bridge::ModelChoice)
