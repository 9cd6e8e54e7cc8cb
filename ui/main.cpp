// atelier-studio: the desktop window. The data dir (queue, conversations,
// model store) is $ATELIER_HOME or the engine's default; model folders from
// the command line add loose files to the pickers.
#include <QApplication>
#include <QCommandLineParser>
#include <QDir>
#include <QTimer>

#include "studio/studio_window.h"

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  QApplication::setOrganizationName(QStringLiteral("atelier"));
  QApplication::setApplicationName(QStringLiteral("studio"));
  QApplication::setApplicationDisplayName(QStringLiteral("Atelier"));
  QCommandLineParser parser;
  parser.setApplicationDescription(QStringLiteral("Atelier studio: write and paint with local models"));
  parser.addHelpOption();
  parser.addPositionalArgument(QStringLiteral("folders"), QStringLiteral("Folders with model files to offer beside the store's models"));
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
  options.modelFolders = parser.positionalArguments();
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
