// Settings and the first start. The dialog's values persist in QSettings and
// come back in a new dialog; engine changes say they need a restart (and
// others do not); the API section stays hidden without an API server;
// "Apply and restart" opens the engine again with the new values. An empty
// store opens on the welcome page, which installs the default models from the
// fixtures mirror with progress and then opens Write; the keyboard
// shortcuts dialog lists every menu action with its shortcut.
#include <QAction>
#include <QCheckBox>
#include <QComboBox>
#include <QDialog>
#include <QGroupBox>
#include <QLabel>
#include <QLineEdit>
#include <QMenuBar>
#include <QProgressBar>
#include <QPushButton>
#include <QSettings>
#include <QSignalSpy>
#include <QSpinBox>
#include <QTabWidget>
#include <QRegularExpression>
#include <QTabBar>
#include <QTableWidget>
#include <QtTest>
#include <httplib.h>

#include <memory>

#include "common/model_picker.h"
#include "models/models_window.h"
#include "paint/paint_tab.h"
#include "settings/settings_dialog.h"
#include "studio/studio_window.h"
#include "ui/ui_test_util.h"
#include "welcome/welcome_page.h"
#include "write/write_tab.h"

using namespace atelier;
using namespace atelier::ui;

namespace {
template <class T>
T* child(QObject* w, const char* name) {
  T* c = w->findChild<T*>(QString::fromLatin1(name));
  if (!c) qFatal("no child %s", name);
  return c;
}
}  // namespace

class SettingsTest : public QObject {
  Q_OBJECT

  std::unique_ptr<uitest::TestHome> home_;

 private slots:
  void initTestCase() { home_ = std::make_unique<uitest::TestHome>(); }

  void settingsPersist() {
    {
      SettingsDialog d(StudioSettings::load(), false);
      child<QSpinBox>(&d, "threadsSpin")->setValue(3);
      child<QSpinBox>(&d, "maxBatchSpin")->setValue(12);
      child<QSpinBox>(&d, "maxWaitSpin")->setValue(40);
      child<QSpinBox>(&d, "kvMemorySpin")->setValue(256);
      child<QSpinBox>(&d, "modelMemorySpin")->setValue(2048);
      auto* kv = child<QComboBox>(&d, "kvTypeBox");
      kv->setCurrentIndex(kv->findData(QStringLiteral("f32")));
      child<QSpinBox>(&d, "previewEverySpin")->setValue(4);
      child<QLineEdit>(&d, "previewDecoderEdit")->setText(QStringLiteral("/x/taesd_decoder.safetensors"));
      child<QLineEdit>(&d, "namingEdit")->setText(QStringLiteral("{model}-{seed}"));
      auto* theme = child<QComboBox>(&d, "themeBox");
      theme->setCurrentIndex(theme->findData(QStringLiteral("light")));
      // Issue 33: the device list holds auto and the CPU (and the CUDA devices found).
      auto* device = child<QComboBox>(&d, "deviceBox");
      QCOMPARE(device->currentData().toString(), QStringLiteral("auto"));
      QVERIFY(device->findData(QStringLiteral("cpu")) >= 0);
      device->setCurrentIndex(device->findData(QStringLiteral("cpu")));
      d.settings().save();
    }
    QSettings().sync();
    const StudioSettings s = StudioSettings::load();
    QCOMPARE(s.threads, 3);
    QCOMPARE(s.maxBatch, 12);
    QCOMPARE(s.maxWaitMs, 40);
    QCOMPARE(s.kvMemoryMiB, 256);
    QCOMPARE(s.modelMemoryMiB, 2048);
    QCOMPARE(s.kvType, QStringLiteral("f32"));
    QCOMPARE(s.previewEverySteps, 4);
    QCOMPARE(s.previewDecoder, QStringLiteral("/x/taesd_decoder.safetensors"));
    QCOMPARE(s.fileNaming, QStringLiteral("{model}-{seed}"));
    QCOMPARE(s.theme, QStringLiteral("light"));
    // A new dialog shows them.
    SettingsDialog again(s, false);
    QCOMPARE(child<QSpinBox>(&again, "maxBatchSpin")->value(), 12);
    QCOMPARE(child<QComboBox>(&again, "kvTypeBox")->currentData().toString(), QStringLiteral("f32"));
    QCOMPARE(s.device, QStringLiteral("cpu"));
    QCOMPARE(child<QComboBox>(&again, "deviceBox")->currentData().toString(), QStringLiteral("cpu"));
    QCOMPARE(again.settings(), s);
    StudioSettings defaults;
    defaults.save();  // for the tests below
  }

