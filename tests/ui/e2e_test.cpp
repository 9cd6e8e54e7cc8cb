// End to end: the real atelier-studio binary on an X server (Xvfb), with a
// temporary ATELIER_HOME holding the fixture models, driven by keystrokes
// (xdotool) as a person would: a chat with stories260k, a QuickDraw doodle,
// then (after a restart, which keeps the settings) a narrow SD image. The
// studio saves screenshots of Write mid-stream, Paint mid-generation and
// done, and the queue (ATELIER_STUDIO_SHOTS) into the build folder's
// studio-shots/, and the X screen is captured too (ImageMagick's import).
// The results are checked through the job database with the CLI. Last, from
// an empty ATELIER_HOME: the first-start page installs the default models
// from the fixtures mirror, Write generates, and the engine monitor is opened
// while 8 text jobs and an image run; the studio saves the monitor, History
// and the Models window (monitor.png, history.png, models.png) beside the X
// screen captures.
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QSettings>
#include <QtTest>

#include <memory>

#include "ui/ui_test_util.h"
#include "write/conversation_store.h"

using namespace atelier;
using namespace atelier::ui;

class EndToEndTest : public QObject {
  Q_OBJECT

  std::unique_ptr<uitest::TestHome> home_;
  uitest::XServer x_;
  QString shots_;
  QString sd_;
  QString homeDir_, configDir_;  // "" = home_'s

  QProcessEnvironment env() const {
    QProcessEnvironment e = QProcessEnvironment::systemEnvironment();
    e.insert(QStringLiteral("DISPLAY"), x_.display());
    e.insert(QStringLiteral("QT_QPA_PLATFORM"), QStringLiteral("xcb"));
    e.insert(QStringLiteral("ATELIER_HOME"), homeDir_.isEmpty() ? home_->home() : homeDir_);
    e.insert(QStringLiteral("XDG_CONFIG_HOME"), configDir_.isEmpty() ? home_->path(QStringLiteral("config")) : configDir_);
    e.insert(QStringLiteral("ATELIER_STUDIO_SHOTS"), shots_);
    return e;
  }

  int x(const QStringList& args) {
    QProcess p;
    p.setProcessEnvironment(env());
    p.start(QStringLiteral("xdotool"), args);
    if (!p.waitForFinished(20000)) return -1;
    return p.exitCode();
  }

  QJsonArray jobs() {
    QProcess p;
    p.setProcessEnvironment(env());
    p.start(QStringLiteral(ATELIER_BINARY), {QStringLiteral("queue"), QStringLiteral("list"), QStringLiteral("--json")});
    p.waitForFinished(20000);
    QJsonArray out;
    for (const QByteArray& line : p.readAllStandardOutput().split('\n')) {
      const QJsonDocument d = QJsonDocument::fromJson(line);
      if (d.isObject()) out.append(d.object());
      else if (d.isArray()) for (const auto& v : d.array()) out.append(v);
    }
    return out;
  }

  int countState(const QString& kind, const QString& state) {
    int n = 0;
    for (const auto& v : jobs()) {
      const QJsonObject j = v.toObject();
      if (j.value(QStringLiteral("state")).toString() == state && j.value(QStringLiteral("kind")).toString(QStringLiteral("text")) == kind) ++n;
    }
    return n;
  }

  bool startStudio(QProcess& studio) {
    studio.setProcessEnvironment(env());
    studio.setProcessChannelMode(QProcess::ForwardedChannels);
    studio.start(QStringLiteral(ATELIER_STUDIO), {QStringLiteral("--threads"), QStringLiteral("2"), home_->path(QStringLiteral("models"))});
    if (!studio.waitForStarted(10000)) return false;
    // The window is up and has keyboard focus.
    for (int i = 0; i < 100 && studio.state() == QProcess::Running; ++i) {
      if (x({QStringLiteral("search"), QStringLiteral("--onlyvisible"), QStringLiteral("--name"), QStringLiteral("^Atelier$"),
             QStringLiteral("windowfocus"), QStringLiteral("--sync")}) == 0)
        return true;
      QTest::qWait(200);
    }
    return false;
  }

