// StoreWorker: the model store seen from Qt (QtCore only). Every store call
// (list, header reads, import, pull, verify, promote, rollback, remove,
// history) runs on the worker's own thread, so hashing a big file never
// blocks the window; answers come back as queued callbacks, progress as
// queued signals. One long task (import, pull, verify) at a time can be
// cancelled: its abort flag is read between hashed chunks.
#pragma once

#include <atelier/engine.h>
#include <atelier/models.h>
#include <atelier/store.h>

#include <QMetaObject>
#include <QObject>
#include <QPointer>
#include <QString>
#include <QThread>
#include <QVector>

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

Q_DECLARE_METATYPE(atelier::StoreModel)

namespace atelier::bridge {

// A file about to be imported, as its header says (shown before the import is confirmed).
struct ImportPreview {
  bool ok = false;
  QString error;           // why it cannot be imported
  QString path, format, kind, architecture, summary;
  QString suggestedName;   // from the file name
  QString tokenizer;       // a llama2.c model's tokenizer found beside it ("" = none needed or none found)
  qint64 bytes = 0;
  ModelInfo text;          // text models: the header's figures
};

// What a model needs in memory at the chosen settings, against what the machine has.
struct MemoryFit {
  qint64 weightBytes = 0, workBytes = 0;  // work: the KV cache (text) or activations (image)
  qint64 availableBytes = 0;              // MemAvailable of /proc/meminfo
  bool fits = false;
  QString text;                            // one line for people
};

// A job that is still to run, as the remove check sees it.
struct PendingJob {
  JobId id = 0;
  QString state;      // "queued" / "running"
  QString reference;  // the request's model reference
};

// A request's `done` that is dropped once `owner` is gone: the worker
// outlives the windows that ask it, and a window closed (or replaced) while
// its request was in flight must not be called back.
template <class F>
auto while_alive(QObject* owner, F f) {
  return [guard = QPointer<QObject>(owner), f = std::move(f)](auto&&... args) mutable {
    if (guard) f(std::forward<decltype(args)>(args)...);
  };
}

class StoreWorker : public QObject {
  Q_OBJECT

 public:
  explicit StoreWorker(QString storeDir, QObject* parent = nullptr);
  ~StoreWorker() override;  // cancels the long task and waits for the thread

  const QString& storeDir() const { return storeDir_; }

  void list(std::function<void(Result<std::vector<StoreModel>>)> done);
  void preview(const QString& path, std::function<void(ImportPreview)> done);
  // Copies and hashes (progress), then records NAME's next version. Cancelled: nothing recorded.
  void import(const QString& path, const QString& name, const QString& tokenizer,
              std::function<void(Result<int>)> done);
  // Installs catalog entries by name from MIRROR (or their URLs), one after the other.
  void pull(const QStringList& names, const QString& mirror, std::function<void(Status)> done);
  void verify(const QString& reference, std::function<void(Result<StoreVerifyReport>)> done);
  void promote(const QString& reference, const QString& channel, std::function<void(Result<int>)> done);
  void rollback(const QString& name, const QString& channel, std::function<void(Result<int>)> done);
  // Refused (InvalidArgument, naming the job) while one of PENDING resolves to the same version.
  void remove(const QString& reference, const QVector<PendingJob>& pending, std::function<void(Status)> done);
  void history(const QString& name, std::function<void(Result<std::vector<StoreAuditEntry>>)> done);
  void catalog(std::function<void(Result<std::vector<CatalogEntry>>)> done);
  // KV_BYTES_BUDGET caps the text estimate (EngineConfig::kv_memory_bytes); KV_TYPE its precision.
  void fit(const QString& reference, qint64 kvBytesBudget, KvType kvType, std::function<void(MemoryFit)> done);

  // The long task in flight stops at its next chunk; a pull stops its
  // download at once, keeping the bytes for the next pull to resume.
  void cancel() { abort_ = true; }
  bool busy() const { return busy_; }

  static qint64 availableMemoryBytes();

 signals:
  // The long task's progress: what it does ("hashing stories260K.gguf"), bytes done and in all (0: unknown).
  void progress(const QString& what, qint64 bytesDone, qint64 bytesTotal);
  void changed();  // the store's content changed (import, pull, promote, rollback, remove)

 private:
  template <class T>
  void run(std::function<T()> work, std::function<void(T)> done, bool changes = false);
  void post(std::function<void()> work);
  bool report(const QString& what, int64_t done, int64_t total);  // worker thread; false = cancelled

  QString storeDir_;
  QThread thread_;
  QObject* context_ = nullptr;  // lives on thread_
  std::atomic<bool> abort_{false}, busy_{false};
  std::shared_ptr<std::atomic<bool>> alive_ = std::make_shared<std::atomic<bool>>(true);
};

template <class T>
void StoreWorker::run(std::function<T()> work, std::function<void(T)> done, bool changes) {
  auto alive = alive_;
  post([this, alive, work = std::move(work), done = std::move(done), changes] {
    T value = work();
    QMetaObject::invokeMethod(
        this, [this, alive, done, changes, value = std::move(value)] {
          if (!*alive) return;
          if (done) done(value);
          if (changes) emit this->changed();
        },
        Qt::QueuedConnection);
  });
}

}  // namespace atelier::bridge
