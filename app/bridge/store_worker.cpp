#include "bridge/store_worker.h"

#include <atelier/tools.h>

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QLocale>
#include <QRegularExpression>

#include <algorithm>

namespace atelier::bridge {

StoreWorker::StoreWorker(QString storeDir, QObject* parent) : QObject(parent), storeDir_(std::move(storeDir)) {
  qRegisterMetaType<atelier::StoreModel>();
  thread_.setObjectName(QStringLiteral("atelier-store"));
  context_ = new QObject;
  context_->moveToThread(&thread_);
  connect(&thread_, &QThread::finished, context_, &QObject::deleteLater);
  thread_.start();
}

StoreWorker::~StoreWorker() {
  *alive_ = false;
  abort_ = true;
  thread_.quit();
  thread_.wait();
}

void StoreWorker::post(std::function<void()> work) {
  QMetaObject::invokeMethod(context_, std::move(work), Qt::QueuedConnection);
}

bool StoreWorker::report(const QString& what, int64_t done, int64_t total) {
  auto alive = alive_;
  QMetaObject::invokeMethod(
      this, [this, alive, what, done, total] {
        if (*alive) emit progress(what, done, total);
      },
      Qt::QueuedConnection);
  return !abort_;
}

qint64 StoreWorker::availableMemoryBytes() {
  QFile f(QStringLiteral("/proc/meminfo"));
  if (!f.open(QIODevice::ReadOnly)) return 0;
  const QString text = QString::fromLatin1(f.readAll());
  const auto m = QRegularExpression(QStringLiteral("MemAvailable:\\s+(\\d+) kB")).match(text);
  return m.hasMatch() ? m.captured(1).toLongLong() * 1024 : 0;
}

namespace {
Result<std::unique_ptr<Store>> openStore(const QString& dir, bool create) { return Store::open(dir.toStdString(), create); }

// The name a file suggests: letters, digits, '.', '_', '-' from its stem, lower case.
QString suggestName(const QString& path) {
  QString stem = QFileInfo(path).completeBaseName().toLower();
  stem.replace(QRegularExpression(QStringLiteral("[^a-z0-9._-]+")), QStringLiteral("-"));
  while (stem.startsWith('-') || stem.startsWith('.')) stem.remove(0, 1);
  if (stem.startsWith(QLatin1String("sha256"))) stem.prepend(QStringLiteral("m-"));
  return stem.isEmpty() ? QStringLiteral("model") : stem;
}
}  // namespace

void StoreWorker::list(std::function<void(Result<std::vector<StoreModel>>)> done) {
  const QString dir = storeDir_;
  run<Result<std::vector<StoreModel>>>(
      [dir]() -> Result<std::vector<StoreModel>> {
        auto st = openStore(dir, false);
        if (!st.ok()) {
          if (st.status().code == StatusCode::NotFound) return std::vector<StoreModel>{};  // an empty store
          return st.status();
        }
        return st.value()->list();
      },
      std::move(done));
}

void StoreWorker::preview(const QString& path, std::function<void(ImportPreview)> done) {
  run<ImportPreview>(
      [path]() {
        ImportPreview p;
        p.path = path;
        p.suggestedName = suggestName(path);
        const QFileInfo fi(path);
        if (!fi.exists()) {
          p.error = QObject::tr("%1 does not exist; choose a model file").arg(path);
          return p;
        }
        if (fi.isDir()) {
          p.error = QObject::tr("%1 is a folder; the store imports model files (a diffusers folder: import its "
                                "single-file checkpoint, or run it from the Paint model list as a folder)").arg(path);
          return p;
        }
        p.bytes = fi.size();
        const std::string parent = fi.absolutePath().toStdString();
        for (const ModelFile& f : scan_model_folders({parent})) {
          if (QFileInfo(QString::fromStdString(f.path)).absoluteFilePath() != fi.absoluteFilePath()) continue;
          p.format = QString::fromStdString(f.format);
          p.kind = QString::fromStdString(f.kind);
          p.summary = QString::fromStdString(f.summary);
        }
        if (p.format.isEmpty() || p.format == QLatin1String("unknown")) {
          p.error = p.summary.isEmpty() ? QObject::tr("%1 is not a model file Atelier reads (GGUF, safetensors, .ckpt/.pth, "
                                                      "llama2.c .bin)").arg(fi.fileName())
                                        : p.summary;
          return p;
        }
        if (p.format == QLatin1String("llama2c")) {
          // A llama2.c checkpoint needs its tokenizer; the usual names beside it.
          for (const char* name : {"tokenizer.bin", "tok512.bin"})
            if (QFileInfo::exists(fi.dir().filePath(QLatin1String(name)))) {
              p.tokenizer = fi.dir().filePath(QLatin1String(name));
              break;
            }
        }
        if (p.kind == QLatin1String("text")) {
          auto info = read_model_info(path.toStdString(), p.tokenizer.toStdString());
          if (!info.ok()) {
            p.error = QString::fromStdString(info.status().message);
            return p;
          }
          p.text = info.value();
          p.architecture = QString::fromStdString(p.text.architecture);
        }
        p.ok = true;
        return p;
      },
      std::move(done));
}

void StoreWorker::import(const QString& path, const QString& name, const QString& tokenizer, std::function<void(Result<int>)> done) {
  const QString dir = storeDir_;
  abort_ = false;
  busy_ = true;
  run<Result<int>>(
      [this, dir, path, name, tokenizer]() -> Result<int> {
        auto st = openStore(dir, true);
        if (!st.ok()) {
          busy_ = false;
          return st.status();
        }
        std::vector<StoreImportFile> files{{path.toStdString(), "model"}};
        if (!tokenizer.isEmpty()) files.push_back({tokenizer.toStdString(), "tokenizer"});
        StoreImportOptions o;
        o.notes = "imported from " + path.toStdString();
        const QString what = tr("hashing %1").arg(QFileInfo(path).fileName());
        o.on_progress = [this, what](int64_t d, int64_t t) { return report(what, d, t); };
        auto r = st.value()->import(files, name.toStdString(), o);
        busy_ = false;
        return r;
      },
      std::move(done), true);
}

void StoreWorker::pull(const QStringList& names, const QString& mirror, std::function<void(Status)> done) {
  const QString dir = storeDir_;
  abort_ = false;
  busy_ = true;
  run<Status>(
      [this, dir, names, mirror]() -> Status {
        struct Idle {
          std::atomic<bool>& b;
          ~Idle() { b = false; }
        } idle{busy_};
        auto catalog = load_catalog(default_catalog_path());
        if (!catalog.ok()) return catalog.status();
        auto st = openStore(dir, true);
        if (!st.ok()) return st.status();
        for (const QString& name : names) {
          if (abort_) return Status::error(StatusCode::Cancelled, "the install was cancelled; what was downloaded is kept and resumes next time");
          auto it = std::find_if(catalog->begin(), catalog->end(), [&](const CatalogEntry& e) { return e.name == name.toStdString(); });
          if (it == catalog->end())
            return Status::error(StatusCode::NotFound, "the catalog has no model \"" + name.toStdString() + "\"");
          PullOptions o;
          o.mirror = mirror.toStdString();
          o.should_stop = [this] { return abort_.load(); };  // a pause or cancel stops the transfer at once
          o.on_progress = [this, name](const PullProgress& p) {
            report(tr("installing %1 (%2)").arg(name, QString::fromStdString(p.file)), p.bytes_done, p.bytes_total);
          };
          auto r = st.value()->pull(*it, o);
          if (!r.ok()) return r.status();
        }
        return Status{};
      },
      std::move(done), true);
}

void StoreWorker::verify(const QString& reference, std::function<void(Result<StoreVerifyReport>)> done) {
  const QString dir = storeDir_;
  abort_ = false;
  busy_ = true;
  run<Result<StoreVerifyReport>>(
      [this, dir, reference]() -> Result<StoreVerifyReport> {
        struct Idle {
          std::atomic<bool>& b;
          ~Idle() { b = false; }
        } idle{busy_};
        auto st = openStore(dir, false);
        if (!st.ok()) return st.status();
        const QString what = tr("verifying %1").arg(reference);
        return st.value()->verify(reference.toStdString(), [this, what](int64_t d, int64_t t) { return report(what, d, t); });
      },
      std::move(done));
}

void StoreWorker::promote(const QString& reference, const QString& channel, std::function<void(Result<int>)> done) {
  const QString dir = storeDir_;
  run<Result<int>>(
      [dir, reference, channel]() -> Result<int> {
        auto st = openStore(dir, false);
        if (!st.ok()) return st.status();
        return st.value()->promote(reference.toStdString(), channel.toStdString());
      },
      std::move(done), true);
}

void StoreWorker::rollback(const QString& name, const QString& channel, std::function<void(Result<int>)> done) {
  const QString dir = storeDir_;
  run<Result<int>>(
      [dir, name, channel]() -> Result<int> {
        auto st = openStore(dir, false);
        if (!st.ok()) return st.status();
        return st.value()->rollback(name.toStdString(), channel.toStdString());
      },
      std::move(done), true);
}

void StoreWorker::remove(const QString& reference, const QVector<PendingJob>& pending, std::function<void(Status)> done) {
  const QString dir = storeDir_;
  run<Status>(
      [dir, reference, pending]() -> Status {
        auto st = openStore(dir, false);
        if (!st.ok()) return st.status();
        auto target = st.value()->resolve(reference.toStdString());
        if (!target.ok()) return target.status();
        // The store does not know the queue: a job that would resolve to this
        // version when it runs keeps the version (cancel it, or wait).
        for (const PendingJob& j : pending) {
          auto v = st.value()->resolve(j.reference.toStdString());
          if (!v.ok() || v->model != target->model || v->number != target->number) continue;
          return Status::error(StatusCode::InvalidArgument,
                               "cannot remove " + target->model + "@" + std::to_string(target->number) + ": job #" +
                                   std::to_string(j.id) + " (" + j.state.toStdString() + ") needs it; cancel that job or wait until it finishes");
        }
        return st.value()->remove(target->model + "@" + std::to_string(target->number));
      },
      std::move(done), true);
}

void StoreWorker::history(const QString& name, std::function<void(Result<std::vector<StoreAuditEntry>>)> done) {
  const QString dir = storeDir_;
  run<Result<std::vector<StoreAuditEntry>>>(
      [dir, name]() -> Result<std::vector<StoreAuditEntry>> {
        auto st = openStore(dir, false);
        if (!st.ok()) return st.status();
        return st.value()->history(name.toStdString());
      },
      std::move(done));
}

void StoreWorker::catalog(std::function<void(Result<std::vector<CatalogEntry>>)> done) {
  run<Result<std::vector<CatalogEntry>>>([]() { return load_catalog(default_catalog_path()); }, std::move(done));
}

void StoreWorker::fit(const QString& reference, qint64 kvBytesBudget, KvType kvType, std::function<void(MemoryFit)> done) {
  const QString dir = storeDir_;
  run<MemoryFit>(
      [dir, reference, kvBytesBudget, kvType]() {
        MemoryFit f;
        f.availableBytes = availableMemoryBytes();
        auto st = openStore(dir, false);
        if (!st.ok()) {
          f.text = QString::fromStdString(st.status().message);
          return f;
        }
        auto v = st.value()->resolve(reference.toStdString());
        if (!v.ok()) {
          f.text = QString::fromStdString(v.status().message);
          return f;
        }
        for (const StoreFile& file : v->files) f.weightBytes += file.size;
        if (v->kind == "text") {
          // KV: K and V for every layer and context position, at the cache's precision, capped by the budget.
          const StoreFile* model = nullptr;
          const StoreFile* tok = nullptr;
          for (const StoreFile& file : v->files) {
            if (file.role == "model") model = &file;
            if (file.role == "tokenizer") tok = &file;
          }
          if (model) {
            if (auto info = read_model_info(model->path, tok ? tok->path : ""); info.ok() && info->n_heads > 0) {
              const int64_t ctx = default_context_tokens(info->n_ctx_train);
              const int64_t kvDim = int64_t{info->n_embd} * (info->n_kv_heads > 0 ? info->n_kv_heads : info->n_heads) / info->n_heads;
              f.workBytes = std::min<int64_t>(kv_type_bytes(kvType, 2 * int64_t{info->n_layers} * ctx * kvDim), kvBytesBudget);
            }
          }
        } else {
          // Activations of one image at its native size: about the weights again per 512x512 (UNet, VAE decode).
          const double side = v->native_resolution > 0 ? static_cast<double>(v->native_resolution) / 512.0 : 0.25;
          f.workBytes = static_cast<qint64>(static_cast<double>(f.weightBytes) * side * side);
        }
        const QLocale loc;
        const qint64 need = f.weightBytes + f.workBytes;
        f.fits = f.availableBytes == 0 || need < f.availableBytes;
        f.text = QObject::tr("%1: needs about %2 (weights %3 + %4 %5); this machine has %6 free — %7")
                     .arg(reference, loc.formattedDataSize(need), loc.formattedDataSize(f.weightBytes),
                          v->kind == "text" ? QObject::tr("KV cache") : QObject::tr("activations"), loc.formattedDataSize(f.workBytes),
                          f.availableBytes ? loc.formattedDataSize(f.availableBytes) : QObject::tr("an unknown amount"),
                          f.fits ? QObject::tr("fits") : QObject::tr("does NOT fit"));
        return f;
      },
      std::move(done));
}

}  // namespace atelier::bridge