  void closeStudio(QProcess& studio) {
    x({QStringLiteral("key"), QStringLiteral("ctrl+q")});
    if (!studio.waitForFinished(20000)) {
      studio.terminate();
      studio.waitForFinished(5000);
    }
  }

  void screen(const QString& name) {
    QProcess p;
    p.setProcessEnvironment(env());
    p.start(QStringLiteral("import"), {QStringLiteral("-window"), QStringLiteral("root"), QDir(shots_).filePath(name)});
    p.waitForFinished(20000);
  }

  int cli(const QStringList& args, QByteArray* out = nullptr) {
    QProcess p;
    p.setProcessEnvironment(env());
    p.start(QStringLiteral(ATELIER_BINARY), args);
    if (!p.waitForFinished(60000)) return -1;
    if (out) *out = p.readAllStandardOutput();
    return p.exitCode();
  }

  int installedModels() {
    QByteArray out;
    if (cli({QStringLiteral("models"), QStringLiteral("list"), QStringLiteral("--json")}, &out) != 0) return -1;
    return static_cast<int>(out.trimmed().isEmpty() ? 0 : out.trimmed().split('\n').size());
  }

 private slots:
  void initTestCase() {
    if (QStandardPaths::findExecutable(QStringLiteral("Xvfb")).isEmpty() ||
        QStandardPaths::findExecutable(QStringLiteral("xdotool")).isEmpty() ||
        QStandardPaths::findExecutable(QStringLiteral("import")).isEmpty())
      QFAIL("Xvfb, xdotool and ImageMagick's import are needed (installer/setup.sh installs them)");
    home_ = std::make_unique<uitest::TestHome>();
    shots_ = QDir(QCoreApplication::applicationDirPath()).filePath(QStringLiteral("studio-shots"));
    QDir(shots_).removeRecursively();
    QDir().mkpath(shots_);
    QVERIFY(home_->pull({QStringLiteral("stories260k"), QStringLiteral("quickdraw")}));
    QDir().mkpath(home_->path(QStringLiteral("models")));
    sd_ = home_->synthSd(QStringLiteral("models/sd-narrow.safetensors"));
    QVERIFY(!sd_.isEmpty());
    QString why;
    QVERIFY2(x_.start(&why), qPrintable(why));
  }

  void chatThenDoodle() {
    {
      // What a creator would have set last time: a longer answer, the doodle model and prompt.
      QSettings s(home_->path(QStringLiteral("config/atelier/studio.conf")), QSettings::IniFormat);
      s.setValue(QStringLiteral("write/maxTokens"), 200);
      s.setValue(QStringLiteral("write/model"), QStringLiteral("stories260k"));
      // Greedy, so the answer (and the mid-stream screenshot at its 9th token) is the same every run.
      s.setValue(QStringLiteral("write/temperature"), 0.0);
      s.setValue(QStringLiteral("write/seed"), QStringLiteral("42"));
      s.setValue(QStringLiteral("write/seedLocked"), true);
      s.setValue(QStringLiteral("paint/model"), QStringLiteral("quickdraw"));
      s.setValue(QStringLiteral("paint/prompt"), QStringLiteral("airplane"));
    }
    QProcess studio;
    QVERIFY(startStudio(studio));
    QTest::qWait(1500);  // the engine opens and the pickers fill
    QCOMPARE(x({QStringLiteral("type"), QStringLiteral("--delay"), QStringLiteral("30"), QStringLiteral("Tell me a story about a dragon")}), 0);
    QCOMPARE(x({QStringLiteral("key"), QStringLiteral("ctrl+Return")}), 0);
    QTRY_VERIFY_WITH_TIMEOUT(countState(QStringLiteral("text"), QStringLiteral("completed")) == 1, 60000);
    QVERIFY(QFile::exists(QDir(shots_).filePath(QStringLiteral("write-midstream.png"))));
    screen(QStringLiteral("screen-write.png"));
    QCOMPARE(x({QStringLiteral("key"), QStringLiteral("ctrl+2")}), 0);
    QTest::qWait(300);
    QCOMPARE(x({QStringLiteral("key"), QStringLiteral("ctrl+Return")}), 0);
    QTRY_VERIFY_WITH_TIMEOUT(countState(QStringLiteral("image"), QStringLiteral("completed")) == 1, 60000);
    QTest::qWait(800);
    screen(QStringLiteral("screen-doodle.png"));
    closeStudio(studio);
  }

