// The Models window on a test store: the list with what the headers say and
// the sha256 the fixtures' SHA256SUMS gives, import by file and by drop with
// the header shown first, a cancelled import that records nothing and leaves
// no partial blob, verify (and a damaged blob found), promote and roll back,
// pin, history, the memory estimate, and a remove refused while a queued job
// needs the version (then allowed once the job is cancelled).
#include <QComboBox>
#include <QDialog>
#include <QLabel>
#include <QLineEdit>
#include <QMimeData>
#include <QPlainTextEdit>
#include <QProgressBar>
#include <QPushButton>
#include <QSettings>
#include <QSignalSpy>
#include <QTreeWidget>
#include <QListWidget>
#include <QtTest>

#include <fstream>
#include <memory>

#include "bridge/engine_bridge.h"
#include "bridge/store_worker.h"
#include "models/models_window.h"
#include "store/http_server.h"
#include "ui/ui_test_util.h"

using namespace atelier;
using namespace atelier::ui;

namespace {
// The fixtures' own checksum list, not the store's output.
QString fixtureSha256(const QString& relative) {
  QFile f(uitest::fixtures() + QStringLiteral("/SHA256SUMS"));
  if (!f.open(QIODevice::ReadOnly)) return {};
  for (const QByteArray& line : f.readAll().split('\n'))
    if (line.endsWith(QByteArray("./") + relative.toUtf8())) return QString::fromLatin1(line.left(64));
  return {};
}

QTreeWidgetItem* findRow(QTreeWidget* tree, const QString& text) {
  for (int i = 0; i < tree->topLevelItemCount(); ++i) {
    QTreeWidgetItem* top = tree->topLevelItem(i);
    if (top->text(0) == text) return top;
    for (int k = 0; k < top->childCount(); ++k)
      if (top->child(k)->text(0) == text) return top->child(k);
  }
  return nullptr;
}

template <class T>
T* child(QWidget* w, const char* name) {
  T* c = w->findChild<T*>(QString::fromLatin1(name));
  if (!c) qFatal("no child %s", name);
  return c;
}
}  // namespace

class ModelsTest : public QObject {
  Q_OBJECT

  std::unique_ptr<uitest::TestHome> home_;
  std::unique_ptr<bridge::StoreWorker> store_;
  std::unique_ptr<ModelsWindow> window_;

  void click(const char* name) { QTest::mouseClick(child<QPushButton>(window_.get(), name), Qt::LeftButton); }
  QString message() const { return window_->message(); }
  bool selectRef(const QString& ref) {
    [&] { QTRY_VERIFY_WITH_TIMEOUT(findRow(window_->tree(), ref), 10000); }();
    return window_->select(ref);
  }
  // The import dialog the window opens for a file, once its header is read.
  QDialog* importDialog() {
    QDialog* d = nullptr;
    [&] { QTRY_VERIFY_WITH_TIMEOUT((d = window_->findChild<QDialog*>(QStringLiteral("importDialog"))) && d->isVisible(), 10000); }();
    return d;
  }

 private slots:
  void initTestCase() {
    home_ = std::make_unique<uitest::TestHome>();
    QVERIFY(home_->pull({QStringLiteral("stories260k"), QStringLiteral("quickdraw")}));
    store_ = std::make_unique<bridge::StoreWorker>(home_->home());
    window_ = std::make_unique<ModelsWindow>(store_.get(), nullptr);
    window_->show();
  }

  void listShowsEveryVersionWithItsHeader() {
    QTRY_VERIFY_WITH_TIMEOUT(findRow(window_->tree(), QStringLiteral("stories260k@1")), 10000);
    QTreeWidgetItem* text = findRow(window_->tree(), QStringLiteral("stories260k@1"));
    QCOMPARE(text->text(1), QStringLiteral("text"));
    QCOMPARE(text->text(2), QStringLiteral("gguf"));
    QCOMPARE(text->text(3), QStringLiteral("llama"));
    QVERIFY(!text->text(4).isEmpty());  // parameters
    QCOMPARE(text->toolTip(6), QStringLiteral("sha256:") + fixtureSha256(QStringLiteral("text/stories260K.gguf")));
    QVERIFY2(text->text(9).contains(uitest::fixtures()), qPrintable(text->text(9)));  // where from: the mirror
    QTreeWidgetItem* image = findRow(window_->tree(), QStringLiteral("quickdraw@1"));
    QVERIFY(image);
    QCOMPARE(image->text(1), QStringLiteral("image"));
    QCOMPARE(image->toolTip(6), QStringLiteral("sha256:") + fixtureSha256(QStringLiteral("image/quickdraw-cvae.safetensors")));
  }