  void engineChangesSayTheyNeedARestart() {
    SettingsDialog d(StudioSettings{}, false);
    auto* note = child<QLabel>(&d, "restartNote");
    auto* restart = child<QPushButton>(&d, "restartButton");
    QVERIFY(note->isHidden());
    child<QComboBox>(&d, "themeBox")->setCurrentIndex(1);  // not the engine's
    QVERIFY(note->isHidden());
    child<QSpinBox>(&d, "maxBatchSpin")->setValue(7);
    QVERIFY(!note->isHidden());
    QVERIFY(!restart->isHidden());
    QVERIFY(d.restartNeeded());
    child<QSpinBox>(&d, "maxBatchSpin")->setValue(StudioSettings{}.maxBatch);
    QVERIFY(note->isHidden());
  }

  void theApiSectionNeedsAnApiServer() {
    SettingsDialog without(StudioSettings{}, false);
    QVERIFY(child<QGroupBox>(&without, "apiGroup")->isHidden());
    SettingsDialog with(StudioSettings{}, true);
    QVERIFY(!child<QGroupBox>(&with, "apiGroup")->isHidden());
  }

  // The welcome page's install error points to its own mirror field, not to a command-line flag.
  void welcomeErrorPointsToItsMirrorField() {
    StudioOptions o;
    o.dataDir = home_->home();  // an empty store
    StudioWindow w(o);
    w.show();
    QTRY_VERIFY_WITH_TIMEOUT(w.showingWelcome(), 10000);
    WelcomePage* page = w.welcomePage();
    auto* mirror = child<QLineEdit>(page, "welcomeMirror");
    mirror->clear();
    QTest::keyClicks(mirror, home_->path(QStringLiteral("no-such-mirror")));
    QTest::mouseClick(child<QPushButton>(page, "installButton"), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(page->message().startsWith(QStringLiteral("The install did not finish")), 30000);
    QVERIFY2(!page->message().contains(QStringLiteral("--mirror")), qPrintable(page->message()));
    QVERIFY2(page->message().contains(QStringLiteral("Copy from a mirror folder")), qPrintable(page->message()));
  }

  // Settings shows the store location in use when the field is left empty (it was blank).
  void settingsShowTheCurrentStore() {
    StudioOptions o;
    o.dataDir = home_->home();
    o.welcome = false;
    StudioWindow w(o);
    w.show();
    QTRY_VERIFY_WITH_TIMEOUT(w.bridge()->isOpen(), 20000);
    w.findChild<QAction*>(QStringLiteral("actionSettings"))->trigger();
    QDialog* dialog = nullptr;
    QTRY_VERIFY((dialog = w.findChild<QDialog*>(QStringLiteral("settingsDialog"))) != nullptr);
    auto* store = child<QLineEdit>(dialog, "storeEdit");
    QVERIFY2(store->placeholderText().contains(home_->home()), qPrintable(store->placeholderText()));
    dialog->reject();
  }

  void firstStartInstallsTheDefaultsFromTheMirror() {
    StudioOptions o;
    o.dataDir = home_->home();  // an empty store
    StudioWindow w(o);
    w.show();
    QTRY_VERIFY_WITH_TIMEOUT(w.showingWelcome(), 10000);
    WelcomePage* page = w.welcomePage();
    auto* mirror = child<QLineEdit>(page, "welcomeMirror");
    mirror->clear();
    QTest::keyClicks(mirror, uitest::fixtures());
    QVERIFY(child<QAbstractButton>(page, "fromMirror")->isChecked());
    QSignalSpy installed(page, &WelcomePage::installed);
    QTest::mouseClick(child<QPushButton>(page, "installButton"), Qt::LeftButton);
    QVERIFY(installed.wait(60000));
    QCOMPARE(child<QProgressBar>(page, "welcomeProgress")->value(), 1000);
    QVERIFY(!w.showingWelcome());
    QCOMPARE(w.tabs()->currentWidget(), w.writeTab());
    // Both models are in the store, and the pickers offer them.
    QString err;
    auto* text = child<ModelPicker>(w.writeTab(), "writeModel");
    QTRY_VERIFY_WITH_TIMEOUT(text->reference().startsWith(QStringLiteral("stories260k@")), 10000);
    auto* image = child<ModelPicker>(w.paintTab(), "imageModel");
    QTRY_VERIFY_WITH_TIMEOUT(image->reference().startsWith(QStringLiteral("quickdraw@")), 10000);
    QVERIFY(QDir(home_->home() + QStringLiteral("/blobs/sha256")).entryList(QDir::Files).size() == 2);
  }

  void aStoreWithModelsOpensOnWrite() {
    StudioOptions o;
    o.dataDir = home_->home();  // installed by the test before
    StudioWindow w(o);
    w.show();
    QTRY_VERIFY_WITH_TIMEOUT(w.bridge()->isOpen(), 20000);
    QTest::qWait(300);  // the store's answer has come by now
    QVERIFY(!w.showingWelcome());
  }

  // Settings > API server, as a person sets it: the studio then serves the
  // HTTP API over its own engine, shows the address, and a real HTTP client
  // lists the store's models there; switched off, the port closes.
  void theApiServerRunsFromTheSettings() {
    StudioOptions o;
    o.dataDir = home_->home();
    o.welcome = false;
    StudioWindow w(o);
    w.show();
    QTRY_VERIFY_WITH_TIMEOUT(w.bridge()->isOpen(), 20000);
    QVERIFY(w.apiAddress().isEmpty());
    QAction* open = nullptr;  // File > Settings..., as a person opens it
    for (QAction* a : w.findChildren<QAction*>())
      if (a->text().remove(QLatin1Char('&')).startsWith(QStringLiteral("Settings"))) open = a;
    QVERIFY(open);
    open->trigger();
    SettingsDialog* d = nullptr;
    QTRY_VERIFY_WITH_TIMEOUT((d = w.findChild<SettingsDialog*>()) != nullptr, 5000);
    QVERIFY(!child<QGroupBox>(d, "apiGroup")->isHidden());
    child<QCheckBox>(d, "apiEnabled")->setChecked(true);
    auto* address = child<QLineEdit>(d, "apiAddress");
    address->clear();
    QTest::keyClicks(address, QStringLiteral("127.0.0.1:0"));  // any free port
    d->accept();
    QTRY_VERIFY_WITH_TIMEOUT(!w.apiAddress().isEmpty(), 20000);
    const QUrl url(w.apiAddress());
    QCOMPARE(url.host(), QStringLiteral("127.0.0.1"));
    QVERIFY(url.port() > 0);
    QVERIFY(child<QLabel>(&w, "apiStatus")->text().contains(w.apiAddress()));
    {
      httplib::Client http(url.host().toStdString(), url.port());
      auto res = http.Get("/v1/models");
      QVERIFY(res);
      QCOMPARE(res->status, 200);
      QVERIFY2(res->body.find("stories260k") != std::string::npos, res->body.c_str());
    }
    QVERIFY(StudioSettings::load().apiEnabled);
    StudioSettings off = w.settings();
    off.apiEnabled = false;
    w.applySettings(off, false);
    QTRY_VERIFY_WITH_TIMEOUT(w.apiAddress().isEmpty(), 10000);
    httplib::Client http(url.host().toStdString(), url.port());
    http.set_connection_timeout(2);
    QVERIFY(!http.Get("/health"));
    StudioSettings{}.save();
  }

  void applyAndRestartOpensTheEngineAgain() {
    StudioOptions o;
    o.dataDir = home_->home();
    StudioWindow w(o);
    w.show();
    QTRY_VERIFY_WITH_TIMEOUT(w.bridge()->isOpen(), 20000);
    QSignalSpy opened(w.bridge(), &bridge::EngineBridge::opened);
    StudioSettings next = w.settings();
    next.maxBatch = 5;
    next.kvMemoryMiB = 64;
    next.previewEverySteps = 3;
    w.applySettings(next, /*restart=*/true);
    QVERIFY(opened.wait(20000));
    QVERIFY(opened.at(0).at(0).toBool());
    QCOMPARE(w.bridge()->options().maxBatch, 5);
    QCOMPARE(w.bridge()->options().kvMemoryBytes, int64_t{64} << 20);
    QCOMPARE(w.paintTab()->previewEvery(), 3);
    QCOMPARE(StudioSettings::load().maxBatch, 5);
    // The engine runs jobs after the restart.
    TextRequest r;
    r.model = "stories260k";
    r.prompt = "Once upon a time";
    r.max_new_tokens = 8;
    JobId id = 0;
    w.bridge()->submitText(r, [&](Result<JobId> got) { id = got.ok() ? got.value() : -1; });
    QTRY_VERIFY_WITH_TIMEOUT(id != 0, 10000);
    QVERIFY(id > 0);
    auto state = [&] {
      for (const JobInfo& j : w.bridge()->jobs())
        if (j.id == id) return j.state;
      return JobState::Queued;
    };
    QTRY_COMPARE_WITH_TIMEOUT(state(), JobState::Completed, 30000);
    StudioSettings{}.save();
  }

  void theShortcutsDialogListsEveryAction() {
    StudioOptions o;
    o.dataDir = home_->home();
    StudioWindow w(o);
    w.show();
    w.showShortcuts();
    auto* table = child<QTableWidget>(&w, "shortcutsTable");
    QHash<QString, QString> shown;
    for (int r = 0; r < table->rowCount(); ++r) shown.insert(table->item(r, 1)->text(), table->item(r, 2)->text());
    int actions = 0;
    for (QAction* top : w.menuBar()->actions()) {
      if (!top->menu()) continue;
      for (QAction* a : top->menu()->actions()) {
        if (a->isSeparator()) continue;
        ++actions;
        const QString name = a->text().remove('&');
        QVERIFY2(shown.contains(name), qPrintable(name));
        QVERIFY2(!a->shortcut().isEmpty(), qPrintable(name + QStringLiteral(" has no shortcut")));
        QCOMPARE(shown.value(name), a->shortcut().toString(QKeySequence::NativeText));
      }
    }
    QVERIFY(actions >= 15);
    QVERIFY(shown.value(QStringLiteral("Manage models...")) == QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_M).toString(QKeySequence::NativeText));
  }

