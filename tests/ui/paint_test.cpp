// The Paint tab and the gallery, driven offscreen as a person would: a
// narrow synthetic SD checkpoint (no CLIP vocabulary beside it: the one
// installed with the program is used) through a real engine behind the
// EngineBridge; previews at every step, the result in the gallery, reuse of
// its parameters, PNGs from A1111 and Forge, Stop while queued and running,
// QuickDraw, img2img with a painted mask, delete and undo in the gallery.
#include <QAction>
#include <QApplication>
#include <QClipboard>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QImageReader>
#include <QLabel>
#include <QListView>
#include <QListWidget>
#include <QMimeData>
#include <QPlainTextEdit>
#include <QProgressBar>
#include <QPushButton>
#include <QRegularExpression>
#include <QSettings>
#include <QScopeGuard>
#include <QSignalSpy>
#include <QSlider>
#include <QSpinBox>
#include <QTabWidget>
#include <QToolButton>
#include <QUndoStack>
#include <QtTest>

#include <memory>
#include <set>

#include "bridge/engine_bridge.h"
#include "common/model_picker.h"
#include "common/seed_box.h"
#include "gallery/gallery_view.h"
#include "paint/infotext.h"
#include "paint/paint_canvas.h"
#include "paint/paint_tab.h"
#include "ui/ui_test_util.h"

using namespace atelier;
using atelier::ui::PaintTab;

namespace {

constexpr int kJobMs = 120000;  // a narrow SD job at 64x64 takes well under a second; leave room on a busy machine

template <class T>
T* child(QObject* parent, const char* name) {
  T* w = parent->findChild<T*>(QLatin1String(name));
  if (!w) qWarning("no child %s", name);
  return w;
}

QByteArray pixels(const QImage& img) {
  const QImage rgb = img.convertToFormat(QImage::Format_RGB888);
  QByteArray out;
  for (int y = 0; y < rgb.height(); ++y) out.append(reinterpret_cast<const char*>(rgb.constScanLine(y)), rgb.width() * 3);
  return out + QByteArray::number(rgb.width()) + 'x' + QByteArray::number(rgb.height());
}

std::optional<JobInfo> jobIn(const bridge::EngineBridge& b, JobId id) {
  for (const JobInfo& j : b.jobs())
    if (j.id == id) return j;
  return std::nullopt;
}

}  // namespace

class PaintTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void cleanupTestCase();
  void init();
  void cleanup();

  void infotextParsesA1111();
  void sizeFieldsTakeMultiplesOfEight();
  void previewChangesAtEveryStep();
  void batchShowsEveryImage();
  void resultReachesGalleryAndReuseFillsPanel();
  void pngRestoresParameters();
  void droppedPngRestoresAndDroppedPictureIsInit();
  void stopWhenQueuedAndWhileSubmitting();
  void stopWhileRunning();
  void longRequestShowsTheEstimateWarning();
  void quickDrawOnePass();
  void quickDrawHasAClassPickerAndNoSampler();
  void img2imgWithPaintedMask();
  void galleryListsDeletesAndUndoes();
  void settingsRoundTrip();

 private:
  // A Paint tab over the test's engine, shown, its model picker filled and set to the narrow SD.
  std::unique_ptr<PaintTab> newTab();
  void setBasics(PaintTab* tab, const QString& prompt, int steps, quint64 seed);
  QString screenshotDir() const { return QCoreApplication::applicationDirPath() + QStringLiteral("/screenshots"); }

  std::unique_ptr<uitest::TestHome> home_;
  std::unique_ptr<bridge::EngineBridge> bridge_;
  QString sd_, quickdraw_, output_;
};

void PaintTest::initTestCase() {
  home_ = std::make_unique<uitest::TestHome>();
  sd_ = QFileInfo(home_->synthSd()).canonicalFilePath();
  QVERIFY2(QFile::exists(sd_), "atelier models synth failed");
  // The point of shipping CLIP's vocabulary: none beside the model.
  QVERIFY(!QFile::exists(QFileInfo(sd_).dir().filePath(QStringLiteral("bpe_simple_vocab_16e6.txt.gz"))));
  quickdraw_ = QFileInfo(uitest::fixtures() + QStringLiteral("/image/quickdraw-cvae.safetensors")).canonicalFilePath();
  QVERIFY(QFile::exists(quickdraw_));
  output_ = home_->path(QStringLiteral("outputs"));
  bridge::EngineBridge::Options o;
  o.dataDir = home_->home();
  o.modelFolders = {QFileInfo(sd_).absolutePath(), QFileInfo(quickdraw_).absolutePath()};
  o.threads = 2;
  o.pollMs = 200;
  bridge_ = std::make_unique<bridge::EngineBridge>(o);
  QSignalSpy opened(bridge_.get(), &bridge::EngineBridge::opened);
  bridge_->start();
  QTRY_COMPARE_WITH_TIMEOUT(opened.count(), 1, 30000);
  QVERIFY2(opened.at(0).at(0).toBool(), qPrintable(opened.at(0).at(2).toString()));
  QVERIFY(opened.at(0).at(1).toBool());  // this process runs the queue
  QDir().mkpath(screenshotDir());
}

void PaintTest::cleanupTestCase() { bridge_.reset(); }

void PaintTest::init() {
  if (bridge_->paused()) bridge_->setPaused(false);
}

void PaintTest::cleanup() {
  if (bridge_->paused()) bridge_->setPaused(false);
}

std::unique_ptr<PaintTab> PaintTest::newTab() {
  auto tab = std::make_unique<PaintTab>(bridge_.get());
  tab->setOutputFolder(output_);
  tab->resize(1200, 780);
  tab->show();
  auto* picker = child<ui::ModelPicker>(tab.get(), "imageModel");
  QSignalSpy scanned(bridge_.get(), &bridge::EngineBridge::modelsScanned);
  bridge_->scanModels();
  [&] { QTRY_VERIFY_WITH_TIMEOUT(scanned.count() > 0, 30000); }();
  picker->setReference(sd_);
  return tab;
}

void PaintTest::setBasics(PaintTab* tab, const QString& prompt, int steps, quint64 seed) {
  child<QPlainTextEdit>(tab, "prompt")->setPlainText(prompt);
  child<QSpinBox>(tab, "width")->setValue(64);
  child<QSpinBox>(tab, "height")->setValue(64);
  child<QSpinBox>(tab, "steps")->setValue(steps);
  child<ui::SeedBox>(tab, "seedBox")->setSeed(seed);
}