  void sdImageAfterRestart() {
    {
      QSettings s(home_->path(QStringLiteral("config/atelier/studio.conf")), QSettings::IniFormat);
      QCOMPARE(s.value(QStringLiteral("studio/tab")).toInt(), 1);  // Paint was open when it closed
      s.setValue(QStringLiteral("paint/model"), sd_);
      s.setValue(QStringLiteral("paint/prompt"), QStringLiteral("a lighthouse on a cliff at dusk"));
      s.setValue(QStringLiteral("paint/steps"), 12);
      s.setValue(QStringLiteral("paint/width"), 192);
      s.setValue(QStringLiteral("paint/height"), 192);
    }
    QProcess studio;
    QVERIFY(startStudio(studio));
    QTest::qWait(1500);
    QCOMPARE(x({QStringLiteral("key"), QStringLiteral("ctrl+Return")}), 0);
    QTRY_VERIFY_WITH_TIMEOUT(countState(QStringLiteral("image"), QStringLiteral("completed")) == 2, 180000);
    QTRY_VERIFY_WITH_TIMEOUT(QFile::exists(QDir(shots_).filePath(QStringLiteral("queue.png"))), 10000);
    for (const char* f : {"write-midstream.png", "paint-midgeneration.png", "paint-done.png", "queue.png"})
      QVERIFY2(QImage(QDir(shots_).filePath(QString::fromLatin1(f))).width() > 200, f);
    screen(QStringLiteral("screen-sd.png"));
    closeStudio(studio);
    QCOMPARE(studio.exitCode(), 0);
  }