  // The catalog dialog (Ctrl+Shift+I) is wide enough for its entries and marks what is installed
  // (it opened about 240 px wide with clipped names, installed models unmarked).
  void catalogDialogIsReadableAndMarksInstalled() {
    window_->showPull();
    QDialog* d = nullptr;
    QTRY_VERIFY_WITH_TIMEOUT((d = window_->findChild<QDialog*>(QStringLiteral("pullDialog"))) && d->isVisible(), 10000);
    auto* list = child<QListWidget>(d, "catalogList");
    QVERIFY(list->count() >= 2);
    bool sawInstalled = false;
    for (int i = 0; i < list->count(); ++i) {
      QListWidgetItem* item = list->item(i);
      const QString name = item->data(Qt::UserRole).toString();
      const bool installed = name == QStringLiteral("stories260k") || name == QStringLiteral("quickdraw");
      QCOMPARE(item->text().contains(QStringLiteral("installed")), installed);
      if (installed) {
        sawInstalled = true;
        QVERIFY(!(item->flags() & Qt::ItemIsEnabled) || item->checkState() == Qt::Unchecked);
      }
      // The whole line is read: the dialog is as wide as its longest entry or nearly the screen, and what is longer wraps.
      const int need = std::min(list->fontMetrics().horizontalAdvance(item->text()) + 60, d->screen()->availableGeometry().width() * 9 / 10);
      QVERIFY2(d->width() >= need, qPrintable(QStringLiteral("%1 px for %2").arg(d->width()).arg(item->text())));
      QVERIFY(list->wordWrap());
    }
    QVERIFY(sawInstalled);
    d->reject();
  }

  void memoryEstimateForTheSelection() {
    QVERIFY(selectRef(QStringLiteral("stories260k@1")));
    QTRY_VERIFY_WITH_TIMEOUT(window_->fitText().contains(QStringLiteral("KV cache")), 10000);
    QVERIFY2(window_->fitText().contains(QStringLiteral("— fits")), qPrintable(window_->fitText()));
  }