// ---------------------------------------------------------------- pure parsing

void PaintTest::infotextParsesA1111() {
  const ui::Infotext a = ui::parseInfotext(QStringLiteral(
      "masterpiece, a cat\nwith a hat\nNegative prompt: ugly, \nblurry\n"
      "Steps: 20, Sampler: DPM++ 2M Karras, CFG scale: 7.5, Seed: 4242424242, Size: 512x768, Model hash: 6ce0161689, "
      "Model: v1-5-pruned-emaonly, Lora hashes: \"a: 1, b: 2\", Clip skip: 2, Version: v1.6.0"));
  QVERIFY(a.hasParameters);
  QCOMPARE(a.prompt, QStringLiteral("masterpiece, a cat\nwith a hat"));
  QCOMPARE(a.negativePrompt, QStringLiteral("ugly,\nblurry"));
  QCOMPARE(a.steps.value_or(0), 20);
  QCOMPARE(a.sampler, QStringLiteral("DPM++ 2M Karras"));
  QCOMPARE(a.cfgScale.value_or(0), 7.5);
  QCOMPARE(a.seed.value_or(0), quint64(4242424242ull));
  QCOMPARE(a.width.value_or(0), 512);
  QCOMPARE(a.height.value_or(0), 768);
  QCOMPARE(a.modelHash, QStringLiteral("6ce0161689"));
  QCOMPARE(a.model, QStringLiteral("v1-5-pruned-emaonly"));
  QCOMPARE(a.value(QStringLiteral("Lora hashes")), QStringLiteral("a: 1, b: 2"));
  QCOMPARE(a.value(QStringLiteral("Clip skip")), QStringLiteral("2"));
  const auto s = ui::mapSampler(a.sampler);
  QVERIFY(s);
  QCOMPARE(s->sampler, QStringLiteral("dpmpp_2m"));
  QCOMPARE(s->scheduler, QStringLiteral("karras"));
  QCOMPARE(ui::mapSampler(QStringLiteral("Euler a"))->sampler, QStringLiteral("euler_a"));
  QVERIFY(!ui::mapSampler(QStringLiteral("DPM++ SDE")));
  QCOMPARE(ui::mapScheduleType(QStringLiteral("Karras")).value_or(QString()), QStringLiteral("karras"));
  QCOMPARE(ui::mapScheduleType(QStringLiteral("Automatic")).value_or(QString()), QStringLiteral("discrete"));
  QVERIFY(!ui::mapScheduleType(QStringLiteral("Exponential")));

  // Only a prompt: no parameters line (fewer than three "Key: value" pairs).
  const ui::Infotext b = ui::parseInfotext(QStringLiteral("a quiet lake: at dawn"));
  QVERIFY(!b.hasParameters);
  QCOMPARE(b.prompt, QStringLiteral("a quiet lake: at dawn"));
  // No negative prompt, quoted value with an escaped quote.
  const ui::Infotext c = ui::parseInfotext(QStringLiteral(
      "owl\nSteps: 4, Sampler: Euler, CFG scale: 1, Seed: 3, Size: 64x64, Note: \"say \\\"hi\\\", ok\""));
  QCOMPARE(c.negativePrompt, QString());
  QCOMPARE(c.value(QStringLiteral("Note")), QStringLiteral("say \"hi\", ok"));
}

void PaintTest::sizeFieldsTakeMultiplesOfEight() {
  auto tab = newTab();
  auto* width = child<QSpinBox>(tab.get(), "width");
  auto* height = child<QSpinBox>(tab.get(), "height");
  auto* preset = child<QComboBox>(tab.get(), "sizePreset");
  width->setFocus();
  width->selectAll();
  QTest::keyClicks(width, QStringLiteral("100"));
  QTest::keyClick(width, Qt::Key_Return);
  QCOMPARE(width->value(), 104);  // rounded to the nearest multiple of 8
  QCOMPARE(preset->currentData().toSize(), QSize());  // Custom
  const int i = preset->findData(QSize(768, 512));
  QVERIFY(i >= 0);
  preset->setCurrentIndex(i);
  emit preset->activated(i);
  QCOMPARE(width->value(), 768);
  QCOMPARE(height->value(), 512);
  QTest::mouseClick(child<QToolButton>(tab.get(), "swapSize"), Qt::LeftButton);
  QCOMPARE(width->value(), 512);
  QCOMPARE(height->value(), 768);
  QCOMPARE(preset->currentData().toSize(), QSize(512, 768));
}

// ---------------------------------------------------------------- generation

void PaintTest::previewChangesAtEveryStep() {
  auto tab = newTab();
  setBasics(tab.get(), QStringLiteral("a lighthouse at dusk, (oil painting:1.2)"), 4, 42);
  child<QComboBox>(tab.get(), "sampler")->setCurrentIndex(child<QComboBox>(tab.get(), "sampler")->findData(QStringLiteral("euler")));
  auto* canvas = child<ui::PaintCanvas>(tab.get(), "canvas");
  auto* progress = child<QProgressBar>(tab.get(), "progress");
  std::set<QByteArray> previews;
  std::set<int> values;
  QStringList texts;
  bool mid = false;
  connect(canvas, &ui::PaintCanvas::imageChanged, this, [&] {
    if (tab->phase() == PaintTab::Phase::Idle) return;  // the result, not a preview
    previews.insert(pixels(canvas->image()));
    values.insert(progress->value());
    texts << progress->format();
    if (!mid && progress->value() == 2) {
      mid = true;
      tab->grab().save(screenshotDir() + QStringLiteral("/paint-mid-generation.png"));
    }
  });
  QSignalSpy saved(tab.get(), &PaintTab::imagesSaved);
  // Ctrl+Enter in the prompt generates.
  QTest::keyClick(child<QPlainTextEdit>(tab.get(), "prompt"), Qt::Key_Return, Qt::ControlModifier);
  QVERIFY(tab->phase() != PaintTab::Phase::Idle);
  QTRY_COMPARE_WITH_TIMEOUT(saved.count(), 1, kJobMs);
  QVERIFY2(previews.size() >= 4, qPrintable(QStringLiteral("%1 distinct previews").arg(previews.size())));
  for (int step = 1; step <= 4; ++step) QVERIFY2(values.count(step), qPrintable(texts.join(" | ")));
  QVERIFY2(texts.contains(QStringLiteral("step 2/4")) || std::any_of(texts.begin(), texts.end(), [](const QString& t) {
             return t.startsWith(QStringLiteral("step 2/4 \u00b7")) && t.contains(QStringLiteral("it/s")) && t.contains(QStringLiteral("ETA"));
           }),
           qPrintable(texts.join(" | ")));
  const QStringList files = saved.at(0).at(0).toStringList();
  QCOMPARE(files.size(), 1);
  QVERIFY(QFile::exists(files[0]));
  QCOMPARE(QFileInfo(files[0]).absolutePath(), QFileInfo(output_).absoluteFilePath());
  QVERIFY2(QRegularExpression(QStringLiteral(R"(^atelier-\d{8}-\d{6}-42\.png$)")).match(QFileInfo(files[0]).fileName()).hasMatch(),
           qPrintable(files[0]));
  // The canvas ends on the result at full size.
  QTRY_COMPARE_WITH_TIMEOUT(canvas->image().size(), QSize(64, 64), 10000);
  QCOMPARE(pixels(canvas->image()), pixels(QImage(files[0])));
  QVERIFY(progress->format().startsWith(QStringLiteral("done")));
  QVERIFY(child<QPushButton>(tab.get(), "generate")->isEnabled());
  QVERIFY(!child<QPushButton>(tab.get(), "stop")->isEnabled());
  QVERIFY(tab->grab().save(screenshotDir() + QStringLiteral("/paint-done.png")));
}

