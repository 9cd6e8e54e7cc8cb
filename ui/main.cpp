// atelier-studio: the desktop window. The data dir (queue, conversations,
// model store) is $ATELIER_HOME or the engine's default; model folders from
// the command line add loose files to the pickers, and a PNG there (the
// desktop entry's file: "Open with", a drop on the launcher) opens in Paint
// with its parameters restored.
#include <QApplication>
#include <QCommandLineParser>
#include <QDir>
#include <QFileInfo>
#include <QTimer>

#include <cstdio>

#include "studio/studio_window.h"

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  QApplication::setOrganizationName(QStringLiteral("atelier"));
  QApplication::setApplicationName(QStringLiteral("studio"));
  QApplication::setApplicationDisplayName(QStringLiteral("Atelier"));
  QApplication::setApplicationVersion(QStringLiteral(ATELIER_VERSION));
  QGuiApplication::setDesktopFileName(QStringLiteral("org.atelier.Atelier"));  // assets/org.atelier.Atelier.desktop
  QCommandLineParser parser;
  parser.setApplicationDescription(QStringLiteral("Atelier studio: write and paint with local models"));
  parser.addHelpOption();
  parser.addVersionOption();
  parser.addPositionalArgument(QStringLiteral("paths"),
                               QStringLiteral("Folders with model files to offer beside the store's models; a PNG to open in Paint with its parameters"),
                               QStringLiteral("[FOLDER...] [IMAGE.png]"));
  QCommandLineOption dataDir(QStringLiteral("data-dir"), QStringLiteral("Queue, conversations and store folder (default: $ATELIER_HOME)"),
                             QStringLiteral("DIR"));
  QCommandLineOption screenshot(QStringLiteral("screenshot"), QStringLiteral("Save the window as PNG to FILE after MS milliseconds and quit"),
                                QStringLiteral("FILE"));
  QCommandLineOption delay(QStringLiteral("screenshot-delay"), QStringLiteral("Milliseconds before --screenshot (default 1500)"),
                           QStringLiteral("MS"), QStringLiteral("1500"));
  QCommandLineOption threads(QStringLiteral("threads"), QStringLiteral("Engine threads (default: one per core)"), QStringLiteral("N"),
                             QStringLiteral("0"));
  parser.addOptions({dataDir, screenshot, delay, threads});
  parser.process(app);

  atelier::ui::StudioOptions options;
  options.dataDir = parser.value(dataDir);
  for (const QString& p : parser.positionalArguments()) {
    const QFileInfo f(p);
    if (f.isFile() && f.suffix().compare(QStringLiteral("png"), Qt::CaseInsensitive) == 0) {
      if (!options.openPng.isEmpty()) {
        std::fprintf(stderr, "atelier-studio: error: more than one PNG given (%s, %s): pass one to open in Paint\n",
                     qPrintable(options.openPng), qPrintable(p));
        return 2;
      }
      options.openPng = f.absoluteFilePath();
    } else {
      options.modelFolders << p;
    }
  }
  options.threads = parser.value(threads).toInt();
  atelier::ui::StudioWindow window(options);
  window.show();
  if (parser.isSet(screenshot)) {
    const QString file = parser.value(screenshot);
    QTimer::singleShot(parser.value(delay).toInt(), &window, [&window, file] {
      window.grab().save(file);
      QApplication::quit();
    });
  }
  return app.exec();
}