  void importShowsTheHeaderBeforeConfirming() {
    window_->importFile(uitest::fixtures() + QStringLiteral("/text/stories260K.gguf"));
    QDialog* d = importDialog();
    QVERIFY(child<QLabel>(d, "importHeader")->text().contains(QStringLiteral("llama")));
    // Nothing is imported until the user confirms.
    QVERIFY(!findRow(window_->tree(), QStringLiteral("mystories")));
    auto* name = child<QLineEdit>(d, "importName");
    name->clear();
    QTest::keyClicks(name, QStringLiteral("mystories"));
    QTest::mouseClick(child<QPushButton>(d, "importConfirm"), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(message().contains(QStringLiteral("Imported mystories@1")), 20000);
    QTRY_VERIFY_WITH_TIMEOUT(findRow(window_->tree(), QStringLiteral("mystories@1")), 10000);
    QCOMPARE(findRow(window_->tree(), QStringLiteral("mystories@1"))->toolTip(6),
             QStringLiteral("sha256:") + fixtureSha256(QStringLiteral("text/stories260K.gguf")));
    QCOMPARE(child<QProgressBar>(window_.get(), "progressBar")->value(), 1000);
  }

  void aDroppedFileIsImportedTheSameWay() {
    QMimeData mime;
    mime.setUrls({QUrl::fromLocalFile(uitest::fixtures() + QStringLiteral("/image/quickdraw-cvae.safetensors"))});
    QDragEnterEvent enter(QPoint(10, 10), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(window_.get(), &enter);
    QVERIFY(enter.isAccepted());
    QDropEvent drop(QPointF(10, 10), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(window_.get(), &drop);
    QDialog* d = importDialog();
    auto* name = child<QLineEdit>(d, "importName");
    QCOMPARE(name->text(), QStringLiteral("quickdraw-cvae"));  // suggested from the file name
    QTest::mouseClick(child<QPushButton>(d, "importConfirm"), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(findRow(window_->tree(), QStringLiteral("quickdraw-cvae@1")), 20000);
  }

  void aCancelledImportRecordsNothing() {
    // A file no version holds yet (the 15M synthetic model: 16 chunks to hash).
    const QString big = home_->synthText(QStringLiteral("m15.gguf"));
    QVERIFY(!big.isEmpty());
    window_->importFile(big);
    QDialog* d = importDialog();
    auto* name = child<QLineEdit>(d, "importName");
    name->setText(QStringLiteral("bigone"));
    QTest::mouseClick(child<QPushButton>(d, "importConfirm"), Qt::LeftButton);
    // Cancel at once: the worker sees it at its first hashed chunk.
    QVERIFY(child<QPushButton>(window_.get(), "cancelButton")->isEnabled());
    click("cancelButton");
    QTRY_VERIFY_WITH_TIMEOUT(message().contains(QStringLiteral("Import cancelled")), 20000);
    window_->refresh();
    QSignalSpy listed(window_.get(), &ModelsWindow::listed);
    QVERIFY(listed.wait(10000));
    QVERIFY(!findRow(window_->tree(), QStringLiteral("bigone")));
    // No partial blob is left behind.
    const QStringList tmp = QDir(home_->home() + QStringLiteral("/blobs")).entryList({QStringLiteral("tmp-*")});
    QVERIFY2(tmp.isEmpty(), qPrintable(tmp.join(',')));
    QCOMPARE(QDir(home_->home() + QStringLiteral("/blobs/sha256")).entryList(QDir::Files).size(), 2);  // the two fixture blobs only
  }

  void verifyShowsProgressAndFindsDamage() {
    QVERIFY(selectRef(QStringLiteral("stories260k@1")));
    click("verifyButton");
    QTRY_VERIFY_WITH_TIMEOUT(message().contains(QStringLiteral("verified")), 20000);
    QVERIFY(message().contains(QStringLiteral("every sha256 matches")));
    QCOMPARE(child<QProgressBar>(window_.get(), "progressBar")->value(), 1000);
    // Damage quickdraw's blob (read-only in the store): verify must say so.
    const QString blob = home_->home() + QStringLiteral("/blobs/sha256/") + fixtureSha256(QStringLiteral("image/quickdraw-cvae.safetensors"));
    QFile f(blob);
    QVERIFY(f.setPermissions(QFile::ReadOwner | QFile::WriteOwner));
    QVERIFY(f.open(QIODevice::ReadWrite));
    f.seek(f.size() / 2);
    char c = 0;
    f.getChar(&c);
    f.seek(f.size() / 2);
    f.putChar(static_cast<char>(c ^ 0x5a));
    f.close();
    QVERIFY(selectRef(QStringLiteral("quickdraw@1")));
    click("verifyButton");
    QTRY_VERIFY_WITH_TIMEOUT(message().contains(QStringLiteral("damaged")), 20000);
    QVERIFY2(message().contains(QStringLiteral("corrupted")), qPrintable(message()));
  }

  void promoteThenRollBack() {
    // A second version of mystories (the same file: versions are never reused).
    window_->importFile(uitest::fixtures() + QStringLiteral("/text/stories260K.gguf"));
    QDialog* d = importDialog();
    child<QLineEdit>(d, "importName")->setText(QStringLiteral("mystories"));
    QTest::mouseClick(child<QPushButton>(d, "importConfirm"), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(findRow(window_->tree(), QStringLiteral("mystories@2")), 20000);
    auto* channel = child<QComboBox>(window_.get(), "channelBox");
    channel->setCurrentText(QStringLiteral("prod"));
    QVERIFY(selectRef(QStringLiteral("mystories@1")));
    click("promoteButton");
    QTRY_VERIFY_WITH_TIMEOUT(findRow(window_->tree(), QStringLiteral("mystories@1"))->text(7).contains(QStringLiteral("prod")), 10000);
    QVERIFY(selectRef(QStringLiteral("mystories@2")));
    click("promoteButton");
    QTRY_VERIFY_WITH_TIMEOUT(findRow(window_->tree(), QStringLiteral("mystories@2"))->text(7).contains(QStringLiteral("prod")), 10000);
    QVERIFY(!findRow(window_->tree(), QStringLiteral("mystories@1"))->text(7).contains(QStringLiteral("prod")));
    click("rollbackButton");
    QTRY_VERIFY_WITH_TIMEOUT(findRow(window_->tree(), QStringLiteral("mystories@1"))->text(7).contains(QStringLiteral("prod")), 10000);
    QVERIFY(message().contains(QStringLiteral("rolled back to mystories@1")));
    // The history lists what happened, in order.
    click("historyButton");
    auto* history = child<QPlainTextEdit>(window_.get(), "historyView");
    QTRY_VERIFY_WITH_TIMEOUT(history->toPlainText().contains(QStringLiteral("rollback")), 10000);
    const QString h = history->toPlainText();
    QVERIFY(h.indexOf(QStringLiteral("import mystories@1")) < h.indexOf(QStringLiteral("promote mystories@2")));
    QVERIFY(h.indexOf(QStringLiteral("promote mystories@2")) < h.indexOf(QStringLiteral("rollback")));
  }

  void pinForNewJobs() {
    QVERIFY(selectRef(QStringLiteral("mystories@2")));
    QSignalSpy pinned(window_.get(), &ModelsWindow::pinned);
    click("pinButton");
    QCOMPARE(pinned.count(), 1);
    QCOMPARE(pinned.at(0).at(0).toString(), QStringLiteral("text"));
    QCOMPARE(pinned.at(0).at(1).toString(), QStringLiteral("mystories@2"));
    QCOMPARE(QSettings().value(QStringLiteral("models/pinned/text")).toString(), QStringLiteral("mystories@2"));
  }

  void removeIsRefusedWhileAQueuedJobNeedsIt() {
    bridge::EngineBridge::Options o;
    o.dataDir = home_->home();
    o.pollMs = 100;
    bridge::EngineBridge engine(o);
    ModelsWindow window(store_.get(), &engine);
    window.show();
    QSignalSpy opened(&engine, &bridge::EngineBridge::opened);
    engine.start();
    QVERIFY(opened.wait(20000));
    QVERIFY(opened.at(0).at(0).toBool());
    engine.setPaused(true);  // the job stays queued
    TextRequest r;
    r.model = "stories260k";  // the name alone: resolves to stories260k@1
    r.prompt = "Once upon a time";
    r.max_new_tokens = 4;
    JobId id = 0;
    engine.submitText(r, [&](Result<JobId> got) { id = got.ok() ? got.value() : -1; });
    QTRY_VERIFY_WITH_TIMEOUT(id != 0, 10000);
    QVERIFY(id > 0);
    auto queued = [&] {
      for (const JobInfo& j : engine.jobs())
        if (j.id == id) return j.state == JobState::Queued;
      return false;
    };
    QTRY_VERIFY_WITH_TIMEOUT(queued(), 10000);
    [&] { QTRY_VERIFY_WITH_TIMEOUT(findRow(window.tree(), QStringLiteral("stories260k@1")), 10000); }();
    QVERIFY(window.select(QStringLiteral("stories260k@1")));
    QTest::mouseClick(child<QPushButton>(&window, "removeButton"), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(window.message().contains(QStringLiteral("cannot remove")), 10000);
    QVERIFY2(window.message().contains(QStringLiteral("job #%1 (queued) needs it").arg(id)), qPrintable(window.message()));
    window.refresh();
    QSignalSpy listed(&window, &ModelsWindow::listed);
    QVERIFY(listed.wait(10000));
    QVERIFY(findRow(window.tree(), QStringLiteral("stories260k@1")));  // still there
    // Once the job is cancelled, the same click removes it.
    engine.cancel(id);
    auto cancelled = [&] {
      for (const JobInfo& j : engine.jobs())
        if (j.id == id) return j.state == JobState::Cancelled;
      return false;
    };
    QTRY_VERIFY_WITH_TIMEOUT(cancelled(), 10000);
    QVERIFY(window.select(QStringLiteral("stories260k@1")));
    QTest::mouseClick(child<QPushButton>(&window, "removeButton"), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(window.message().contains(QStringLiteral("removed")), 10000);
    QTRY_VERIFY_WITH_TIMEOUT(!findRow(window.tree(), QStringLiteral("stories260k@1")), 10000);
  }

  // Install from the catalog, paused half way and resumed: the catalog (set
  // with ATELIER_CATALOG) points at a local server whose first response stalls
  // half way; Pause stops the download at once and records nothing, Resume
  // (also offered by a new window, as after a restart) asks only for the
  // bytes after those kept and installs the model whole.
  void aPausedInstallResumesWhereItStopped() {
    const std::string body = [] {
      std::ifstream f(uitest::fixtures().toStdString() + "/text/stories260K.gguf", std::ios::binary);
      return std::string((std::istreambuf_iterator<char>(f)), {});
    }();
    atelier::test::HttpServer server(body, {.pause_at = 500000, .pause_ms = 3000});
    const QString dir = home_->home() + QStringLiteral("/paused-store");
    const QString catalog = home_->home() + QStringLiteral("/slow-catalog.json");
    {
      QFile f(catalog);
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write(QStringLiteral(R"({"format": 1, "models": [{"name": "slowstories", "kind": "text", "architecture": "llama",
        "verified": true, "files": [{"role": "model", "name": "stories260K.gguf", "size": %1, "sha256": "%2",
        "urls": ["%3"], "mirror": ""}]}]})")
                  .arg(body.size())
                  .arg(fixtureSha256(QStringLiteral("text/stories260K.gguf")), QString::fromStdString(server.url()))
                  .toUtf8());
    }
    qputenv("ATELIER_CATALOG", catalog.toUtf8());
    QSettings().setValue(QStringLiteral("models/mirror"), QString());
    bridge::StoreWorker store(dir);
    auto window = std::make_unique<ModelsWindow>(&store, nullptr);
    window->show();
    window->showPull();
    QDialog* d = nullptr;
    QTRY_VERIFY_WITH_TIMEOUT((d = window->findChild<QDialog*>(QStringLiteral("pullDialog"))) && d->isVisible(), 10000);
    auto* list = child<QListWidget>(d, "catalogList");
    QCOMPARE(list->count(), 1);
    list->item(0)->setCheckState(Qt::Checked);
    QTest::mouseClick(d->findChild<QPushButton*>(QStringLiteral("pullConfirm")), Qt::LeftButton);
    auto* pause = child<QPushButton>(window.get(), "pauseButton");
    auto* bar = child<QProgressBar>(window.get(), "progressBar");
    QTRY_VERIFY_WITH_TIMEOUT(pause->isEnabled() && bar->value() > 0, 10000);  // bytes are arriving
    QTest::mouseClick(pause, Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(pause->isEnabled() && pause->text().remove(QLatin1Char('&')) == QStringLiteral("Resume"), 10000);
    QVERIFY2(window->message().contains(QStringLiteral("paused")), qPrintable(window->message()));
    QCOMPARE(QSettings().value(QStringLiteral("models/pausedPull/names")).toStringList(), QStringList{QStringLiteral("slowstories")});
    const size_t requests = server.ranges().size();
    // A new window (as after a restart) offers Resume.
    window = std::make_unique<ModelsWindow>(&store, nullptr);
    window->show();
    pause = child<QPushButton>(window.get(), "pauseButton");
    QVERIFY(pause->isEnabled());
    QCOMPARE(pause->text().remove(QLatin1Char('&')), QStringLiteral("Resume"));
    QTRY_VERIFY_WITH_TIMEOUT(!findRow(window->tree(), QStringLiteral("slowstories@1")), 5000);  // nothing recorded
    QTest::mouseClick(pause, Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(window->message().startsWith(QStringLiteral("Installed")), 20000);
    QTRY_VERIFY_WITH_TIMEOUT(findRow(window->tree(), QStringLiteral("slowstories@1")), 10000);
    const auto ranges = server.ranges();
    QVERIFY(ranges.size() > requests);
    QCOMPARE(QString::fromStdString(ranges.back()), QStringLiteral("bytes=500000-"));
    QVERIFY(!pause->isEnabled());
    QVERIFY(QSettings().value(QStringLiteral("models/pausedPull/names")).toStringList().isEmpty());
    qunsetenv("ATELIER_CATALOG");
  }
};

QTEST_MAIN(ModelsTest)
#include "models_test.moc"