void PaintTest::batchShowsEveryImage() {
  auto tab = newTab();
  setBasics(tab.get(), QStringLiteral("three apples"), 2, 7);
  child<QSpinBox>(tab.get(), "batchCount")->setValue(2);
  child<QSpinBox>(tab.get(), "batchSize")->setValue(2);
  QSignalSpy saved(tab.get(), &PaintTab::imagesSaved);
  QTest::mouseClick(child<QPushButton>(tab.get(), "generate"), Qt::LeftButton);
  QTRY_COMPARE_WITH_TIMEOUT(saved.count(), 1, kJobMs);
  const QStringList files = saved.at(0).at(0).toStringList();
  QCOMPARE(files.size(), 4);
  for (int i = 0; i < 4; ++i) {
    QVERIFY(QFile::exists(files[i]));
    QVERIFY2(files[i].endsWith(QStringLiteral("-%1.png").arg(i + 1)), qPrintable(files[i]));  // the engine numbers them
  }
  auto* strip = child<QListWidget>(tab.get(), "batchStrip");
  QTRY_VERIFY(strip->isVisible());
  QTRY_COMPARE(strip->count(), 4);
  // The results replace the previews (decoded off the UI thread).
  QTRY_COMPARE_WITH_TIMEOUT(strip->item(3)->toolTip(), files[3], 10000);
  QVERIFY(!strip->item(3)->icon().isNull());
  QCOMPARE(child<ui::PaintCanvas>(tab.get(), "canvas")->image().size(), QSize(64, 64));
  // Picking a strip entry shows that image.
  strip->setCurrentRow(2);
  QCOMPARE(pixels(child<ui::PaintCanvas>(tab.get(), "canvas")->image()), pixels(QImage(files[2])));
  tab->grab().save(screenshotDir() + QStringLiteral("/paint-batch.png"));
}

void PaintTest::resultReachesGalleryAndReuseFillsPanel() {
  auto tab = newTab();
  ui::GalleryView gallery;
  gallery.resize(420, 600);
  gallery.show();
  gallery.setFolder(output_);
  connect(tab.get(), &PaintTab::imagesSaved, &gallery, &ui::GalleryView::addImages);
  QStringList missed{QStringLiteral("not called")};
  connect(&gallery, &ui::GalleryView::reuseParameters, tab.get(), [&](const QString& p) { missed = tab->restoreFromPng(p); });
  quint64 reusedSeed = 0;
  connect(&gallery, &ui::GalleryView::reuseSeed, tab.get(), [&](quint64 s) { reusedSeed = s; });

  setBasics(tab.get(), QStringLiteral("a red fox in snow, (winter:1.1)"), 3, 1234);
  child<QPlainTextEdit>(tab.get(), "negativePrompt")->setPlainText(QStringLiteral("blurry, lowres"));
  auto* sampler = child<QComboBox>(tab.get(), "sampler");
  auto* scheduler = child<QComboBox>(tab.get(), "scheduler");
  sampler->setCurrentIndex(sampler->findData(QStringLiteral("dpmpp_2m")));
  scheduler->setCurrentIndex(scheduler->findData(QStringLiteral("karras")));
  child<QDoubleSpinBox>(tab.get(), "cfg")->setValue(5.5);
  QSignalSpy saved(tab.get(), &PaintTab::imagesSaved);
  QTest::mouseClick(child<QPushButton>(tab.get(), "generate"), Qt::LeftButton);
  QTRY_COMPARE_WITH_TIMEOUT(saved.count(), 1, kJobMs);
  const QString file = QFileInfo(saved.at(0).at(0).toStringList().value(0)).absoluteFilePath();
  QTRY_VERIFY(gallery.count() >= 1);
  QCOMPARE(gallery.paths().first(), file);  // newest first
  QCOMPARE(gallery.currentPath(), file);
  QTRY_VERIFY_WITH_TIMEOUT(gallery.model()->data(gallery.model()->index(0), ui::GalleryModel::ThumbnailReadyRole).toBool(), 10000);
  QVERIFY(gallery.model()->data(gallery.model()->index(0), Qt::ToolTipRole).toString().contains(QStringLiteral("a red fox in snow")));
  gallery.grab().save(screenshotDir() + QStringLiteral("/gallery.png"));

  // Change everything, then reuse the picture's parameters from the gallery.
  setBasics(tab.get(), QStringLiteral("something else"), 17, 5);
  child<QPlainTextEdit>(tab.get(), "negativePrompt")->clear();
  sampler->setCurrentIndex(sampler->findData(QStringLiteral("euler")));
  scheduler->setCurrentIndex(scheduler->findData(QStringLiteral("discrete")));
  child<QDoubleSpinBox>(tab.get(), "cfg")->setValue(9);
  child<QSpinBox>(tab.get(), "width")->setValue(512);
  child<ui::ModelPicker>(tab.get(), "imageModel")->setReference(quickdraw_);
  child<QAction>(&gallery, "galleryReuseParameters")->trigger();
  QVERIFY2(missed.isEmpty(), qPrintable(missed.join("; ")));
  QCOMPARE(child<QPlainTextEdit>(tab.get(), "prompt")->toPlainText(), QStringLiteral("a red fox in snow, (winter:1.1)"));
  QCOMPARE(child<QPlainTextEdit>(tab.get(), "negativePrompt")->toPlainText(), QStringLiteral("blurry, lowres"));
  QCOMPARE(child<QSpinBox>(tab.get(), "steps")->value(), 3);
  QCOMPARE(sampler->currentData().toString(), QStringLiteral("dpmpp_2m"));
  QCOMPARE(scheduler->currentData().toString(), QStringLiteral("karras"));
  QCOMPARE(child<QDoubleSpinBox>(tab.get(), "cfg")->value(), 5.5);
  QCOMPARE(child<QSpinBox>(tab.get(), "width")->value(), 64);
  QCOMPARE(child<QSpinBox>(tab.get(), "height")->value(), 64);
  auto* seed = child<ui::SeedBox>(tab.get(), "seedBox");
  QCOMPARE(seed->seed(), quint64(1234));
  QVERIFY(seed->locked());
  QCOMPARE(child<ui::ModelPicker>(tab.get(), "imageModel")->reference(), sd_);

  child<QAction>(&gallery, "galleryReuseSeed")->trigger();
  QCOMPARE(reusedSeed, quint64(1234));

  // The same parameters, the same picture.
  QTest::mouseClick(child<QPushButton>(tab.get(), "generate"), Qt::LeftButton);
  QTRY_COMPARE_WITH_TIMEOUT(saved.count(), 2, kJobMs);
  QCOMPARE(pixels(QImage(saved.at(1).at(0).toStringList().value(0))), pixels(QImage(file)));
  QTRY_COMPARE(gallery.count() >= 2, true);
}