  // Esc after Regenerate, with focus on a button (not the prompt): the job is cancelled.
  // Then a chat past its context under each overflow policy, from conversations saved with a 160-token context.
  void escAfterRegenerateAndChatsPastTheirContext() {
    const QString slow = home_->synthText(QStringLiteral("models/m15.gguf"));
    QVERIFY(!slow.isEmpty());
    {
      QSettings s(home_->path(QStringLiteral("config/atelier/studio.conf")), QSettings::IniFormat);
      s.setValue(QStringLiteral("studio/tab"), 0);
      s.setValue(QStringLiteral("write/model"), slow);
      s.setValue(QStringLiteral("write/maxTokens"), 250);  // m15.gguf holds 256 tokens
    }
    QProcess studio;
    QVERIFY(startStudio(studio));
    QTest::qWait(1500);
    const int cancelledBefore = countState(QStringLiteral("text"), QStringLiteral("cancelled"));
    const int completedBefore = countState(QStringLiteral("text"), QStringLiteral("completed"));
    QCOMPARE(x({QStringLiteral("type"), QStringLiteral("--delay"), QStringLiteral("30"), QStringLiteral("hi")}), 0);
    QCOMPARE(x({QStringLiteral("key"), QStringLiteral("ctrl+Return")}), 0);
    QTRY_VERIFY_WITH_TIMEOUT(countState(QStringLiteral("text"), QStringLiteral("completed")) == completedBefore + 1, 120000);
    QCOMPARE(x({QStringLiteral("key"), QStringLiteral("Tab")}), 0);  // focus leaves the prompt for the buttons
    QCOMPARE(x({QStringLiteral("key"), QStringLiteral("ctrl+r")}), 0);  // Regenerate
    QTRY_VERIFY_WITH_TIMEOUT(countState(QStringLiteral("text"), QStringLiteral("running")) == 1, 30000);
    QCOMPARE(x({QStringLiteral("key"), QStringLiteral("Escape")}), 0);
    QTRY_VERIFY_WITH_TIMEOUT(countState(QStringLiteral("text"), QStringLiteral("cancelled")) == cancelledBefore + 1, 20000);
    screen(QStringLiteral("screen-esc-after-regenerate.png"));
    closeStudio(studio);

    // One conversation per policy, each already past a 160-token context.
    for (const QString& policy : {QStringLiteral("truncate-middle"), QStringLiteral("rolling-window"), QStringLiteral("stop-at-limit")}) {
      qint64 id = 0;
      {
        ConversationStore store(home_->home());
        Conversation c;
        c.id = id = store.allocateId();
        c.title = policy;
        c.model = QStringLiteral("stories260k");
        c.system = QStringLiteral("Tell short stories.");
        c.contextTokens = 160;
        c.overflow = policy;
        for (int i = 0; i < 8; ++i) {
          c.turns.push_back({QStringLiteral("user"), {QStringLiteral("Story %1 about a cat and a dog in the park.").arg(i)}, 0, {}});
          c.turns.push_back({QStringLiteral("assistant"), {QStringLiteral("Once upon a time a cat and a dog played ball in the park all day.")}, 0, {}});
        }
        store.save(c);
        store.flush();
      }
      {
        QSettings s(home_->path(QStringLiteral("config/atelier/studio.conf")), QSettings::IniFormat);
        s.setValue(QStringLiteral("write/conversation"), id);
        s.setValue(QStringLiteral("write/model"), QStringLiteral("stories260k"));
        s.setValue(QStringLiteral("write/maxTokens"), 24);
      }
      const int before = static_cast<int>(jobs().size());
      qint64 lastId = 0;  // this run's job comes after every earlier one
      for (const auto& v : jobs()) lastId = std::max<qint64>(lastId, v.toObject().value(QStringLiteral("id")).toInteger());
      QVERIFY(startStudio(studio));
      QTest::qWait(1500);
      QCOMPARE(x({QStringLiteral("type"), QStringLiteral("--delay"), QStringLiteral("20"), QStringLiteral("And the last one?")}), 0);
      QCOMPARE(x({QStringLiteral("key"), QStringLiteral("ctrl+Return")}), 0);
      if (policy == QStringLiteral("stop-at-limit")) {
        // Refused before submitting: the chat says so (screenshot), the message is kept, no job, no empty answer.
        QTRY_VERIFY_WITH_TIMEOUT(
            [&] {
              ConversationStore store(home_->home());
              for (const Conversation& c : store.loadAll())
                if (c.id == id) return c.turns.size() == 17 && c.turns.back().role == QStringLiteral("user");
              return false;
            }(),
            20000);
        QTest::qWait(500);
        QCOMPARE(static_cast<int>(jobs().size()), before);
      } else {
        QJsonObject job;
        auto finished = [&] {
          job = {};
          for (const auto& v : jobs())  // this run's job: the newest that asked it
            if (v.toObject().value(QStringLiteral("prompt")).toString().contains(QStringLiteral("And the last one?")) &&
                v.toObject().value(QStringLiteral("id")).toInteger() > lastId)
              job = v.toObject();
          const QString state = job.value(QStringLiteral("state")).toString();
          return state == QStringLiteral("completed") || state == QStringLiteral("failed");
        };
        QTRY_VERIFY2_WITH_TIMEOUT(finished(), qPrintable(QJsonDocument(job).toJson(QJsonDocument::Compact)), 60000);
        QCOMPARE(job.value(QStringLiteral("state")).toString(), QStringLiteral("completed"));
        const QString prompt = job.value(QStringLiteral("prompt")).toString();
        QVERIFY(prompt.startsWith(QStringLiteral("System: Tell short stories.")));
        QVERIFY(prompt.endsWith(QStringLiteral("User: And the last one?\nAssistant:")));
        QVERIFY(!prompt.contains(QStringLiteral("Story 3 ")));  // the middle went
        QCOMPARE(prompt.contains(QStringLiteral("Story 0 ")), policy == QStringLiteral("truncate-middle"));
      }
      screen(QStringLiteral("screen-context-%1.png").arg(policy));
      closeStudio(studio);
    }
  }

