// History in the studio window: finished text and image jobs listed with
// their parameters, digest and seed; search by prompt text and model, by
// kind and by date; Reopen puts a text job back in Write (the prompt, the
// model and the locked seed) and an image job's parameters in Paint; Run
// again gives the same tokens and the same pixels.
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QImage>
#include <QLineEdit>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QSignalSpy>
#include <QTabWidget>
#include <QTableWidget>
#include <QtTest>

#include <memory>

#include "common/model_picker.h"
#include "common/seed_box.h"
#include "history/history_view.h"
#include "paint/paint_tab.h"
#include "studio/studio_window.h"
#include "ui/ui_test_util.h"
#include "write/write_tab.h"

using namespace atelier;
using namespace atelier::ui;

class HistoryTest : public QObject {
  Q_OBJECT

  std::unique_ptr<uitest::TestHome> home_;
  std::unique_ptr<StudioWindow> window_;
  JobId text_ = 0, image_ = 0;

  HistoryView* history() { return window_->historyView(); }
  JobInfo job(JobId id) {
    for (const JobInfo& j : window_->bridge()->jobs())
      if (j.id == id) return j;
    return {};
  }
  // Finished one way or another (a failure is reported by the caller's checks, not waited out).
  bool ended(JobId id) {
    const JobState s = job(id).state;
    return s == JobState::Completed || s == JobState::Failed || s == JobState::Cancelled;
  }
  bool done(JobId id) { return job(id).state == JobState::Completed; }
  JobId submit(const TextRequest& r) {
    JobId id = 0;
    window_->bridge()->submitText(r, [&](Result<JobId> got) { id = got.ok() ? got.value() : -1; });
    [&] { QTRY_VERIFY_WITH_TIMEOUT(id != 0, 10000); }();
    return id;
  }
  JobId submit(const ImageRequest& r) {
    JobId id = 0;
    window_->bridge()->submitImage(r, [&](Result<JobId> got) { id = got.ok() ? got.value() : -1; });
    [&] { QTRY_VERIFY_WITH_TIMEOUT(id != 0, 10000); }();
    return id;
  }
  // Clicks Run again on ID's row; returns the new job's id once it is done.
  JobId runAgain(JobId id) {
    QSignalSpy again(history(), &HistoryView::ranAgain);
    JobId copy = 0;
    [&] {
      QVERIFY(history()->selectJob(id));
      QTest::mouseClick(history()->findChild<QPushButton*>(QStringLiteral("runAgainButton")), Qt::LeftButton);
      QTRY_COMPARE_WITH_TIMEOUT(again.count(), 1, 10000);
      QCOMPARE(again.at(0).at(0).toLongLong(), qint64{id});
      copy = again.at(0).at(1).toLongLong();
      QTRY_VERIFY_WITH_TIMEOUT(ended(copy), 60000);
      QVERIFY2(done(copy), job(copy).error.c_str());
    }();
    return copy;
  }

 private slots:
  void initTestCase() {
    home_ = std::make_unique<uitest::TestHome>();
    QVERIFY(home_->pull({QStringLiteral("stories260k"), QStringLiteral("quickdraw")}));
    StudioOptions o;
    o.dataDir = home_->home();
    window_ = std::make_unique<StudioWindow>(o);
    window_->show();
    QTRY_VERIFY_WITH_TIMEOUT(window_->bridge()->isOpen(), 20000);
    QVERIFY(!window_->showingWelcome());
    // A sampled (not greedy) text job with a random seed: only the recorded seed reproduces it.
    TextRequest t;
    t.model = "stories260k";
    t.prompt = "Once upon a time, a little fox";
    t.max_new_tokens = 40;
    t.sampling.temperature = 1.0f;
    text_ = submit(t);
    ImageRequest i;
    i.model = "quickdraw";
    i.prompt = "apple";
    image_ = submit(i);
    QVERIFY(text_ > 0 && image_ > 0);
    QTRY_VERIFY_WITH_TIMEOUT(ended(text_) && ended(image_), 60000);
    for (JobId id : {text_, image_}) QVERIFY2(done(id), job(id).error.c_str());
    QTRY_VERIFY_WITH_TIMEOUT(history()->shownJobs().size() == 2, 10000);
  }

