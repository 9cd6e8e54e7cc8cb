// atelier-studio: the desktop window. Model folders come from the command
// line, else $ATELIER_HOME/models and the XDG data dir, plus the fixtures.
#include <QApplication>
#include <QCommandLineParser>
#include <QDir>
#include <QStandardPaths>
#include <QTimer>

#include "main_window.h"

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("atelier"));
  QCommandLineParser parser;
  parser.setApplicationDescription(QStringLiteral("Atelier studio"));
  parser.addHelpOption();
  parser.addPositionalArgument(QStringLiteral("folders"), QStringLiteral("Folders with model files"));
  QCommandLineOption screenshot(QStringLiteral("screenshot"), QStringLiteral("Save the window as PNG to FILE and quit"),
                                QStringLiteral("FILE"));
  parser.addOption(screenshot);
  parser.process(app);

  QStringList folders = parser.positionalArguments();
  if (folders.isEmpty()) {
    const QString home = qEnvironmentVariable("ATELIER_HOME");
    folders << (home.isEmpty() ? QStandardPaths::writableLocation(QStandardPaths::GenericDataLocation) + "/atelier"
                               : home) + "/models";
    for (const char* sub : {"/text", "/image"}) {
      const QString fixtures = QStringLiteral(ATELIER_FIXTURES_DIR) + sub;
      if (QDir(fixtures).exists()) folders << QDir(fixtures).canonicalPath();
    }
  }
  MainWindow window(folders);
  window.show();
  if (parser.isSet(screenshot)) {
    const QString file = parser.value(screenshot);
    QTimer::singleShot(300, &window, [&window, file] {
      window.grab().save(file);
      QApplication::quit();
    });
  }
  return app.exec();
}