  void iconOnlyButtonsHaveAccessibleNames() {
    StudioOptions o;
    o.dataDir = home_->home();
    StudioWindow w(o);
    w.show();
    w.showModels();
    int checked = 0;
    QList<QAbstractButton*> buttons = w.findChildren<QAbstractButton*>();
    buttons += w.modelsWindow()->findChildren<QAbstractButton*>();
    for (QAbstractButton* b : buttons) {
      const QString t = b->text().remove('&').trimmed();
      // Icon-only or a symbol: no word a screen reader could say.
      const bool wordless = t.isEmpty() || !t.contains(QRegularExpression(QStringLiteral("[A-Za-z]{2}")));
      if (!wordless || qobject_cast<QTabBar*>(b->parentWidget())) continue;
      if (b->metaObject()->className() == QLatin1String("QTableCornerButton")) continue;  // Qt's select-all corner
      if (b->metaObject()->className() == QLatin1String("QDockWidgetTitleButton")) continue;  // Qt's own, named by the dock
      if (b->objectName().startsWith(QLatin1String("qt_"))) continue;
      ++checked;
      QVERIFY2(!b->accessibleName().isEmpty(), qPrintable(QStringLiteral("%1 \"%2\" (%3 in %4)").arg(b->objectName(), b->text(), QString::fromLatin1(b->metaObject()->className()), b->parentWidget() ? QString::fromLatin1(b->parentWidget()->metaObject()->className()) + QStringLiteral(" ") + b->parentWidget()->objectName() : QString())));
    }
    QVERIFY(checked >= 2);  // the seed dice and the swap-size button at least
  }
};

QTEST_MAIN(SettingsTest)
#include "settings_test.moc"