  void detailsShowParametersDigestAndSeed() {
    QVERIFY(history()->selectJob(text_));
    const JobInfo j = job(text_);
    const QString d = history()->detailText();
    QVERIFY2(d.contains(QStringLiteral("seed: %1").arg(j.seed)), qPrintable(d));
    QVERIFY(d.contains(QString::fromStdString(j.model_version)));
    QVERIFY(QString::fromStdString(j.model_version).startsWith(QStringLiteral("sha256:270cba1bd5109f42")));  // the fixture's digest
    QVERIFY(d.contains(QStringLiteral("\"temperature\":1")));
    QVERIFY(d.contains(QStringLiteral("a little fox")));
  }

  void searchByPromptModelKindAndDate() {
    auto* search = history()->search();
    QTest::keyClicks(search, QStringLiteral("LITTLE FOX"));
    QCOMPARE(history()->shownJobs(), QVector<JobId>{text_});
    search->clear();
    QTest::keyClicks(search, QStringLiteral("quickdraw"));  // a model name
    QCOMPARE(history()->shownJobs(), QVector<JobId>{image_});
    search->clear();
    QTest::keyClicks(search, QStringLiteral("no such prompt"));
    QVERIFY(history()->shownJobs().isEmpty());
    search->clear();
    history()->kindBox()->setCurrentIndex(history()->kindBox()->findData(QStringLiteral("image")));
    QCOMPARE(history()->shownJobs(), QVector<JobId>{image_});
    history()->kindBox()->setCurrentIndex(history()->kindBox()->findData(QStringLiteral("text")));
    QCOMPARE(history()->shownJobs(), QVector<JobId>{text_});
    history()->kindBox()->setCurrentIndex(0);
    history()->dateBox()->setCurrentIndex(history()->dateBox()->findData(1));  // today: both
    QCOMPARE(history()->shownJobs().size(), 2);
    history()->dateBox()->setCurrentIndex(0);
  }

  void runAgainGivesTheSameTokens() {
    const JobId copy = runAgain(text_);
    const JobInfo a = job(text_), b = job(copy);
    QVERIFY(!a.text.empty());
    QCOMPARE(b.seed, a.seed);
    QCOMPARE(QString::fromStdString(b.text), QString::fromStdString(a.text));
    QCOMPARE(b.stats.new_tokens, a.stats.new_tokens);
    QCOMPARE(b.model_version, a.model_version);
  }

  void runAgainGivesTheSamePixels() {
    const JobId copy = runAgain(image_);
    const JobInfo a = job(image_), b = job(copy);
    QCOMPARE(a.files.size(), size_t{1});
    QCOMPARE(b.files.size(), size_t{1});
    QVERIFY(a.files[0] != b.files[0]);  // a new file, not over the first
    const QImage ia(QString::fromStdString(a.files[0])), ib(QString::fromStdString(b.files[0]));
    QVERIFY(!ia.isNull());
    QCOMPARE(ib.size(), ia.size());
    QVERIFY(ib.convertToFormat(QImage::Format_RGB32) == ia.convertToFormat(QImage::Format_RGB32));
  }

  void reopenPutsATextJobBackInWrite() {
    window_->tabs()->setCurrentWidget(window_->paintTab());
    QVERIFY(history()->selectJob(text_));
    QTest::mouseClick(history()->findChild<QPushButton*>(QStringLiteral("reopenButton")), Qt::LeftButton);
    QCOMPARE(window_->tabs()->currentWidget(), window_->writeTab());
    auto* notebook = window_->writeTab()->findChild<QPlainTextEdit*>(QStringLiteral("notebook"));
    QCOMPARE(notebook->toPlainText(), QStringLiteral("Once upon a time, a little fox"));
    QCOMPARE(window_->writeTab()->findChild<ModelPicker*>(QStringLiteral("writeModel"))->reference().section('@', 0, 0),
             QStringLiteral("stories260k"));
    auto* seed = window_->writeTab()->findChild<SeedBox*>();
    QCOMPARE(seed->seed(), job(text_).seed);
    QVERIFY(seed->locked());
  }

  void reopenPutsAnImageJobBackInPaint() {
    window_->tabs()->setCurrentWidget(window_->writeTab());
    QVERIFY(history()->selectJob(image_));
    QTest::mouseClick(history()->findChild<QPushButton*>(QStringLiteral("reopenButton")), Qt::LeftButton);
    QCOMPARE(window_->tabs()->currentWidget(), window_->paintTab());
    QCOMPARE(window_->paintTab()->findChild<QPlainTextEdit*>(QStringLiteral("prompt"))->toPlainText(), QStringLiteral("apple"));
    QCOMPARE(window_->paintTab()->findChild<SeedBox*>()->seed(), job(image_).seed);
  }

  void cleanupTestCase() { window_.reset(); }
};

QTEST_MAIN(HistoryTest)
#include "history_test.moc"
