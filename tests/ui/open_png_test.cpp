// The studio started on a PNG (`atelier-studio IMAGE.png`: the desktop
// entry's "Open with" and a file dropped on its launcher): Paint opens with
// the parameters the PNG carries, as a drop on the window restores them.
#include <QPlainTextEdit>
#include <QStatusBar>
#include <QTabWidget>
#include <QtTest>

#include <memory>

#include "paint/paint_tab.h"
#include "studio/studio_window.h"
#include "ui/ui_test_util.h"

using namespace atelier;
using namespace atelier::ui;

class OpenPngTest : public QObject {
  Q_OBJECT

  std::unique_ptr<uitest::TestHome> home_;

  std::unique_ptr<StudioWindow> open(const QString& png) {
    StudioOptions o;
    o.dataDir = home_->home();
    o.welcome = false;
    o.openPng = png;
    auto w = std::make_unique<StudioWindow>(o);
    w->show();
    return w;
  }

  bool paintShows(StudioWindow& w, const QString& text) {
    for (auto* t : w.paintTab()->findChildren<QPlainTextEdit*>())
      if (t->toPlainText() == text) return true;
    return false;
  }

 private slots:
  void initTestCase() { home_ = std::make_unique<uitest::TestHome>(); }

  // A doodle the command line made: its prompt comes back in Paint, which is in front.
  void anAtelierPngOpensInPaintWithItsParameters() {
    const QString png = home_->path(QStringLiteral("airplane.png"));
    QString err;
    const int rc = uitest::runCli({QStringLiteral("image"), QStringLiteral("-m"), uitest::fixtures() + QStringLiteral("/image/quickdraw-cvae.safetensors"),
                                   QStringLiteral("-p"), QStringLiteral("airplane"), QStringLiteral("--seed"), QStringLiteral("7"),
                                   QStringLiteral("-o"), png},
                                  &err);
    QVERIFY2(rc == 0, qPrintable(err));
    auto w = open(png);
    QCOMPARE(w->tabs()->currentWidget(), static_cast<QWidget*>(w->paintTab()));
    QVERIFY(paintShows(*w, QStringLiteral("airplane")));
    QVERIFY2(w->statusBar()->currentMessage().contains(QStringLiteral("airplane.png")), qPrintable(w->statusBar()->currentMessage()));
    w->close();
  }

  // An A1111 PNG (parameters text only) restores prompt and negative prompt too.
  void anA1111PngRestoresPromptAndNegative() {
    QImage img(64, 64, QImage::Format_RGB888);
    img.fill(Qt::darkCyan);
    img.setText(QStringLiteral("parameters"),
                QStringLiteral("a lighthouse at dusk\nNegative prompt: blurry\nSteps: 13, Sampler: Euler a, CFG scale: 6.5, Seed: 4242, Size: 64x64"));
    const QString png = home_->path(QStringLiteral("a1111.png"));
    QVERIFY(img.save(png));
    auto w = open(png);
    QVERIFY(paintShows(*w, QStringLiteral("a lighthouse at dusk")));
    QVERIFY(paintShows(*w, QStringLiteral("blurry")));
    w->close();
  }

  // A PNG without parameters says so in the status bar; the window still opens.
  void aPngWithoutParametersSaysSo() {
    QImage img(8, 8, QImage::Format_RGB888);
    img.fill(Qt::white);
    const QString png = home_->path(QStringLiteral("plain.png"));
    QVERIFY(img.save(png));
    auto w = open(png);
    QVERIFY(w->isVisible());
    QVERIFY2(w->statusBar()->currentMessage().contains(QStringLiteral("carries no generation parameters")) ||
                 w->statusBar()->currentMessage().contains(QStringLiteral("not restored")),
             qPrintable(w->statusBar()->currentMessage()));
    w->close();
  }
};

QTEST_MAIN(OpenPngTest)
#include "open_png_test.moc"
