// Shared by the studio's QtTest suites: a private data dir and settings
// folder per test run, the fixture models, and the CLI for setting them up.
#pragma once

#include <QDeadlineTimer>
#include <QDir>
#include <QFileInfo>
#include <QProcess>
#include <QStandardPaths>
#include <QString>
#include <QTemporaryDir>
#include <QtTest>

namespace atelier::uitest {

inline QString fixtures() { return QStringLiteral(ATELIER_FIXTURES_DIR); }

// Runs the `atelier` CLI; returns its exit code (stderr in *err when given).
inline int runCli(const QStringList& args, QString* err = nullptr, int timeoutMs = 300000) {
  QProcess p;
  p.start(QStringLiteral(ATELIER_BINARY), args);
  if (!p.waitForFinished(timeoutMs)) {
    p.kill();
    return -1;
  }
  if (err) *err = QString::fromUtf8(p.readAllStandardError());
  return p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1;
}

// An X server (Xvfb) for the real studio, stopped with this object.
// It picks a free display itself and writes its number once it accepts
// connections (-displayfd): no guessing around stale sockets or locks.
// -noreset: by default Xvfb resets when its last client leaves (each xdotool
// call, each studio that quits), and a client that connects during the
// reset is dropped (xorg/xserver#1102); CI saw a studio fail so.
class XServer {
 public:
  ~XServer() { stop(); }
  // True once the server accepts connections on display(); else false, why in *why.
  bool start(QString* why) {
    p_.start(QStringLiteral("Xvfb"), {QStringLiteral("-displayfd"), QStringLiteral("1"), QStringLiteral("-noreset"), QStringLiteral("-screen"),
                                      QStringLiteral("0"), QStringLiteral("1600x1000x24"), QStringLiteral("-nolisten"), QStringLiteral("tcp")});
    if (!p_.waitForStarted(10000)) {
      *why = QStringLiteral("Xvfb did not start: ") + p_.errorString();
      return false;
    }
    QByteArray number;
    const QDeadlineTimer deadline(20000);
    while (!number.contains('\n') && !deadline.hasExpired()) {
      p_.waitForReadyRead(100);
      number += p_.readAllStandardOutput();
    }
    bool numeric = false;
    const int n = number.trimmed().toInt(&numeric);
    if (!number.contains('\n') || !numeric || n < 0) {
      *why = QStringLiteral("Xvfb wrote no display number in 20 s: '%1'").arg(QString::fromLatin1(number));
      return false;
    }
    display_ = QStringLiteral(":") + QString::number(n);
    return true;
  }
  void stop() {
    if (p_.state() == QProcess::NotRunning) return;
    p_.terminate();
    p_.waitForFinished(5000);
  }
  const QString& display() const { return display_; }

 private:
  QProcess p_;
  QString display_;
};

// A fresh ATELIER_HOME (queue + store) and XDG_CONFIG_HOME (QSettings) for
// this process, set before anything reads them.
class TestHome {
 public:
  TestHome() {
    qputenv("ATELIER_HOME", dir_.filePath(QStringLiteral("home")).toUtf8());
    qputenv("XDG_CONFIG_HOME", dir_.filePath(QStringLiteral("config")).toUtf8());
    QDir().mkpath(home());
    QStandardPaths::setTestModeEnabled(false);
  }
  QString home() const { return dir_.filePath(QStringLiteral("home")); }
  QString path(const QString& name) const { return dir_.filePath(name); }
  // Installs fixture models into this home's store by name (stories260k, quickdraw).
  bool pull(const QStringList& names) {
    QString err;
    const int rc = runCli(QStringList{QStringLiteral("models"), QStringLiteral("pull")} + names +
                              QStringList{QStringLiteral("--mirror"), fixtures(), QStringLiteral("--store"), home()},
                          &err);
    if (rc != 0) qWarning("models pull failed: %s", qPrintable(err));
    return rc == 0;
  }
  // A narrow random SD 1.5-shaped checkpoint (fast at 64x64) at NAME in this home; "" on failure.
  QString synthSd(const QString& name = QStringLiteral("sd-narrow.safetensors")) {
    return synth(name, {QStringLiteral("--arch"), QStringLiteral("sd15"), QStringLiteral("--width-mult"), QStringLiteral("0.1")});
  }
  // A random LLaMA-shaped GGUF (15M: slow enough to catch every phase of a job); "" on failure.
  QString synthText(const QString& name, const QStringList& extra = {}) {
    return synth(name, QStringList{QStringLiteral("--params"), QStringLiteral("15M"), QStringLiteral("--type"), QStringLiteral("q8_0")} + extra);
  }

 private:
  QString synth(const QString& name, const QStringList& args) {
    const QString out = path(name);
    if (QFile::exists(out)) return out;
    QDir().mkpath(QFileInfo(out).path());
    QString err;
    if (runCli(QStringList{QStringLiteral("models"), QStringLiteral("synth")} + args + QStringList{QStringLiteral("-o"), out}, &err) != 0) {
      qWarning("synth failed: %s", qPrintable(err));
      return QString();
    }
    return out;
  }
  QTemporaryDir dir_;
};

}  // namespace atelier::uitest