void PaintTest::pngRestoresParameters() {
  auto tab = newTab();
  auto* sampler = child<QComboBox>(tab.get(), "sampler");
  sampler->setCurrentIndex(sampler->findData(QStringLiteral("heun")));
  // A1111 1.9 style: a sampler Atelier lacks, hires fix keys, a quoted value, a model not installed.
  QImage img(64, 64, QImage::Format_RGB32);
  img.fill(Qt::darkCyan);
  img.setText(QStringLiteral("parameters"),
              QStringLiteral("a castle on a hill, (golden hour:1.2)\nsecond line\nNegative prompt: fog, low quality\n"
                             "Steps: 28, Sampler: DPM++ SDE Karras, CFG scale: 6.5, Seed: 987654321, Size: 512x768, "
                             "Model hash: 6ce0161689, Model: v1-5-pruned-emaonly, Denoising strength: 0.7, Hires upscale: 2, "
                             "Hires upscaler: Latent, Lora hashes: \"add_detail: 7c6bad76eb54, other: 1\", Version: v1.9.4"));
  const QString a1111 = home_->path(QStringLiteral("a1111.png"));
  QVERIFY(img.save(a1111));
  QSignalSpy status(tab.get(), &PaintTab::statusMessage);
  const QStringList missed = tab->restoreFromPng(a1111);
  QCOMPARE(child<QPlainTextEdit>(tab.get(), "prompt")->toPlainText(), QStringLiteral("a castle on a hill, (golden hour:1.2)\nsecond line"));
  QCOMPARE(child<QPlainTextEdit>(tab.get(), "negativePrompt")->toPlainText(), QStringLiteral("fog, low quality"));
  QCOMPARE(child<QSpinBox>(tab.get(), "steps")->value(), 28);
  QCOMPARE(child<QDoubleSpinBox>(tab.get(), "cfg")->value(), 6.5);
  QCOMPARE(child<ui::SeedBox>(tab.get(), "seedBox")->seed(), quint64(987654321));
  QCOMPARE(child<QSpinBox>(tab.get(), "width")->value(), 512);
  QCOMPARE(child<QSpinBox>(tab.get(), "height")->value(), 768);
  QCOMPARE(child<QComboBox>(tab.get(), "scheduler")->currentData().toString(), QStringLiteral("karras"));  // "... Karras"
  QCOMPARE(sampler->currentData().toString(), QStringLiteral("heun"));  // kept
  QCOMPARE(child<ui::ModelPicker>(tab.get(), "imageModel")->reference(), sd_);  // kept
  auto has = [&](const QString& start) {
    return std::any_of(missed.begin(), missed.end(), [&](const QString& m) { return m.startsWith(start); });
  };
  QVERIFY2(has(QStringLiteral("Sampler: DPM++ SDE Karras")), qPrintable(missed.join("; ")));
  QVERIFY2(has(QStringLiteral("Model: v1-5-pruned-emaonly, hash 6ce0161689")), qPrintable(missed.join("; ")));
  QVERIFY(has(QStringLiteral("Hires upscale: 2")));
  QVERIFY(has(QStringLiteral("Hires upscaler: Latent")));
  QVERIFY(has(QStringLiteral("Denoising strength: 0.7")));
  QVERIFY(missed.contains(QStringLiteral("Lora hashes: add_detail: 7c6bad76eb54, other: 1")));
  QVERIFY(!has(QStringLiteral("Version")));
  QCOMPARE(missed.size(), 6);
  QVERIFY(status.count() > 0 && status.last().at(0).toString().contains(QStringLiteral("not restored")));

  // Forge style: the schedule as its own key, a model named by its file's stem, Forge-only keys.
  img.setText(QStringLiteral("parameters"),
              QStringLiteral("portrait of a robot\nSteps: 12, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 1, "
                             "Distilled CFG Scale: 3.5, Seed: 77, Size: 64x64, Model: %1, Version: f2.0.1v1.10.1")
                  .arg(QFileInfo(sd_).completeBaseName()));
  const QString forge = home_->path(QStringLiteral("forge.png"));
  QVERIFY(img.save(forge));
  child<ui::ModelPicker>(tab.get(), "imageModel")->setReference(quickdraw_);
  const QStringList forgeMissed = tab->restoreFromPng(forge);
  QCOMPARE(forgeMissed, QStringList{QStringLiteral("Distilled CFG Scale: 3.5")});
  QCOMPARE(sampler->currentData().toString(), QStringLiteral("dpmpp_2m"));
  QCOMPARE(child<QComboBox>(tab.get(), "scheduler")->currentData().toString(), QStringLiteral("karras"));
  QCOMPARE(child<ui::ModelPicker>(tab.get(), "imageModel")->reference(), sd_);  // found by the file's stem
  QCOMPARE(child<QSpinBox>(tab.get(), "width")->value(), 64);

  // A PNG without parameters says so.
  QImage plain(8, 8, QImage::Format_RGB32);
  plain.fill(Qt::red);
  QVERIFY(plain.save(home_->path(QStringLiteral("plain.png"))));
  const QStringList none = tab->restoreFromPng(home_->path(QStringLiteral("plain.png")));
  QCOMPARE(none.size(), 1);
  QVERIFY(none[0].contains(QStringLiteral("no generation parameters")));
  // applyParameters takes the text itself.
  QVERIFY(tab->applyParameters(QStringLiteral("a kite\nSteps: 5, Sampler: Euler a, CFG scale: 4, Seed: 9, Size: 64x64")).isEmpty());
  QCOMPARE(sampler->currentData().toString(), QStringLiteral("euler_a"));
  QCOMPARE(child<QComboBox>(tab.get(), "scheduler")->currentData().toString(), QStringLiteral("discrete"));
}