  void firstStartFromAnEmptyHome() {
    QTemporaryDir fresh;
    homeDir_ = fresh.filePath(QStringLiteral("home"));
    configDir_ = fresh.filePath(QStringLiteral("config"));
    QDir().mkpath(homeDir_);
    const QString m15 = home_->synthText(QStringLiteral("models/m15.gguf"));  // slow enough to watch 8 jobs run
    QVERIFY(!m15.isEmpty());
    {
      QSettings s(configDir_ + QStringLiteral("/atelier/studio.conf"), QSettings::IniFormat);
      s.setValue(QStringLiteral("models/mirror"), uitest::fixtures());  // the mirror folder the welcome page offers
      s.setValue(QStringLiteral("write/maxTokens"), 60);
      s.setValue(QStringLiteral("write/temperature"), 0.0);
      s.setValue(QStringLiteral("paint/model"), sd_);
      s.setValue(QStringLiteral("paint/prompt"), QStringLiteral("a lighthouse on a cliff at dusk"));
      s.setValue(QStringLiteral("paint/steps"), 16);
      s.setValue(QStringLiteral("paint/width"), 192);
      s.setValue(QStringLiteral("paint/height"), 192);
    }
    QCOMPARE(installedModels(), 0);
    QProcess studio;
    QVERIFY(startStudio(studio));
    QTest::qWait(1500);
    screen(QStringLiteral("screen-welcome.png"));
    // The install button has the focus: Return installs from the mirror.
    QCOMPARE(x({QStringLiteral("key"), QStringLiteral("Return")}), 0);
    QTRY_COMPARE_WITH_TIMEOUT(installedModels(), 2, 60000);
    QTest::qWait(1500);  // Write opens, the pickers fill
    QCOMPARE(x({QStringLiteral("type"), QStringLiteral("--delay"), QStringLiteral("30"), QStringLiteral("Tell me about a cat")}), 0);
    QCOMPARE(x({QStringLiteral("key"), QStringLiteral("ctrl+Return")}), 0);
    QTRY_VERIFY_WITH_TIMEOUT(countState(QStringLiteral("text"), QStringLiteral("completed")) == 1, 60000);
    screen(QStringLiteral("screen-first-write.png"));
    // The monitor, then 8 text jobs (another process queues them; the studio runs them) and an image from Paint.
    QCOMPARE(x({QStringLiteral("key"), QStringLiteral("ctrl+shift+e")}), 0);
    for (int i = 0; i < 8; ++i)
      QCOMPARE(cli({QStringLiteral("queue"), QStringLiteral("add"), QStringLiteral("-m"), m15, QStringLiteral("-p"),
                    QStringLiteral("Once upon a time, story %1").arg(i), QStringLiteral("-n"), QStringLiteral("200")}),
               0);
    QCOMPARE(x({QStringLiteral("key"), QStringLiteral("ctrl+2")}), 0);
    QTest::qWait(300);
    QCOMPARE(x({QStringLiteral("key"), QStringLiteral("ctrl+Return")}), 0);
    QTRY_VERIFY_WITH_TIMEOUT(QFile::exists(QDir(shots_).filePath(QStringLiteral("monitor.png"))), 60000);
    screen(QStringLiteral("screen-monitor.png"));
    QTRY_VERIFY_WITH_TIMEOUT(countState(QStringLiteral("text"), QStringLiteral("completed")) == 9 &&
                                 countState(QStringLiteral("image"), QStringLiteral("completed")) == 1,
                             200000);
    QCOMPARE(x({QStringLiteral("key"), QStringLiteral("ctrl+shift+h")}), 0);
    QTRY_VERIFY_WITH_TIMEOUT(QFile::exists(QDir(shots_).filePath(QStringLiteral("history.png"))), 10000);
    screen(QStringLiteral("screen-history.png"));
    QCOMPARE(x({QStringLiteral("key"), QStringLiteral("ctrl+shift+m")}), 0);
    QTRY_VERIFY_WITH_TIMEOUT(QFile::exists(QDir(shots_).filePath(QStringLiteral("models.png"))), 10000);
    QTest::qWait(300);
    screen(QStringLiteral("screen-models.png"));
    for (const char* f : {"monitor.png", "history.png", "models.png"})
      QVERIFY2(QImage(QDir(shots_).filePath(QString::fromLatin1(f))).width() > 200, f);
    // The Models window has the focus now; the main window closes the studio.
    x({QStringLiteral("search"), QStringLiteral("--onlyvisible"), QStringLiteral("--name"), QStringLiteral("^Atelier$"),
       QStringLiteral("windowfocus"), QStringLiteral("--sync")});
    closeStudio(studio);
    homeDir_.clear();
    configDir_.clear();
  }

  void cleanupTestCase() { x_.stop(); }
};

QTEST_GUILESS_MAIN(EndToEndTest)
#include "e2e_test.moc"
