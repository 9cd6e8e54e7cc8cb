// End to end: the real atelier-studio binary on an X server (Xvfb), with a
// temporary ATELIER_HOME holding the fixture models, driven by keystrokes
// (xdotool) as a person would: a chat with stories260k, a QuickDraw doodle,
// then (after a restart, which keeps the settings) a narrow SD image. The
// studio saves screenshots of Write mid-stream, Paint mid-generation and
// done, and the queue (ATELIER_STUDIO_SHOTS) into the build folder's
// studio-shots/, and the X screen is captured too (ImageMagick's import).
// The results are checked through the job database with the CLI.
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QSettings>
#include <QtTest>

#include <memory>

#include "ui/ui_test_util.h"

using namespace atelier;

class EndToEndTest : public QObject {
  Q_OBJECT

  std::unique_ptr<uitest::TestHome> home_;
  QProcess xvfb_;
  QString display_;
  QString shots_;
  QString sd_;

  QProcessEnvironment env() const {
    QProcessEnvironment e = QProcessEnvironment::systemEnvironment();
    e.insert(QStringLiteral("DISPLAY"), display_);
    e.insert(QStringLiteral("QT_QPA_PLATFORM"), QStringLiteral("xcb"));
    e.insert(QStringLiteral("ATELIER_HOME"), home_->home());
    e.insert(QStringLiteral("XDG_CONFIG_HOME"), home_->path(QStringLiteral("config")));
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
    for (int i = 0; i < 100; ++i) {
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
    // The X server picks a free display itself and writes its number once it
    // accepts connections (-displayfd): no guessing around stale sockets or locks.
    xvfb_.start(QStringLiteral("Xvfb"), {QStringLiteral("-displayfd"), QStringLiteral("1"), QStringLiteral("-screen"), QStringLiteral("0"),
                                         QStringLiteral("1600x1000x24"), QStringLiteral("-nolisten"), QStringLiteral("tcp")});
    QVERIFY(xvfb_.waitForStarted(10000));
    QByteArray number;
    QTRY_VERIFY_WITH_TIMEOUT((number += xvfb_.readAllStandardOutput()).contains('\n'), 20000);
    display_ = QStringLiteral(":") + QString::fromLatin1(number.trimmed());
    QVERIFY2(number.trimmed().toInt() >= 0 && !number.trimmed().isEmpty(), number.constData());
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

  void cleanupTestCase() {
    xvfb_.terminate();
    xvfb_.waitForFinished(5000);
  }
};

QTEST_GUILESS_MAIN(EndToEndTest)
#include "e2e_test.moc"