void PaintTest::droppedPngRestoresAndDroppedPictureIsInit() {
  auto tab = newTab();
  QImage img(96, 48, QImage::Format_RGB32);
  img.fill(Qt::darkGreen);
  img.setText(QStringLiteral("parameters"), QStringLiteral("a green field\nSteps: 9, Sampler: Euler, CFG scale: 3, Seed: 11, Size: 64x64"));
  const QString png = home_->path(QStringLiteral("dropped.png"));
  QVERIFY(img.save(png));
  auto drop = [](QWidget* target, const QString& path) {
    QMimeData mime;
    mime.setUrls({QUrl::fromLocalFile(path)});
    QDragEnterEvent enter(QPoint(10, 10), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(target, &enter);
    QDropEvent dropEvent(QPointF(10, 10), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(target, &dropEvent);
    return enter.isAccepted();
  };
  // On the panel: its parameters.
  QVERIFY(drop(tab.get(), png));
  QCOMPARE(child<QPlainTextEdit>(tab.get(), "prompt")->toPlainText(), QStringLiteral("a green field"));
  QCOMPARE(child<QSpinBox>(tab.get(), "steps")->value(), 9);
  QVERIFY(tab->initImage().isEmpty());
  // On the canvas: the init image for img2img.
  QVERIFY(drop(child<ui::PaintCanvas>(tab.get(), "canvas"), png));
  QCOMPARE(tab->initImage(), QFileInfo(png).absoluteFilePath());
  QVERIFY(child<ui::MaskEditor>(tab.get(), "maskEditor")->hasImage());
  QCOMPARE(child<QTabWidget>(tab.get(), "canvasPages")->currentIndex(), 1);
  QVERIFY(child<QSlider>(tab.get(), "strength")->isEnabled());
  QCOMPARE(child<QSpinBox>(tab.get(), "width")->value(), 64);  // from its parameters
  QTest::mouseClick(child<QPushButton>(tab.get(), "initSize"), Qt::LeftButton);  // no stretching
  QCOMPARE(child<QSpinBox>(tab.get(), "width")->value(), 96);
  QCOMPARE(child<QSpinBox>(tab.get(), "height")->value(), 48);
  QTest::mouseClick(child<QPushButton>(tab.get(), "clearInit"), Qt::LeftButton);
  QVERIFY(tab->initImage().isEmpty());
  QVERIFY(!child<QSlider>(tab.get(), "strength")->isEnabled());
}

void PaintTest::stopWhenQueuedAndWhileSubmitting() {
  auto tab = newTab();
  setBasics(tab.get(), QStringLiteral("a queued owl"), 4, 3);
  bridge_->setPaused(true);  // holds the job in the queue
  // Resumed however this test ends, so a failure here cannot hang the next test.
  const auto resume = qScopeGuard([this] { bridge_->setPaused(false); });
  QSignalSpy saved(tab.get(), &PaintTab::imagesSaved);
  auto* progress = child<QProgressBar>(tab.get(), "progress");
  auto* stop = child<QPushButton>(tab.get(), "stop");
  QTest::mouseClick(child<QPushButton>(tab.get(), "generate"), Qt::LeftButton);
  QTRY_COMPARE_WITH_TIMEOUT(tab->phase(), PaintTab::Phase::Queued, 10000);
  QVERIFY(stop->isEnabled());
  // The queue's paused state reaches the tab by its own event, which may come
  // after the job's queued one.
  QTRY_VERIFY2_WITH_TIMEOUT(progress->format().contains(QStringLiteral("paused")), qPrintable(progress->format()), 10000);
  const JobId queued = tab->jobId();
  QVERIFY(queued != 0);
  QTRY_VERIFY(jobIn(*bridge_, queued).has_value());
  QCOMPARE(jobIn(*bridge_, queued)->state, JobState::Queued);
  // Esc in the prompt stops.
  QTest::keyClick(child<QPlainTextEdit>(tab.get(), "prompt"), Qt::Key_Escape);
  QCOMPARE(tab->phase(), PaintTab::Phase::Stopping);
  QVERIFY2(progress->format().contains(QStringLiteral("stopping")), qPrintable(progress->format()));
  QVERIFY(!stop->isEnabled());
  QTRY_COMPARE_WITH_TIMEOUT(tab->phase(), PaintTab::Phase::Idle, 10000);
  QCOMPARE(progress->format(), QStringLiteral("stopped"));
  QTRY_VERIFY(jobIn(*bridge_, queued) && jobIn(*bridge_, queued)->state == JobState::Cancelled);

  // Stop before the engine even named the job: cancelled as soon as it does.
  tab->generate();
  QCOMPARE(tab->phase(), PaintTab::Phase::Submitting);
  tab->stop();
  QCOMPARE(tab->phase(), PaintTab::Phase::Stopping);
  QTRY_COMPARE_WITH_TIMEOUT(tab->phase(), PaintTab::Phase::Idle, 10000);
  const auto jobs = bridge_->jobs();
  QVERIFY(!jobs.isEmpty());
  QTRY_VERIFY(bridge_->jobs().first().state == JobState::Cancelled);
  bridge_->setPaused(false);
  QTest::qWait(300);
  QCOMPARE(saved.count(), 0);
}

// Issue 35: an accepted request that would take unusually long says so near
// Generate when it queues (the engine's estimate), and a quick one says nothing.
void PaintTest::longRequestShowsTheEstimateWarning() {
  auto tab = newTab();
  setBasics(tab.get(), QStringLiteral("a patient lighthouse"), 4, 5);
  bridge_->setPaused(true);  // nothing runs: only the submission is looked at
  const auto resume = qScopeGuard([this] { bridge_->setPaused(false); });
  auto* notice = child<QLabel>(tab.get(), "paintNotice");
  QVERIFY(notice);
  auto* generate = child<QPushButton>(tab.get(), "generate");

  // Quick: queued without a warning.
  QTest::mouseClick(generate, Qt::LeftButton);
  QTRY_COMPARE_WITH_TIMEOUT(tab->phase(), PaintTab::Phase::Queued, 10000);
  QTest::qWait(300);  // any estimate answer has come by now (it is asked before the submission)
  QVERIFY2(!notice->isVisible(), qPrintable(notice->text()));
  tab->stop();
  QTRY_COMPARE_WITH_TIMEOUT(tab->phase(), PaintTab::Phase::Idle, 10000);

  // 1536x1536, 1000 steps, 100 rounds: fits in memory, takes days here.
  child<QSpinBox>(tab.get(), "width")->setValue(1536);
  child<QSpinBox>(tab.get(), "height")->setValue(1536);
  child<QSpinBox>(tab.get(), "steps")->setValue(1000);
  child<QSpinBox>(tab.get(), "batchCount")->setValue(100);
  QTest::mouseClick(generate, Qt::LeftButton);
  QTRY_COMPARE_WITH_TIMEOUT(tab->phase(), PaintTab::Phase::Queued, 30000);
  QTRY_VERIFY_WITH_TIMEOUT(notice->isVisible(), 10000);
  QVERIFY2(notice->text().contains(QStringLiteral("1536x1536 image would take about")) &&
               notice->text().contains(QRegularExpression(QStringLiteral("about \\d+ hours"))),
           qPrintable(notice->text()));
  QVERIFY2(!tab->findChild<QLabel*>(QStringLiteral("paintError"))->isVisible(), "a warning is not an error");
  // Near Generate: directly above it, in view.
  QVERIFY(notice->mapTo(tab.get(), QPoint(0, notice->height())).y() <= generate->mapTo(tab.get(), QPoint(0, 0)).y());
  QVERIFY(notice->visibleRegion().boundingRect().height() == notice->height());
  tab->grab().save(screenshotDir() + QStringLiteral("/paint-long-request-warning.png"));
  tab->stop();
  QTRY_COMPARE_WITH_TIMEOUT(tab->phase(), PaintTab::Phase::Idle, 10000);
  QVERIFY(!notice->isVisible());  // the warning was about that job
}

void PaintTest::stopWhileRunning() {
  auto tab = newTab();
  setBasics(tab.get(), QStringLiteral("a long walk"), 400, 8);
  QSignalSpy saved(tab.get(), &PaintTab::imagesSaved);
  auto* progress = child<QProgressBar>(tab.get(), "progress");
  QTest::mouseClick(child<QPushButton>(tab.get(), "generate"), Qt::LeftButton);
  QTRY_VERIFY_WITH_TIMEOUT(tab->phase() == PaintTab::Phase::Running && progress->value() >= 2, kJobMs);
  const JobId id = tab->jobId();
  QTest::mouseClick(child<QPushButton>(tab.get(), "stop"), Qt::LeftButton);
  QCOMPARE(tab->phase(), PaintTab::Phase::Stopping);
  QVERIFY2(progress->format().contains(QStringLiteral("stopping")), qPrintable(progress->format()));
  QTRY_COMPARE_WITH_TIMEOUT(tab->phase(), PaintTab::Phase::Idle, 20000);
  QCOMPARE(progress->format(), QStringLiteral("stopped"));
  QVERIFY2(progress->value() < 400, "the job ran to its end instead of stopping");
  QTRY_VERIFY(jobIn(*bridge_, id) && jobIn(*bridge_, id)->state == JobState::Cancelled);
  QCOMPARE(saved.count(), 0);
}

void PaintTest::quickDrawOnePass() {
  auto tab = newTab();
  child<ui::ModelPicker>(tab.get(), "imageModel")->setReference(quickdraw_);
  child<QPlainTextEdit>(tab.get(), "prompt")->setPlainText(QStringLiteral("airplane"));
  child<QSpinBox>(tab.get(), "width")->setValue(256);
  child<QSpinBox>(tab.get(), "height")->setValue(256);
  child<ui::SeedBox>(tab.get(), "seedBox")->setSeed(5);
  QSignalSpy saved(tab.get(), &PaintTab::imagesSaved);
  QTest::mouseClick(child<QPushButton>(tab.get(), "generate"), Qt::LeftButton);
  QTRY_COMPARE_WITH_TIMEOUT(saved.count(), 1, kJobMs);
  const QString file = saved.at(0).at(0).toStringList().value(0);
  QCOMPARE(QImage(file).size(), QSize(256, 256));
  auto* canvas = child<ui::PaintCanvas>(tab.get(), "canvas");
  QTRY_COMPARE_WITH_TIMEOUT(canvas->image().size(), QSize(256, 256), 10000);
  QVERIFY(!child<QListWidget>(tab.get(), "batchStrip")->isVisible());
  // Its PNG restores without complaint (the one-pass decoder has no sampler to restore).
  QVERIFY2(tab->restoreFromPng(file).isEmpty(), qPrintable(tab->restoreFromPng(file).join("; ")));
  QCOMPARE(child<ui::ModelPicker>(tab.get(), "imageModel")->reference(), quickdraw_);
  QCOMPARE(child<QPlainTextEdit>(tab.get(), "prompt")->toPlainText(), QStringLiteral("airplane"));
  // A prompt naming no class fails with the engine's reason, shown in the tab.
  child<QPlainTextEdit>(tab.get(), "prompt")->setPlainText(QStringLiteral("zzzz qqqq"));
  QTest::mouseClick(child<QPushButton>(tab.get(), "generate"), Qt::LeftButton);
  auto* error = child<QLabel>(tab.get(), "paintError");
  QTRY_VERIFY_WITH_TIMEOUT(tab->phase() == PaintTab::Phase::Idle && error->isVisible(), kJobMs);
  QVERIFY(!error->text().isEmpty());
}

// QuickDraw, as a first-time user met it: no list of its classes, and the sampler,
// steps and CFG (which a one-pass decoder does not use) looked as if they mattered.
void PaintTest::quickDrawHasAClassPickerAndNoSampler() {
  auto tab = newTab();
  auto* classes = tab->findChild<QComboBox*>(QStringLiteral("quickdrawClass"));
  QVERIFY2(classes, "no class picker");
  // With the SD model chosen (the picker settles after the scan: under load
  // the check ran while it still showed the first model found), no classes.
  auto* picker = child<ui::ModelPicker>(tab.get(), "imageModel");
  picker->setReference(sd_);
  QTRY_VERIFY_WITH_TIMEOUT(picker->reference() == sd_ && !classes->isVisible(), 10000);
  picker->setReference(quickdraw_);
  QTRY_VERIFY_WITH_TIMEOUT(classes->isVisible(), 10000);
  QCOMPARE(classes->count(), 50);  // the model's own labels
  QVERIFY(classes->findText(QStringLiteral("airplane")) >= 0);
  for (const char* name : {"sampler", "scheduler", "steps", "cfg"})
    QVERIFY2(!child<QWidget>(tab.get(), name)->isEnabled(), name);
  classes->setCurrentIndex(classes->findText(QStringLiteral("anvil")));
  QCOMPARE(child<QPlainTextEdit>(tab.get(), "prompt")->toPlainText(), QStringLiteral("anvil"));
  // Back to Stable Diffusion: its fields again, no class picker.
  child<ui::ModelPicker>(tab.get(), "imageModel")->setReference(sd_);
  QTRY_VERIFY_WITH_TIMEOUT(!classes->isVisible(), 10000);
  for (const char* name : {"sampler", "scheduler", "steps", "cfg"})
    QVERIFY2(child<QWidget>(tab.get(), name)->isEnabled(), name);
}

void PaintTest::img2imgWithPaintedMask() {
  auto tab = newTab();
  setBasics(tab.get(), QStringLiteral("a llama wearing sunglasses"), 4, 21);
  QVERIFY(tab->setInitImage(uitest::fixtures() + QStringLiteral("/image/llama_cute.jpg")));
  child<QSlider>(tab.get(), "strength")->setValue(60);
  auto* mask = child<ui::MaskEditor>(tab.get(), "maskEditor");
  QVERIFY(mask->hasImage());
  QVERIFY(!mask->hasMask());
  mask->setBrushSize(40);
  mask->paintStroke({QPoint(20, 20), QPoint(mask->image().width() / 2, mask->image().height() / 2)});
  QVERIFY(mask->hasMask());
  QVERIFY(mask->coverage() > 0.0 && mask->coverage() < 1.0);
  QVERIFY(child<QToolButton>(tab.get(), "clearMask")->isEnabled());
  tab->grab().save(screenshotDir() + QStringLiteral("/paint-mask.png"));
  QSignalSpy saved(tab.get(), &PaintTab::imagesSaved);
  QTest::mouseClick(child<QPushButton>(tab.get(), "generate"), Qt::LeftButton);
  QTRY_COMPARE_WITH_TIMEOUT(saved.count(), 1, kJobMs);
  const QString file = saved.at(0).at(0).toStringList().value(0);
  QImageReader reader(file);
  QVERIFY2(reader.text(QStringLiteral("parameters")).contains(QStringLiteral("Denoising strength: 0.6")),
           qPrintable(reader.text(QStringLiteral("parameters"))));
  const QString request = reader.text(QStringLiteral("atelier"));
  QVERIFY2(request.contains(QStringLiteral("llama_cute.jpg")), qPrintable(request));
  // The mask went to the data dir's temp folder, white where painted.
  const QFileInfoList masks = QDir(home_->home() + QStringLiteral("/temp")).entryInfoList({QStringLiteral("mask-*.png")});
  QVERIFY(!masks.isEmpty());
  QVERIFY(request.contains(masks.last().fileName()));
  const QImage m(masks.last().absoluteFilePath());
  QCOMPARE(m.size(), mask->image().size());
  QCOMPARE(qGray(m.pixel(20, 20)), 255);
  QCOMPARE(qGray(m.pixel(m.width() - 2, 2)), 0);
  // Erase takes part of it back out; Clear removes it.
  mask->setErasing(true);
  mask->paintStroke({QPoint(20, 20)});
  QCOMPARE(qGray(mask->mask().pixel(20, 20)), 0);
  QTest::mouseClick(child<QToolButton>(tab.get(), "clearMask"), Qt::LeftButton);
  QVERIFY(!mask->hasMask());
}

void PaintTest::galleryListsDeletesAndUndoes() {
  const QString folder = home_->path(QStringLiteral("gallery"));
  QDir().mkpath(folder);
  QStringList made;
  for (int i = 0; i < 3; ++i) {
    QImage img(96, 64, QImage::Format_RGB32);
    img.fill(QColor::fromHsv(i * 100, 200, 200));
    img.setText(QStringLiteral("parameters"),
                QStringLiteral("picture %1\nSteps: 4, Sampler: Euler, CFG scale: 7, Seed: %2, Size: 96x64").arg(i).arg(100 + i));
    const QString p = folder + QStringLiteral("/img-%1.png").arg(i);
    QVERIFY(img.save(p));
    QFile f(p);
    QVERIFY(f.open(QIODevice::ReadWrite));
    QVERIFY(f.setFileTime(QDateTime::currentDateTime().addSecs(-100 + i * 10), QFileDevice::FileModificationTime));
    made << QFileInfo(p).absoluteFilePath();
  }
  ui::GalleryView gallery;
  gallery.resize(420, 500);
  gallery.show();
  gallery.setFolder(folder);
  QTRY_COMPARE(gallery.count(), 3);
  QCOMPARE(gallery.paths(), (QStringList{made[2], made[1], made[0]}));  // newest first
  // The header shows the folder's end (its own name) within the dock's width, not a path cut off at the right.
  {
    gallery.resize(220, 500);
    auto* header = child<QLabel>(&gallery, "galleryCount");
    QTRY_VERIFY(header->fontMetrics().horizontalAdvance(header->text()) <= header->width());
    QVERIFY2(header->text().endsWith(QStringLiteral("gallery")), qPrintable(header->text()));
    QVERIFY(header->toolTip().contains(QDir::toNativeSeparators(folder)));
    gallery.resize(420, 500);
  }
  QTRY_VERIFY_WITH_TIMEOUT(gallery.model()->data(gallery.model()->index(2), ui::GalleryModel::ThumbnailReadyRole).toBool(), 10000);
  const QPixmap thumb = gallery.model()->data(gallery.model()->index(2), Qt::DecorationRole).value<QPixmap>();
  QVERIFY(thumb.width() <= gallery.model()->thumbnailSize() && thumb.width() > 0);

  // Click views at full size; arrow keys move.
  const QRect r1 = gallery.listView()->visualRect(gallery.model()->index(1));
  QTest::mouseClick(gallery.listView()->viewport(), Qt::LeftButton, Qt::NoModifier, r1.center());
  QTRY_VERIFY(gallery.viewer()->isVisible());
  QCOMPARE(gallery.viewer()->path(), made[1]);
  QTRY_COMPARE(gallery.viewer()->image().size(), QSize(96, 64));
  QTest::keyClick(gallery.viewer(), Qt::Key_Right);
  QCOMPARE(gallery.viewer()->path(), made[0]);
  QCOMPARE(gallery.currentPath(), made[0]);
  QTest::keyClick(gallery.viewer(), Qt::Key_Left);
  QCOMPARE(gallery.viewer()->path(), made[1]);
  gallery.viewer()->hide();

  // Reuse seed / send to img2img come from the current picture.
  quint64 seed = 0;
  QString img2img;
  connect(&gallery, &ui::GalleryView::reuseSeed, this, [&](quint64 s) { seed = s; });
  connect(&gallery, &ui::GalleryView::sendToImg2img, this, [&](const QString& p) { img2img = p; });
  child<QAction>(&gallery, "galleryReuseSeed")->trigger();
  QCOMPARE(seed, quint64(101));
  child<QAction>(&gallery, "gallerySendToImg2img")->trigger();
  QCOMPARE(img2img, made[1]);
  child<QAction>(&gallery, "galleryCopyPrompt")->trigger();
  QCOMPARE(QApplication::clipboard()->text(), QStringLiteral("picture 1"));

  // Delete moves it to .trash; undo brings it back to its place.
  child<QAction>(&gallery, "galleryDelete")->trigger();
  QCOMPARE(gallery.count(), 2);
  QVERIFY(!QFile::exists(made[1]));
  QVERIFY(QFile::exists(folder + QStringLiteral("/.trash/img-1.png")));
  QVERIFY(child<QAction>(&gallery, "galleryUndoDelete")->isEnabled());
  child<QAction>(&gallery, "galleryUndoDelete")->trigger();
  QCOMPARE(gallery.count(), 3);
  QVERIFY(QFile::exists(made[1]));
  QCOMPARE(gallery.paths().at(1), made[1]);
  // Ctrl+Z on the list undoes too (and redo moves it away again).
  gallery.setCurrentPath(made[0]);
  child<QAction>(&gallery, "galleryDelete")->trigger();
  QVERIFY(!QFile::exists(made[0]));
  gallery.undoStack()->undo();
  QVERIFY(QFile::exists(made[0]));
  gallery.undoStack()->redo();
  QVERIFY(!QFile::exists(made[0]));
  QCOMPARE(gallery.count(), 2);
  gallery.undoStack()->undo();
  QCOMPARE(gallery.count(), 3);

  // New results come first.
  QImage fresh(32, 32, QImage::Format_RGB32);
  fresh.fill(Qt::yellow);
  const QString freshPath = folder + QStringLiteral("/fresh.png");
  QVERIFY(fresh.save(freshPath));
  gallery.addImages({freshPath});
  QCOMPARE(gallery.paths().first(), QFileInfo(freshPath).absoluteFilePath());
  QCOMPARE(gallery.count(), 4);
  gallery.addImages({freshPath});  // listed once
  QCOMPARE(gallery.count(), 4);
}

void PaintTest::settingsRoundTrip() {
  const QString file = home_->path(QStringLiteral("paint.ini"));
  {
    auto tab = newTab();
    setBasics(tab.get(), QStringLiteral("kept across restarts"), 13, 31337);
    child<QPlainTextEdit>(tab.get(), "negativePrompt")->setPlainText(QStringLiteral("noise"));
    auto* sampler = child<QComboBox>(tab.get(), "sampler");
    sampler->setCurrentIndex(sampler->findData(QStringLiteral("ddim")));
    child<QSpinBox>(tab.get(), "batchCount")->setValue(3);
    child<QComboBox>(tab.get(), "rng")->setCurrentIndex(1);
    child<QSlider>(tab.get(), "strength")->setValue(40);
    QSettings s(file, QSettings::IniFormat);
    tab->saveSettings(s);
  }
  auto tab = newTab();
  QSettings s(file, QSettings::IniFormat);
  tab->loadSettings(s);
  QCOMPARE(child<QPlainTextEdit>(tab.get(), "prompt")->toPlainText(), QStringLiteral("kept across restarts"));
  QCOMPARE(child<QPlainTextEdit>(tab.get(), "negativePrompt")->toPlainText(), QStringLiteral("noise"));
  QCOMPARE(child<QSpinBox>(tab.get(), "steps")->value(), 13);
  QCOMPARE(child<QComboBox>(tab.get(), "sampler")->currentData().toString(), QStringLiteral("ddim"));
  QCOMPARE(child<QSpinBox>(tab.get(), "width")->value(), 64);
  QCOMPARE(child<QSpinBox>(tab.get(), "batchCount")->value(), 3);
  QCOMPARE(child<QComboBox>(tab.get(), "rng")->currentData().toString(), QStringLiteral("cpu"));
  QCOMPARE(child<QSlider>(tab.get(), "strength")->value(), 40);
  QCOMPARE(child<ui::SeedBox>(tab.get(), "seedBox")->seed(), quint64(31337));
  QVERIFY(child<ui::SeedBox>(tab.get(), "seedBox")->locked());
  QCOMPARE(child<ui::ModelPicker>(tab.get(), "imageModel")->reference(), sd_);
}

QTEST_MAIN(PaintTest)
#include "paint_test.moc"
