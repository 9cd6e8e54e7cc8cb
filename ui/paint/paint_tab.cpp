#include "paint/paint_tab.h"

#include <QComboBox>
#include <QDateTime>
#include <QDir>
#include <QDoubleSpinBox>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QFuture>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QImageReader>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QKeyEvent>
#include <QLabel>
#include <QListWidget>
#include <QMimeData>
#include <QPlainTextEdit>
#include <QPointer>
#include <QProgressBar>
#include <QPushButton>
#include <QScrollArea>
#include <QScrollBar>
#include <QSettings>
#include <QShortcut>
#include <QSlider>
#include <QSpinBox>
#include <QSplitter>
#include <QTabWidget>
#include <QToolButton>
#include <QVBoxLayout>
#include <QtConcurrent/QtConcurrentRun>

#include <algorithm>
#include <QRegularExpression>
#include <cctype>
#include <cmath>

#include "bridge/engine_bridge.h"
#include "common/fold_section.h"
#include "common/model_picker.h"
#include "common/seed_box.h"
#include "paint/infotext.h"
#include "paint/paint_canvas.h"

namespace atelier::ui {

namespace {

// Width and height: multiples of 8 (the VAE's factor). Other values are
// Intermediate while typing and rounded to the nearest multiple on Enter or
// when the field loses focus.
class EightSpinBox : public QSpinBox {
 public:
  explicit EightSpinBox(QWidget* parent = nullptr) : QSpinBox(parent) {
    setRange(8, 4096);
    setSingleStep(8);
    setSuffix(QStringLiteral(" px"));
    setAccelerated(true);
  }

 protected:
  QValidator::State validate(QString& text, int& pos) const override {
    const QValidator::State s = QSpinBox::validate(text, pos);
    if (s != QValidator::Acceptable) return s;
    return valueFromText(text) % 8 == 0 ? QValidator::Acceptable : QValidator::Intermediate;
  }
  void fixup(QString& text) const override {
    const int v = valueFromText(text);
    text = textFromValue(std::clamp((v + 4) / 8 * 8, minimum(), maximum()));
  }
};

struct SizePreset {
  int width, height;
  const char* note;
};
constexpr SizePreset kPresets[] = {
    {512, 512, "SD 1.x square"},  {768, 768, "SD 2.x square"}, {512, 768, "portrait 2:3"},
    {768, 512, "landscape 3:2"},  {640, 640, "square"},        {1024, 1024, "large square"},
    {256, 256, "small, fast"},    {64, 64, "tiny: a quick test"},
};

const char* const kSamplerLabels[][2] = {
    {"euler_a", "Euler a"}, {"euler", "Euler"}, {"heun", "Heun"},
    {"dpmpp_2m", "DPM++ 2M"}, {"ddim", "DDIM"}, {"lcm", "LCM"},
};

QString formatSeconds(double s) {
  if (!std::isfinite(s) || s < 0) return QStringLiteral("?");
  if (s < 60) return QStringLiteral("%1 s").arg(s, 0, 'f', s < 10 ? 1 : 0);
  const int t = static_cast<int>(std::lround(s));
  return QStringLiteral("%1:%2").arg(t / 60).arg(t % 60, 2, 10, QLatin1Char('0'));
}

QImage previewImage(const ImageProgress& p) {
  if (p.preview_width <= 0 || p.preview_height <= 0 ||
      p.preview_rgb.size() != static_cast<size_t>(p.preview_width) * p.preview_height * 3)
    return {};
  return QImage(p.preview_rgb.data(), p.preview_width, p.preview_height, p.preview_width * 3, QImage::Format_RGB888).copy();
}

bool isTerminal(JobState s) { return s == JobState::Completed || s == JobState::Failed || s == JobState::Cancelled; }

// A prompt field whose preferred height is a few lines (QPlainTextEdit's own
// hint is a tall box that would push the parameters out of view).
class PromptEdit : public QPlainTextEdit {
 public:
  PromptEdit(int lines, QWidget* parent) : QPlainTextEdit(parent), lines_(lines) {
    setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Preferred);
  }
  QSize sizeHint() const override {
    const int h = fontMetrics().lineSpacing() * lines_ + 2 * (frameWidth() + static_cast<int>(document()->documentMargin())) + 4;
    return {240, h};
  }
  QSize minimumSizeHint() const override { return {120, sizeHint().height() * 2 / 3}; }

 private:
  int lines_;
};

QLabel* hintLabel(const QString& text, QWidget* parent) {
  auto* l = new QLabel(text, parent);
  l->setWordWrap(true);
  QPalette pal = l->palette();
  pal.setColor(QPalette::WindowText, pal.color(QPalette::PlaceholderText));
  l->setPalette(pal);
  return l;
}

}  // namespace

namespace {
// The class labels of a QuickDraw model (its safetensors header's __metadata__:
// architecture "quickdraw-cvae", labels a JSON list); empty for any other model.
// The header is untrusted: its length is checked before it is read.
QStringList quickdrawClasses(const std::string& ref, const std::string& store) {
  auto resolved = resolve_model(ref, store);
  if (!resolved.ok()) return {};
  QFile f(QString::fromStdString(resolved->path));
  if (!f.open(QIODevice::ReadOnly)) return {};
  quint64 n = 0;
  if (f.read(reinterpret_cast<char*>(&n), 8) != 8 || n == 0 || n > (1u << 20)) return {};  // little-endian u64
  const QJsonObject meta = QJsonDocument::fromJson(f.read(static_cast<qint64>(n))).object().value(QStringLiteral("__metadata__")).toObject();
  if (!meta.value(QStringLiteral("architecture")).toString().startsWith(QStringLiteral("quickdraw"))) return {};
  QStringList out;
  for (const auto& v : QJsonDocument::fromJson(meta.value(QStringLiteral("labels")).toString().toUtf8()).array()) out << v.toString();
  return out;
}
}  // namespace

void PaintTab::applyModelKind(const QString& reference, const QStringList& classes) {
  if (reference != model_->reference()) return;  // another model was chosen meanwhile
  const bool quickdraw = !classes.isEmpty();
  {
    const QSignalBlocker b(quickdrawClass_);
    quickdrawClass_->clear();
    quickdrawClass_->addItems(classes);
    quickdrawClass_->setCurrentIndex(classes.indexOf(prompt_->toPlainText().trimmed()));
  }
  quickdrawClass_->setVisible(quickdraw);
  if (quickdrawRow_) quickdrawRow_->setVisible(quickdraw);
  // A one-pass decoder: no sampler, schedule, steps or guidance (the size scales its doodle).
  for (QWidget* w : {static_cast<QWidget*>(sampler_), static_cast<QWidget*>(scheduler_), static_cast<QWidget*>(steps_),
                     static_cast<QWidget*>(cfg_), static_cast<QWidget*>(negative_)}) {
    w->setEnabled(!quickdraw);
    w->setToolTip(quickdraw ? tr("QuickDraw draws in one pass: this does not apply") : w->property("sdTip").toString());
  }
}

PaintTab::PaintTab(bridge::EngineBridge* bridge, QWidget* parent) : QWidget(parent), bridge_(bridge) {
  setObjectName(QStringLiteral("paintTab"));
  outputFolder_ = QDir(bridge_->options().dataDir).filePath(QStringLiteral("images"));
  auto* layout = new QHBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  auto* split = new QSplitter(Qt::Horizontal, this);
  split->setObjectName(QStringLiteral("paintSplitter"));
  split->addWidget(buildPanel());
  split->addWidget(buildCanvasArea());
  split->setStretchFactor(0, 0);
  split->setStretchFactor(1, 1);
  split->setChildrenCollapsible(false);
  split->setSizes({400, 800});
  layout->addWidget(split);

  connect(bridge_, &bridge::EngineBridge::event, this, &PaintTab::onEvent);
  // Which kind of model: QuickDraw's classes come from its file's header, read off the UI thread.
  connect(model_, &ModelPicker::referenceChanged, this, [this](const QString& ref) {
    const std::string store = (bridge_->options().storeDir.isEmpty() ? bridge_->options().dataDir : bridge_->options().storeDir).toStdString();
    QtConcurrent::run([ref, store] { return quickdrawClasses(ref.toStdString(), store); })
        .then(this, [this, ref](const QStringList& classes) { applyModelKind(ref, classes); });
  });
  connect(quickdrawClass_, &QComboBox::activated, this, [this] { prompt_->setPlainText(quickdrawClass_->currentText()); });
  connect(quickdrawClass_, &QComboBox::currentIndexChanged, this, [this] {
    if (quickdrawClass_->isVisible() && quickdrawClass_->currentIndex() >= 0) prompt_->setPlainText(quickdrawClass_->currentText());
  });
  connect(bridge_, &bridge::EngineBridge::jobsChanged, this,
          [this](const QVector<JobInfo>& changed, const QVector<JobId>&) { onJobsChanged(changed); });
  connect(bridge_, &bridge::EngineBridge::pausedChanged, this, [this] {
    if (phase_ == Phase::Queued) setPhase(Phase::Queued);  // the text says whether the queue is paused
  });

  for (const QKeySequence& key : {QKeySequence(Qt::CTRL | Qt::Key_Return), QKeySequence(Qt::CTRL | Qt::Key_Enter)}) {
    auto* sc = new QShortcut(key, this);
    sc->setContext(Qt::WidgetWithChildrenShortcut);
    connect(sc, &QShortcut::activated, this, &PaintTab::generate);
  }
  // Window-wide: Esc stops whatever has focus (a dock, a disabled button's neighbour); only the shown tab's shortcut is live.
  stopKey_ = new QShortcut(QKeySequence(Qt::Key_Escape), this);
  stopKey_->setContext(Qt::WindowShortcut);
  connect(stopKey_, &QShortcut::activated, this, &PaintTab::stop);
  for (QWidget* w : {static_cast<QWidget*>(sampler_), static_cast<QWidget*>(scheduler_), static_cast<QWidget*>(steps_),
                     static_cast<QWidget*>(cfg_), static_cast<QWidget*>(negative_)})
    w->setProperty("sdTip", w->toolTip());
  setAcceptDrops(true);
  progress_->setRange(0, 1);
  progress_->setValue(0);
  progress_->setFormat(tr("ready: write a prompt and press Generate (Ctrl+Enter)"));
  setPhase(Phase::Idle);
}

PaintTab::~PaintTab() = default;

// ---------------------------------------------------------------- building

QWidget* PaintTab::buildPanel() {
  auto* outer = new QWidget(this);
  outer->setObjectName(QStringLiteral("paintPanel"));
  outer->setMinimumWidth(330);
  outer->setMaximumWidth(560);
  auto* outerLayout = new QVBoxLayout(outer);
  outerLayout->setContentsMargins(0, 0, 0, 0);
  outerLayout->setSpacing(6);

  auto* scroll = new QScrollArea(outer);
  scroll->setObjectName(QStringLiteral("paintScroll"));
  scroll->setWidgetResizable(true);
  scroll->setFrameShape(QFrame::NoFrame);
  scroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  auto* panel = new QWidget(scroll);
  auto* v = new QVBoxLayout(panel);
  v->setContentsMargins(8, 8, 8, 8);
  v->setSpacing(8);
  auto form = [](QGroupBox* box) {
    auto* f = new QFormLayout(box);
    f->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    f->setRowWrapPolicy(QFormLayout::DontWrapRows);
    f->setLabelAlignment(Qt::AlignRight | Qt::AlignVCenter);
    f->setHorizontalSpacing(10);
    f->setVerticalSpacing(6);
    return f;
  };

  // Prompt
  auto* promptBox = new QGroupBox(tr("Prompt"), panel);
  auto* pv = new QVBoxLayout(promptBox);
  prompt_ = new PromptEdit(5, promptBox);
  prompt_->setObjectName(QStringLiteral("prompt"));
  prompt_->setPlaceholderText(tr("Describe the picture: a lighthouse at dusk, (oil painting:1.2)"));
  prompt_->setToolTip(tr("What to paint. A1111 emphasis works: (word:1.3) stresses, [word] softens; "
                         "QuickDraw: name one of its classes (airplane, cat, ...). Ctrl+Enter generates"));
  prompt_->setTabChangesFocus(true);
  negative_ = new PromptEdit(3, promptBox);
  negative_->setObjectName(QStringLiteral("negativePrompt"));
  negative_->setPlaceholderText(tr("Negative prompt: what to avoid (blurry, text, watermark)"));
  negative_->setToolTip(tr("What the picture should not contain (used with CFG above 1); emphasis syntax works here too"));
  negative_->setTabChangesFocus(true);
  prompt_->installEventFilter(this);
  negative_->installEventFilter(this);
  pv->addWidget(prompt_, 3);
  pv->addWidget(negative_, 1);
  v->addWidget(promptBox);

  // Model and sampling
  auto* sampling = new QGroupBox(tr("Model, sampling and size"), panel);
  auto* sf = form(sampling);
  model_ = new ModelPicker(bridge_, QStringLiteral("image"), sampling);
  model_->setObjectName(QStringLiteral("imageModel"));
  model_->setToolTip(tr("The image model: a Stable Diffusion 1.x/2.x checkpoint or the QuickDraw doodle model "
                        "(one pass: steps, CFG and sampler do not apply)"));
  sf->addRow(tr("&Model"), model_);
  quickdrawClass_ = new QComboBox(sampling);
  quickdrawClass_->setObjectName(QStringLiteral("quickdrawClass"));
  quickdrawClass_->setToolTip(tr("The classes the QuickDraw model draws: the choice becomes the prompt"));
  quickdrawClass_->setPlaceholderText(tr("choose what to draw"));
  sf->addRow(tr("C&lass"), quickdrawClass_);
  quickdrawRow_ = sf->labelForField(quickdrawClass_);
  quickdrawClass_->hide();
  if (quickdrawRow_) quickdrawRow_->hide();
  sampler_ = new QComboBox(sampling);
  sampler_->setObjectName(QStringLiteral("sampler"));
  for (const auto& [name, label] : kSamplerLabels) sampler_->addItem(tr(label), QString::fromLatin1(name));
  sampler_->setToolTip(tr("How each denoising step moves: Euler a (ancestral, varied), Euler and Heun (deterministic), "
                          "DPM++ 2M (sharp in few steps), DDIM, LCM (for LCM-distilled models, 4-8 steps)"));
  scheduler_ = new QComboBox(sampling);
  scheduler_->setObjectName(QStringLiteral("scheduler"));
  scheduler_->addItem(tr("Discrete"), QStringLiteral("discrete"));
  scheduler_->addItem(tr("Karras"), QStringLiteral("karras"));
  scheduler_->setToolTip(tr("The noise levels of the steps: Discrete (the model's training schedule) or Karras "
                            "(denser at low noise; often better in few steps). DDIM and LCM use their own"));
  // Two settings a row (the panel fits the default window without scrolling).
  auto pair = [sampling](QWidget* a, const QString& label, QWidget* b) {
    auto* row = new QHBoxLayout;
    row->setSpacing(6);
    row->addWidget(a, 1);
    auto* l = new QLabel(label, sampling);
    l->setBuddy(b);
    row->addWidget(l);
    row->addWidget(b, 1);
    return row;
  };
  auto buddy = [sampling](const QString& label, QWidget* field) {
    auto* l = new QLabel(label, sampling);
    l->setBuddy(field);
    return l;
  };
  sf->addRow(buddy(tr("S&ampler"), sampler_), pair(sampler_, tr("Sc&hedule"), scheduler_));
  steps_ = new QSpinBox(sampling);
  steps_->setObjectName(QStringLiteral("steps"));
  steps_->setRange(1, 1000);
  steps_->setValue(20);
  steps_->setToolTip(tr("Denoising steps: more is slower and usually finer (20-30 is typical)"));
  cfg_ = new QDoubleSpinBox(sampling);
  cfg_->setObjectName(QStringLiteral("cfg"));
  cfg_->setRange(0, 100);
  cfg_->setDecimals(1);
  cfg_->setSingleStep(0.5);
  cfg_->setValue(7.0);
  cfg_->setToolTip(tr("Classifier-free guidance: how closely the picture follows the prompt (5-9 is typical; "
                      "1 turns the negative prompt off and runs twice as fast)"));
  sf->addRow(buddy(tr("S&teps"), steps_), pair(steps_, tr("&CFG"), cfg_));
  v->addWidget(sampling);

  // Size and seed, in the same box (one title less: the panel fits the default window).
  QGroupBox* sizeBox = sampling;
  QFormLayout* zf = sf;
  sizePreset_ = new QComboBox(sizeBox);
  sizePreset_->setObjectName(QStringLiteral("sizePreset"));
  for (const SizePreset& p : kPresets)
    sizePreset_->addItem(QStringLiteral("%1 \u00d7 %2  (%3)").arg(p.width).arg(p.height).arg(tr(p.note)), QSize(p.width, p.height));
  sizePreset_->addItem(tr("Custom"), QSize());
  sizePreset_->setToolTip(tr("Common sizes; SD 1.x models are trained at 512 \u00d7 512, SD 2.x at 768 \u00d7 768"));
  zf->addRow(tr("Si&ze"), sizePreset_);
  width_ = new EightSpinBox(sizeBox);
  width_->setObjectName(QStringLiteral("width"));
  width_->setValue(512);
  width_->setToolTip(tr("Width in pixels: a multiple of 8 from 8 to 4096 (other values are rounded)"));
  height_ = new EightSpinBox(sizeBox);
  height_->setObjectName(QStringLiteral("height"));
  height_->setValue(512);
  height_->setToolTip(tr("Height in pixels: a multiple of 8 from 8 to 4096 (other values are rounded)"));
  swapSize_ = new QToolButton(sizeBox);
  swapSize_->setObjectName(QStringLiteral("swapSize"));
  swapSize_->setText(QStringLiteral("\u21c4"));
  swapSize_->setToolTip(tr("Swap width and height (portrait / landscape)"));
  swapSize_->setAccessibleName(tr("Swap width and height"));
  auto* wh = new QHBoxLayout;
  wh->setSpacing(4);
  wh->addWidget(width_, 1);
  wh->addWidget(new QLabel(QStringLiteral("\u00d7"), sizeBox));
  wh->addWidget(height_, 1);
  wh->addWidget(swapSize_);
  auto* whLabel = new QLabel(tr("&Width \u00d7 height"), sizeBox);
  whLabel->setBuddy(width_);
  zf->addRow(whLabel, wh);
  seed_ = new SeedBox(sizeBox);
  seed_->setObjectName(QStringLiteral("seedBox"));
  seed_->setToolTip(tr("Seed: the same seed, model and parameters paint the same picture; image i of a batch uses seed + i"));
  zf->addRow(tr("S&eed"), seed_);
  rng_ = new QComboBox(sizeBox);
  rng_->setObjectName(QStringLiteral("rng"));
  rng_->addItem(tr("GPU (torch Philox, as A1111)"), QStringLiteral("cuda"));
  rng_->addItem(tr("CPU (torch mt19937)"), QStringLiteral("cpu"));
  rng_->setToolTip(tr("Which generator makes the starting noise: GPU matches A1111's default on any machine, "
                      "CPU matches A1111's \"RNG: CPU\" setting"));
  batchCount_ = new QSpinBox(sizeBox);
  batchCount_->setObjectName(QStringLiteral("batchCount"));
  batchCount_->setRange(1, 100);
  batchCount_->setToolTip(tr("Batch count: how many rounds to run, one after another"));
  batchSize_ = new QSpinBox(sizeBox);
  batchSize_->setObjectName(QStringLiteral("batchSize"));
  batchSize_->setRange(1, 16);
  batchSize_->setToolTip(tr("Batch size: images denoised together in each round (faster per image, more memory)"));
  auto* batch = new QHBoxLayout;
  batch->setSpacing(4);
  batch->addWidget(batchCount_, 1);
  batch->addWidget(new QLabel(QStringLiteral("\u00d7"), sizeBox));
  batch->addWidget(batchSize_, 1);
  auto* batchLabel = new QLabel(tr("&Batch (count \u00d7 size)"), sizeBox);
  batchLabel->setBuddy(batchCount_);
  // Less used: folded under "More" (opened by itself when a restored value differs from the default).
  moreFold_ = new FoldSection(tr("More: batch and noise"), sizeBox);
  moreFold_->setObjectName(QStringLiteral("paintMore"));
  moreFold_->header()->setToolTip(tr("Batch count and size, and which generator makes the starting noise"));
  auto* mf = new QFormLayout(moreFold_->body());
  mf->setContentsMargins(0, 0, 0, 0);
  mf->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
  mf->setLabelAlignment(Qt::AlignRight | Qt::AlignVCenter);
  mf->setHorizontalSpacing(10);
  mf->addRow(batchLabel, batch);
  mf->addRow(tr("&Noise"), rng_);
  zf->addRow(moreFold_);
  // A restored or reused value that is not the default is shown, not hidden behind "More".
  const auto showIfSet = [this] {
    if (batchCount_->value() != 1 || batchSize_->value() != 1 || rng_->currentIndex() > 0) moreFold_->setOpen(true);
  };
  connect(batchCount_, &QSpinBox::valueChanged, this, showIfSet);
  connect(batchSize_, &QSpinBox::valueChanged, this, showIfSet);
  connect(rng_, &QComboBox::currentIndexChanged, this, showIfSet);

  // img2img and inpainting
  // Folded until an init image is set (dropped on the canvas, or Open... here).
  initFold_ = new FoldSection(tr("img2img and inpainting"), panel);
  initFold_->setObjectName(QStringLiteral("initFold"));
  initFold_->header()->setToolTip(tr("Start from a picture (img2img) and paint a mask over what to repaint (inpainting)"));
  QWidget* initBox = initFold_->body();
  auto* ifl = new QFormLayout(initBox);
  ifl->setContentsMargins(8, 0, 0, 0);
  ifl->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
  ifl->setLabelAlignment(Qt::AlignRight | Qt::AlignVCenter);
  ifl->setHorizontalSpacing(10);
  initLabel_ = new QLabel(tr("none"), initBox);
  initLabel_->setObjectName(QStringLiteral("initImage"));
  initLabel_->setToolTip(tr("The starting picture for img2img: drop an image on the canvas or pick one; "
                            "it is resized to the width and height above"));
  initLabel_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  initLabel_->setWordWrap(true);
  ifl->addRow(tr("Init image"), initLabel_);
  pickInit_ = new QPushButton(tr("&Open\u2026"), initBox);
  pickInit_->setObjectName(QStringLiteral("pickInit"));
  pickInit_->setToolTip(tr("Pick a starting picture for img2img (you can also drop one on the canvas)"));
  clearInit_ = new QPushButton(tr("Remove"), initBox);
  clearInit_->setObjectName(QStringLiteral("clearInit"));
  clearInit_->setToolTip(tr("Back to text-to-image: forget the init image and its mask"));
  initSize_ = new QPushButton(tr("Use its size"), initBox);
  initSize_->setObjectName(QStringLiteral("initSize"));
  initSize_->setToolTip(tr("Set width and height to the init image's size (rounded to multiples of 8, at most 2048), "
                           "so it is not stretched"));
  auto* ib = new QHBoxLayout;
  ib->addWidget(pickInit_);
  ib->addWidget(clearInit_);
  ib->addWidget(initSize_);
  ib->addStretch(1);
  ifl->addRow(QString(), ib);
  strength_ = new QSlider(Qt::Horizontal, initBox);
  strength_->setObjectName(QStringLiteral("strength"));
  strength_->setRange(1, 100);
  strength_->setValue(75);
  strength_->setToolTip(tr("Denoising strength: how much of the init image is repainted (0.01 keeps it, 1 repaints all)"));
  strengthValue_ = new QLabel(initBox);
  strengthValue_->setMinimumWidth(strengthValue_->fontMetrics().horizontalAdvance(QStringLiteral("0.00 ")));
  auto* sr = new QHBoxLayout;
  sr->addWidget(strength_, 1);
  sr->addWidget(strengthValue_);
  auto* strengthLabel = new QLabel(tr("St&rength"), initBox);
  strengthLabel->setBuddy(strength_);
  ifl->addRow(strengthLabel, sr);
  maskInfo_ = hintLabel(QString(), initBox);
  maskInfo_->setObjectName(QStringLiteral("maskInfo"));
  ifl->addRow(tr("Mask"), maskInfo_);
  v->addWidget(initFold_);
  v->addStretch(1);
  scroll->setWidget(panel);
  outerLayout->addWidget(scroll, 1);
  // Wide enough for the form without a horizontal scroll bar (it is off).
  outer->setMinimumWidth(std::max(330, panel->minimumSizeHint().width() + scroll->verticalScrollBar()->sizeHint().width() + 4));

  // The submitted job's warning (the engine's estimate: unusually long), in view beside Generate.
  notice_ = new QLabel(outer);
  notice_->setObjectName(QStringLiteral("paintNotice"));
  notice_->setWordWrap(true);
  notice_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  notice_->setStyleSheet(QStringLiteral("QLabel { color: #c77c00; }"));  // amber, readable on the dark and the light theme
  notice_->setContentsMargins(8, 4, 8, 0);
  notice_->hide();
  outerLayout->addWidget(notice_);

  // Generate / Stop, always in view.
  auto* buttons = new QHBoxLayout;
  buttons->setContentsMargins(8, 0, 8, 8);
  generate_ = new QPushButton(tr("Generate"), outer);
  generate_->setObjectName(QStringLiteral("generate"));
  generate_->setToolTip(tr("Paint with these parameters (Ctrl+Enter)"));
  generate_->setMinimumHeight(36);
  QFont bold = generate_->font();
  bold.setBold(true);
  generate_->setFont(bold);
  stop_ = new QPushButton(tr("Stop"), outer);
  stop_->setObjectName(QStringLiteral("stop"));
  stop_->setToolTip(tr("Cancel the queued or running job (Esc); the engine stops within one step"));
  stop_->setMinimumHeight(36);
  buttons->addWidget(generate_, 2);
  buttons->addWidget(stop_, 1);
  outerLayout->addLayout(buttons);

  connect(generate_, &QPushButton::clicked, this, &PaintTab::generate);
  connect(stop_, &QPushButton::clicked, this, &PaintTab::stop);
  connect(sizePreset_, &QComboBox::activated, this, [this](int i) {
    const QSize s = sizePreset_->itemData(i).toSize();
    if (s.isEmpty()) return;
    const QSignalBlocker bw(width_), bh(height_);
    width_->setValue(s.width());
    height_->setValue(s.height());
  });
  connect(width_, &QSpinBox::valueChanged, this, &PaintTab::syncPresetFromSize);
  connect(height_, &QSpinBox::valueChanged, this, &PaintTab::syncPresetFromSize);
  connect(swapSize_, &QToolButton::clicked, this, [this] {
    const int w = width_->value();
    {
      const QSignalBlocker bw(width_);
      width_->setValue(height_->value());
    }
    height_->setValue(w);
    syncPresetFromSize();
  });
  connect(pickInit_, &QPushButton::clicked, this, [this] {
    QStringList patterns;
    for (const QByteArray& f : QImageReader::supportedImageFormats()) patterns << QStringLiteral("*.") + QString::fromLatin1(f);
    const QString path = QFileDialog::getOpenFileName(this, tr("Init image"), QFileInfo(initPath_).path(),
                                                      tr("Images (%1)").arg(patterns.join(' ')));
    if (!path.isEmpty()) setInitImage(path);
  });
  connect(clearInit_, &QPushButton::clicked, this, [this] { setInitImage(QString()); });
  connect(initSize_, &QPushButton::clicked, this, [this] {
    QSize s = maskEditor_->image().size();
    if (s.isEmpty()) return;
    if (s.width() > 2048 || s.height() > 2048) s = s.scaled(2048, 2048, Qt::KeepAspectRatio);
    const QSignalBlocker bw(width_);
    width_->setValue(std::clamp((s.width() + 4) / 8 * 8, 8, 4096));
    height_->setValue(std::clamp((s.height() + 4) / 8 * 8, 8, 4096));
    syncPresetFromSize();
  });
  connect(strength_, &QSlider::valueChanged, this, &PaintTab::updateStrengthLabel);
  updateStrengthLabel();
  syncPresetFromSize();
  return outer;
}

QWidget* PaintTab::buildCanvasArea() {
  auto* area = new QWidget(this);
  area->setObjectName(QStringLiteral("paintCanvasArea"));
  auto* v = new QVBoxLayout(area);
  v->setContentsMargins(0, 8, 8, 8);
  v->setSpacing(6);
  pages_ = new QTabWidget(area);
  pages_->setObjectName(QStringLiteral("canvasPages"));
  pages_->setDocumentMode(true);

  auto* output = new QWidget(pages_);
  auto* ov = new QVBoxLayout(output);
  ov->setContentsMargins(0, 6, 0, 0);
  canvas_ = new PaintCanvas(output);
  canvas_->setObjectName(QStringLiteral("canvas"));
  canvas_->setToolTip(tr("The live preview at every step, then the result; drop an image here to use it for img2img"));
  canvas_->setPlaceholder(tr("Your picture appears here, step by step.\n\nWrite a prompt and press Generate "
                             "(Ctrl+Enter). Drop an image here to start from it (img2img)."));
  strip_ = new QListWidget(output);
  strip_->setObjectName(QStringLiteral("batchStrip"));
  strip_->setToolTip(tr("The images of this batch: click one to show it"));
  strip_->setViewMode(QListView::IconMode);
  strip_->setFlow(QListView::LeftToRight);
  strip_->setWrapping(false);
  strip_->setMovement(QListView::Static);
  strip_->setIconSize(QSize(72, 72));
  strip_->setGridSize(QSize(84, 96));
  strip_->setFixedHeight(112);
  strip_->setHorizontalScrollBarPolicy(Qt::ScrollBarAsNeeded);
  strip_->setVerticalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  strip_->hide();
  ov->addWidget(canvas_, 1);
  ov->addWidget(strip_);
  pages_->addTab(output, tr("Output"));

  auto* init = new QWidget(pages_);
  auto* iv = new QVBoxLayout(init);
  iv->setContentsMargins(0, 6, 0, 0);
  auto* tools = new QHBoxLayout;
  tools->setSpacing(6);
  auto* brushLabel = new QLabel(tr("Brush"), init);
  brushSize_ = new QSpinBox(init);
  brushSize_->setObjectName(QStringLiteral("brushSize"));
  brushSize_->setRange(1, 512);
  brushSize_->setValue(32);
  brushSize_->setSuffix(QStringLiteral(" px"));
  brushSize_->setToolTip(tr("Brush diameter in pixels of the init image"));
  brushLabel->setBuddy(brushSize_);
  erase_ = new QToolButton(init);
  erase_->setObjectName(QStringLiteral("maskErase"));
  erase_->setText(tr("Erase"));
  erase_->setCheckable(true);
  erase_->setToolTip(tr("Erase: the brush takes parts out of the mask (they are kept as they are)"));
  clearMask_ = new QToolButton(init);
  clearMask_->setObjectName(QStringLiteral("clearMask"));
  clearMask_->setText(tr("Clear mask"));
  clearMask_->setToolTip(tr("Remove the whole mask: img2img repaints the whole picture again"));
  tools->addWidget(brushLabel);
  tools->addWidget(brushSize_);
  tools->addWidget(erase_);
  tools->addWidget(clearMask_);
  tools->addStretch(1);
  QLabel* paintHint = hintLabel(tr("Paint over the parts to repaint (inpainting)"), init);
  paintHint->setWordWrap(false);
  tools->addWidget(paintHint);
  maskEditor_ = new MaskEditor(init);
  maskEditor_->setObjectName(QStringLiteral("maskEditor"));
  maskEditor_->setToolTip(tr("The init image: paint a mask over the parts to repaint; without a mask the whole picture "
                             "is repainted by the strength"));
  maskEditor_->setPlaceholder(tr("No init image.\n\nDrop a picture here or use Open\u2026 in the panel to start from it "
                                 "(img2img), then paint over what to repaint (inpainting)."));
  iv->addLayout(tools);
  iv->addWidget(maskEditor_, 1);
  pages_->addTab(init, tr("Init image and mask"));
  v->addWidget(pages_, 1);

  error_ = new QLabel(area);
  error_->setObjectName(QStringLiteral("paintError"));
  error_->setWordWrap(true);
  error_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  error_->setStyleSheet(QStringLiteral("QLabel { color: #ff6b6b; }"));
  error_->hide();
  v->addWidget(error_);
  progress_ = new QProgressBar(area);
  progress_->setObjectName(QStringLiteral("progress"));
  progress_->setTextVisible(true);
  progress_->setToolTip(tr("Progress of the job: step, speed (iterations per second) and time left"));
  progress_->setMinimumHeight(22);
  v->addWidget(progress_);

  connect(canvas_, &PaintCanvas::fileDropped, this, [this](const QString& p) { setInitImage(p); });
  connect(maskEditor_, &MaskEditor::fileDropped, this, [this](const QString& p) { setInitImage(p); });
  connect(maskEditor_, &MaskEditor::maskChanged, this, &PaintTab::updateInitControls);
  connect(brushSize_, &QSpinBox::valueChanged, maskEditor_, &MaskEditor::setBrushSize);
  connect(erase_, &QToolButton::toggled, maskEditor_, [this](bool on) { maskEditor_->setErasing(on); });
  connect(clearMask_, &QToolButton::clicked, maskEditor_, &MaskEditor::clearMask);
  connect(strip_, &QListWidget::currentRowChanged, this, [this](int row) {
    if (row < 0) return;
    shown_ = row;
    showStripImage(row);
  });
  updateInitControls();
  return area;
}

// ---------------------------------------------------------------- panel values

void PaintTab::syncPresetFromSize() {
  const QSize s(width_->value(), height_->value());
  int i = sizePreset_->findData(s);
  if (i < 0) i = sizePreset_->count() - 1;  // Custom
  const QSignalBlocker b(sizePreset_);
  sizePreset_->setCurrentIndex(i);
}

void PaintTab::updateStrengthLabel() { strengthValue_->setText(QString::number(strength_->value() / 100.0, 'f', 2)); }

void PaintTab::updateInitControls() {
  const bool has = !initPath_.isEmpty();
  if (has) initFold_->setOpen(true);
  clearInit_->setEnabled(has);
  initSize_->setEnabled(has);
  strength_->setEnabled(has);
  strengthValue_->setEnabled(has);
  brushSize_->setEnabled(has);
  erase_->setEnabled(has);
  clearMask_->setEnabled(has && maskEditor_->hasMask());
  if (!has) {
    initLabel_->setText(tr("none (text to image)"));
    maskInfo_->setText(tr("paint one over the init image to inpaint"));
    return;
  }
  const QImage& img = maskEditor_->image();
  initLabel_->setText(QStringLiteral("%1 (%2 \u00d7 %3)").arg(QFileInfo(initPath_).fileName()).arg(img.width()).arg(img.height()));
  initLabel_->setToolTip(initPath_);
  maskInfo_->setText(maskEditor_->hasMask()
                         ? tr("%1% of the picture is repainted (inpainting)").arg(maskEditor_->coverage() * 100, 0, 'f', 1)
                         : tr("none: the whole picture is repainted by the strength"));
}

ImageRequest PaintTab::request() const {
  ImageRequest r;
  r.model = model_->reference().toStdString();
  r.prompt = prompt_->toPlainText().toStdString();
  r.negative_prompt = negative_->toPlainText().toStdString();
  r.width = width_->value();
  r.height = height_->value();
  r.steps = steps_->value();
  r.cfg_scale = static_cast<float>(cfg_->value());
  r.sampler = sampler_->currentData().toString().toStdString();
  r.scheduler = scheduler_->currentData().toString().toStdString();
  r.seed = seed_->seed();
  r.rng = rng_->currentData().toString().toStdString();
  r.batch_count = batchCount_->value();
  r.batch_size = batchSize_->value();
  r.preview_decoder = previewDecoder_.toStdString();
  if (!initPath_.isEmpty()) {
    r.init_image = initPath_.toStdString();
    r.strength = static_cast<float>(strength_->value() / 100.0);
  }
  return r;
}

void PaintTab::setOutputFolder(const QString& folder) {
  if (!folder.isEmpty()) outputFolder_ = folder;
}

QString PaintTab::nextOutputPath(uint64_t seed) const {
  const QDateTime now = QDateTime::currentDateTime();
  QString name = fileNaming_;
  QString model = model_->reference().section('/', -1).section('.', 0, 0);
  model.replace(QRegularExpression(QStringLiteral("[^A-Za-z0-9._@-]")), QStringLiteral("_"));
  name.replace(QStringLiteral("{date}"), now.toString(QStringLiteral("yyyyMMdd")))
      .replace(QStringLiteral("{time}"), now.toString(QStringLiteral("hhmmss")))
      .replace(QStringLiteral("{seed}"), QString::number(seed))
      .replace(QStringLiteral("{model}"), model);
  name.replace('/', '_');
  const QString base = QDir(outputFolder_).filePath(name);
  const bool batch = batchCount_->value() * batchSize_->value() > 1;
  // The same second and seed twice (a locked seed): a suffix keeps the first.
  QString stem = base;
  for (int n = 2; QFile::exists(stem + (batch ? QStringLiteral("-1.png") : QStringLiteral(".png"))); ++n)
    stem = base + QStringLiteral("_") + QString::number(n);
  return stem + QStringLiteral(".png");
}

QString PaintTab::saveMask(QString* error) const {
  const QDir dir(QDir(bridge_->options().dataDir).filePath(QStringLiteral("temp")));
  if (!QDir().mkpath(dir.path())) {
    *error = tr("Cannot create %1 for the inpainting mask").arg(dir.path());
    return {};
  }
  const QString path =
      dir.filePath(QStringLiteral("mask-%1.png").arg(QDateTime::currentDateTime().toString(QStringLiteral("yyyyMMdd-hhmmss-zzz"))));
  if (!maskEditor_->mask().convertToFormat(QImage::Format_Grayscale8).save(path, "PNG")) {
    *error = tr("Cannot write the inpainting mask to %1").arg(path);
    return {};
  }
  return path;
}

bool PaintTab::setInitImage(const QString& path) {
  if (path.isEmpty()) {
    initPath_.clear();
    maskEditor_->setImage(QImage());
    updateInitControls();
    return true;
  }
  QImageReader reader(path);
  reader.setAutoTransform(true);
  const QImage img = reader.read();
  if (img.isNull()) {
    const QString why = tr("Cannot use %1 as the init image: %2").arg(QFileInfo(path).fileName(), reader.errorString());
    showError(why);
    emit statusMessage(why);
    return false;
  }
  initPath_ = QFileInfo(path).absoluteFilePath();
  maskEditor_->setImage(img);
  // A brush about 1/16 of the picture: a few strokes cover a face or an object.
  brushSize_->setValue(std::clamp(std::max(img.width(), img.height()) / 16, 4, 512));
  updateInitControls();
  pages_->setCurrentIndex(1);
  emit statusMessage(tr("img2img from %1 (%2 \u00d7 %3; resized to %4 \u00d7 %5)")
                         .arg(QFileInfo(path).fileName())
                         .arg(img.width())
                         .arg(img.height())
                         .arg(width_->value())
                         .arg(height_->value()));
  return true;
}

void PaintTab::reuseSeed(quint64 seed) {
  seed_->setSeed(seed);
  emit statusMessage(tr("Seed %1 (locked)").arg(seed));
}

// ---------------------------------------------------------------- parameters

namespace {

// The picker entry a PNG's model names: an exact reference first, then the
// A1111 short hash (the first 10 hex digits of the file's sha256) among the
// store's versions, then the name without version, then a file's stem.
int findModel(const QComboBox* picker, const QString& exact, const QString& name, const QString& hash) {
  auto find = [&](auto&& pred) {
    for (int i = 0; i < picker->count(); ++i)
      if (pred(picker->itemData(i).toString(), picker->itemData(i, Qt::ToolTipRole).toString())) return i;
    return -1;
  };
  int i = -1;
  if (!exact.isEmpty()) i = find([&](const QString& ref, const QString&) { return ref == exact; });
  if (i < 0 && !name.isEmpty()) i = find([&](const QString& ref, const QString&) { return ref == name; });
  if (i < 0 && hash.size() >= 8)
    i = find([&](const QString&, const QString& detail) {
      return detail.contains(QStringLiteral("sha256:") + hash.toLower());
    });
  const QString base = name.section('@', 0, 0);
  if (i < 0 && !base.isEmpty())
    i = find([&](const QString& ref, const QString&) { return ref.section('@', 0, 0) == base; });
  if (i < 0 && !name.isEmpty())
    i = find([&](const QString& ref, const QString&) {
      return QFileInfo(ref).completeBaseName() == name || QFileInfo(ref).fileName() == name;
    });
  return i;
}

}  // namespace

static QStringList applyInfotext(const Infotext& info, const QString& exactModel, QPlainTextEdit* prompt,
                                 QPlainTextEdit* negative, QSpinBox* steps, QComboBox* sampler, QComboBox* scheduler,
                                 QDoubleSpinBox* cfg, QSpinBox* width, QSpinBox* height, SeedBox* seed, QComboBox* rng,
                                 QSlider* strength, ModelPicker* model) {
  QStringList missed;
  prompt->setPlainText(info.prompt);
  negative->setPlainText(info.negativePrompt);
  if (!info.hasParameters) {
    missed << QObject::tr("no parameters line (Steps: ..., Sampler: ..., Seed: ...): only the prompt was restored");
    return missed;
  }
  if (info.steps) {
    if (*info.steps >= steps->minimum() && *info.steps <= steps->maximum()) steps->setValue(*info.steps);
    else missed << QObject::tr("Steps: %1 (out of range %2..%3)").arg(*info.steps).arg(steps->minimum()).arg(steps->maximum());
  }
  QString schedule;  // from the sampler's name ("DPM++ 2M Karras")
  // QuickDraw's one-pass decoder has no sampler: nothing to restore, nothing lost.
  if (!info.sampler.isEmpty() && info.sampler != QLatin1String("CVAE decoder")) {
    if (const auto s = mapSampler(info.sampler)) {
      sampler->setCurrentIndex(std::max(0, sampler->findData(s->sampler)));
      schedule = s->scheduler;
    } else {
      missed << QObject::tr("Sampler: %1 (Atelier has Euler a, Euler, Heun, DPM++ 2M, DDIM and LCM; kept %2)")
                    .arg(info.sampler, sampler->currentText());
      // Its schedule still applies to the sampler kept ("DPM++ SDE Karras").
      if (info.sampler.endsWith(QLatin1String(" Karras"), Qt::CaseInsensitive)) schedule = QStringLiteral("karras");
    }
  }
  if (!info.scheduleType.isEmpty()) {
    if (const auto s = mapScheduleType(info.scheduleType)) schedule = *s;
    else
      missed << QObject::tr("Schedule type: %1 (Atelier has Discrete and Karras; used %2)")
                    .arg(info.scheduleType, schedule == QLatin1String("karras") ? QObject::tr("Karras") : QObject::tr("Discrete"));
  }
  // No schedule named: A1111's automatic one, the discrete schedule for these samplers.
  scheduler->setCurrentIndex(std::max(0, scheduler->findData(schedule.isEmpty() ? QStringLiteral("discrete") : schedule)));
  if (info.cfgScale) {
    if (*info.cfgScale >= cfg->minimum() && *info.cfgScale <= cfg->maximum()) cfg->setValue(*info.cfgScale);
    else missed << QObject::tr("CFG scale: %1 (out of range)").arg(*info.cfgScale);
  }
  if (info.seed) seed->setSeed(*info.seed);
  if (info.width && info.height) {
    const int w = *info.width, h = *info.height;
    const int rw = std::clamp((w + 4) / 8 * 8, 8, 4096), rh = std::clamp((h + 4) / 8 * 8, 8, 4096);
    width->setValue(rw);
    height->setValue(rh);
    if (rw != w || rh != h) missed << QObject::tr("Size: %1x%2 (not multiples of 8 from 8 to 4096; used %3x%4)").arg(w).arg(h).arg(rw).arg(rh);
  }
  if (info.rng.isEmpty() || info.rng.compare(QLatin1String("GPU"), Qt::CaseInsensitive) == 0)
    rng->setCurrentIndex(rng->findData(QStringLiteral("cuda")));
  else if (info.rng.compare(QLatin1String("CPU"), Qt::CaseInsensitive) == 0)
    rng->setCurrentIndex(rng->findData(QStringLiteral("cpu")));
  else
    missed << QObject::tr("RNG: %1 (Atelier has GPU and CPU)").arg(info.rng);
  // Hires fix (a second, upscaled pass) is not in Atelier; its keys are listed
  // below, and a denoising strength beside them belongs to that pass.
  bool hires = false;
  for (const auto& [k, v] : info.extra) hires = hires || k.startsWith(QLatin1String("Hires "));
  if (info.denoisingStrength) {
    if (hires) missed << QObject::tr("Denoising strength: %1 (of the hires fix pass)").arg(*info.denoisingStrength);
    else strength->setValue(std::clamp(static_cast<int>(std::lround(*info.denoisingStrength * 100)), 1, 100));
  }
  if (!info.model.isEmpty() || !exactModel.isEmpty()) {
    const int i = findModel(model, exactModel, info.model, info.modelHash);
    if (i >= 0) {
      model->setCurrentIndex(i);
    } else if (!exactModel.isEmpty() && QFileInfo(exactModel).isFile()) {
      model->setReference(exactModel);  // a model file the pickers do not list yet
    } else {
      const QString what = info.model.isEmpty() ? exactModel : info.model;
      missed << (info.modelHash.isEmpty()
                     ? QObject::tr("Model: %1 (not installed; kept %2)").arg(what, model->currentText())
                     : QObject::tr("Model: %1, hash %2 (not installed; kept %3)").arg(what, info.modelHash, model->currentText()));
    }
  }
  for (const auto& [k, v] : info.extra) {
    if (k == QLatin1String("Version")) continue;  // which program wrote it: nothing to restore
    missed << QStringLiteral("%1: %2").arg(k, v);
  }
  return missed;
}

QStringList PaintTab::applyParameters(const QString& infotext) {
  const Infotext info = parseInfotext(infotext);
  if (!info.hasParameters && info.prompt.isEmpty()) return {tr("no generation parameters in the text")};
  return applyInfotext(info, QString(), prompt_, negative_, steps_, sampler_, scheduler_, cfg_, width_, height_, seed_, rng_,
                       strength_, model_);
}

QStringList PaintTab::restoreFromPng(const QString& path) {
  const QString name = QFileInfo(path).fileName();
  QString error;
  const QString params = readPngText(path, QStringLiteral("parameters"), &error);
  if (params.trimmed().isEmpty()) {
    const QString why = error.isEmpty() ? tr("%1 carries no generation parameters (no PNG \"parameters\" text)").arg(name)
                                        : tr("%1 cannot be read: %2").arg(name, error);
    emit statusMessage(why);
    return {why};
  }
  // Atelier's own PNGs also carry the request as JSON: its model reference is exact.
  QString exact;
  const QJsonDocument doc = QJsonDocument::fromJson(readPngText(path, QStringLiteral("atelier")).toUtf8());
  if (doc.isObject()) exact = doc.object().value(QStringLiteral("model")).toString();
  const QStringList missed = applyInfotext(parseInfotext(params), exact, prompt_, negative_, steps_, sampler_, scheduler_,
                                           cfg_, width_, height_, seed_, rng_, strength_, model_);
  emit statusMessage(missed.isEmpty() ? tr("Restored the parameters of %1").arg(name)
                                      : tr("Restored the parameters of %1; not restored: %2").arg(name, missed.join(QStringLiteral("; "))));
  return missed;
}

void PaintTab::saveSettings(QSettings& s) const {
  s.beginGroup(QStringLiteral("paint"));
  s.setValue(QStringLiteral("prompt"), prompt_->toPlainText());
  s.setValue(QStringLiteral("negative"), negative_->toPlainText());
  s.setValue(QStringLiteral("model"), model_->reference());
  s.setValue(QStringLiteral("sampler"), sampler_->currentData());
  s.setValue(QStringLiteral("scheduler"), scheduler_->currentData());
  s.setValue(QStringLiteral("steps"), steps_->value());
  s.setValue(QStringLiteral("cfg"), cfg_->value());
  s.setValue(QStringLiteral("width"), width_->value());
  s.setValue(QStringLiteral("height"), height_->value());
  s.setValue(QStringLiteral("seed"), QString::number(seed_->seed()));
  s.setValue(QStringLiteral("seedLocked"), seed_->locked());
  s.setValue(QStringLiteral("rng"), rng_->currentData());
  s.setValue(QStringLiteral("batchCount"), batchCount_->value());
  s.setValue(QStringLiteral("batchSize"), batchSize_->value());
  s.setValue(QStringLiteral("strength"), strength_->value());
  s.setValue(QStringLiteral("brushSize"), brushSize_->value());
  s.endGroup();
}

void PaintTab::loadSettings(QSettings& s) {
  s.beginGroup(QStringLiteral("paint"));
  auto combo = [&](QComboBox* c, const char* key) {
    const int i = c->findData(s.value(QLatin1String(key)));
    if (i >= 0) c->setCurrentIndex(i);
  };
  if (s.contains(QStringLiteral("prompt"))) prompt_->setPlainText(s.value(QStringLiteral("prompt")).toString());
  if (s.contains(QStringLiteral("negative"))) negative_->setPlainText(s.value(QStringLiteral("negative")).toString());
  if (const QString m = s.value(QStringLiteral("model")).toString(); !m.isEmpty()) model_->setPreferred(m);
  combo(sampler_, "sampler");
  combo(scheduler_, "scheduler");
  combo(rng_, "rng");
  steps_->setValue(s.value(QStringLiteral("steps"), steps_->value()).toInt());
  cfg_->setValue(s.value(QStringLiteral("cfg"), cfg_->value()).toDouble());
  width_->setValue(std::clamp((s.value(QStringLiteral("width"), width_->value()).toInt() + 4) / 8 * 8, 8, 4096));
  height_->setValue(std::clamp((s.value(QStringLiteral("height"), height_->value()).toInt() + 4) / 8 * 8, 8, 4096));
  if (s.contains(QStringLiteral("seed"))) {
    seed_->setSeed(s.value(QStringLiteral("seed")).toString().toULongLong());
    seed_->setLocked(s.value(QStringLiteral("seedLocked"), false).toBool());
  }
  batchCount_->setValue(s.value(QStringLiteral("batchCount"), 1).toInt());
  batchSize_->setValue(s.value(QStringLiteral("batchSize"), 1).toInt());
  strength_->setValue(s.value(QStringLiteral("strength"), strength_->value()).toInt());
  brushSize_->setValue(s.value(QStringLiteral("brushSize"), brushSize_->value()).toInt());
  s.endGroup();
  syncPresetFromSize();
}

// ---------------------------------------------------------------- jobs

void PaintTab::setPhase(Phase phase) {
  phase_ = phase;
  const bool idle = phase == Phase::Idle;
  generate_->setEnabled(idle);
  stop_->setEnabled(phase != Phase::Idle && phase != Phase::Stopping);
  if (stopKey_) stopKey_->setEnabled(phase != Phase::Idle);  // idle, Esc is left to whatever has focus
  switch (phase) {
    case Phase::Idle:
      notice_->hide();  // it was about the job that ended
      break;
    case Phase::Submitting:
      progress_->setRange(0, 1);
      progress_->setValue(0);
      progress_->setFormat(tr("submitting\u2026"));
      break;
    case Phase::Queued:
      progress_->setRange(0, 1);
      progress_->setValue(0);
      progress_->setFormat(bridge_->paused() ? tr("queued: the queue is paused (resume it in the Queue dock)")
                                             : tr("queued: waiting for the engine\u2026"));
      break;
    case Phase::Running:
      break;
    case Phase::Stopping:
      progress_->setFormat(tr("stopping\u2026"));
      break;
  }
  emit phaseChanged(phase);
}

void PaintTab::showError(const QString& message) {
  error_->setText(message);
  error_->setVisible(!message.isEmpty());
}

void PaintTab::generate() {
  if (phase_ != Phase::Idle) return;
  showError(QString());
  if (!bridge_->isOpen()) {
    showError(tr("The engine is not open yet: wait a moment and try again"));
    return;
  }
  ImageRequest r = request();
  if (r.model.empty()) {
    showError(tr("No image model is installed: import a Stable Diffusion checkpoint or QuickDraw in the Models dock, "
                 "or put one in a model folder"));
    return;
  }
  if (r.prompt.empty() && r.negative_prompt.empty()) {
    showError(tr("Write a prompt first: what should the picture show?"));
    prompt_->setFocus();
    return;
  }
  if (r.width % 8 || r.height % 8) {  // the fields round; a value set from code might not
    showError(tr("Width and height must be multiples of 8 (%1 \u00d7 %2)").arg(r.width).arg(r.height));
    return;
  }
  if (!r.init_image.empty() && maskEditor_->hasMask()) {
    QString why;
    r.mask = saveMask(&why).toStdString();
    if (r.mask.empty()) {
      showError(why);
      return;
    }
  }
  if (!QDir().mkpath(outputFolder_)) {
    showError(tr("Cannot create the output folder %1: choose another one in the settings").arg(outputFolder_));
    return;
  }
  r.seed = seed_->takeSeed();
  r.output = nextOutputPath(r.seed).toStdString();
  r.interactive = true;
  running_ = r;
  job_ = 0;
  stopWanted_ = false;
  early_.clear();
  shown_ = -1;
  ++loadGeneration_;
  images_ = QVector<QImage>(r.batch_count * r.batch_size);
  {
    const QSignalBlocker b(strip_);
    strip_->clear();
    for (int i = 0; i < images_.size(); ++i) {
      auto* item = new QListWidgetItem(QString::number(i + 1), strip_);
      item->setToolTip(tr("Image %1, seed %2").arg(i + 1).arg(r.seed + static_cast<uint64_t>(i)));
    }
  }
  strip_->setVisible(images_.size() > 1);
  pages_->setCurrentIndex(0);
  setPhase(Phase::Submitting);
  notice_->clear();
  notice_->hide();
  QPointer<PaintTab> self(this);
  // Asked before the submission (the bridge's worker runs calls in order, and
  // submit reuses the estimate): an unusually long job is said as it queues.
  const quint64 submission = ++submission_;
  bridge_->run<std::string>(
      [r](Engine* e) -> std::string {
        if (!e) return {};
        auto est = e->estimate(r);
        return est.ok() ? est->warning : std::string();
      },
      [self, submission](std::string warning) {
        if (!self || self->submission_ != submission || self->phase_ == Phase::Idle || warning.empty()) return;
        warning[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(warning[0])));
        self->notice_->setText(QString::fromStdString(warning));
        self->notice_->show();
        emit self->statusMessage(tr("Paint: %1").arg(self->notice_->text()));
      });
  bridge_->submitImage(r, [self](Result<JobId> result) {
    if (self) self->submitted(std::move(result));
  });
}

void PaintTab::submitted(Result<JobId> result) {
  if (!result.ok()) {
    setPhase(Phase::Idle);
    progress_->setFormat(tr("not started"));
    const QString why = QString::fromStdString(result.status().message);
    showError(why);
    emit statusMessage(tr("Paint: %1").arg(why));
    return;
  }
  job_ = result.value();
  if (!stopWanted_) setPhase(Phase::Queued);
  const QVector<Event> early = std::exchange(early_, {});
  for (const Event& ev : early)
    if (ev.job == job_) onEvent(ev);
  if (stopWanted_ && job_ != 0) {
    stopWanted_ = false;
    phase_ = Phase::Queued;  // let stop() send the cancel now that there is an id
    stop();
  }
}

void PaintTab::stop() {
  switch (phase_) {
    case Phase::Idle:
    case Phase::Stopping:
      return;
    case Phase::Submitting:
      stopWanted_ = true;  // cancelled as soon as the engine names the job
      setPhase(Phase::Stopping);
      return;
    case Phase::Queued:
    case Phase::Running:
      break;
  }
  setPhase(Phase::Stopping);
  emit statusMessage(tr("Stopping\u2026"));
  const JobId id = job_;
  QPointer<PaintTab> self(this);
  bridge_->cancel(id, [self, id](Status s) {
    if (!self || s.ok() || self->job_ != id) return;
    // Finished meanwhile: its Completed/Failed event is on its way. Anything
    // else is worth saying; the job list poll settles the state either way.
    emit self->statusMessage(tr("Stop: %1").arg(QString::fromStdString(s.message)));
  });
}

void PaintTab::onEvent(const Event& ev) {
  if (phase_ == Phase::Idle) return;
  if (job_ == 0) {
    // Submitting: the id is not known yet; keep what may be ours.
    if (ev.type != EventType::Token && ev.type != EventType::Segment && early_.size() < 512) early_.push_back(ev);
    return;
  }
  if (ev.job != job_) return;
  switch (ev.type) {
    case EventType::Queued:
      break;
    case EventType::Started:
      if (phase_ == Phase::Queued) {
        setPhase(Phase::Running);
        progress_->setRange(0, std::max(1, running_.steps * running_.batch_count));
        progress_->setValue(0);
        progress_->setFormat(tr("loading the model and encoding the prompt\u2026"));
      }
      break;
    case EventType::Preview:
      if (phase_ == Phase::Queued) setPhase(Phase::Running);
      showPreview(ev.image);
      break;
    case EventType::Progress:
      if (phase_ == Phase::Queued) setPhase(Phase::Running);
      break;  // the Preview events before it carry the same steps, with the time
    case EventType::Completed:
    case EventType::Failed:
    case EventType::Cancelled:
      finished(nullptr, &ev);
      break;
    default:
      break;
  }
}

void PaintTab::onJobsChanged(const QVector<JobInfo>& changed) {
  if (job_ == 0 || phase_ == Phase::Idle) return;
  // A client of another process's queue hears of its job through the list only.
  for (const JobInfo& j : changed) {
    if (j.id != job_) continue;
    if (isTerminal(j.state)) finished(&j, nullptr);
    else if (j.state == JobState::Running && phase_ == Phase::Queued) setPhase(Phase::Running);
  }
}

void PaintTab::showPreview(const ImageProgress& p) {
  const int perRound = std::max(1, running_.batch_size);
  const int round = p.image / perRound;
  updateProgress(round * p.steps + p.step, std::max(1, running_.batch_count) * p.steps, p.seconds, p.steps);
  if (phase_ == Phase::Stopping) progress_->setFormat(tr("stopping\u2026"));
  if (previewEvery_ > 1 && p.step % previewEvery_ != 0 && p.step != p.steps) return;
  const QImage img = previewImage(p);
  if (img.isNull()) return;
  if (p.image >= 0 && p.image < images_.size()) {
    images_[p.image] = img;
    if (QListWidgetItem* item = strip_->item(p.image)) item->setIcon(QPixmap::fromImage(img.scaled(strip_->iconSize(), Qt::KeepAspectRatio, Qt::SmoothTransformation)));
  }
  // Follow the live image (the round's first) unless one was picked in the strip.
  const int live = round * perRound;
  if ((shown_ < 0 && p.image == live) || shown_ == p.image) canvas_->setImage(img);
}

void PaintTab::updateProgress(int done, int total, double seconds, int stepsPerRound) {
  progress_->setRange(0, std::max(1, total));
  progress_->setValue(std::clamp(done, 0, std::max(1, total)));
  const double rate = seconds > 0 ? done / seconds : 0;
  const QString eta = rate > 0 ? formatSeconds((total - done) / rate) : QStringLiteral("?");
  const int images = running_.batch_count * running_.batch_size;
  QString text;
  if (running_.batch_count > 1) {
    const int per = std::max(1, stepsPerRound);
    const int round = std::clamp((done + per - 1) / per, 1, running_.batch_count);
    text = tr("round %1/%2 \u00b7 step %3/%4").arg(round).arg(running_.batch_count).arg(done - (round - 1) * per).arg(per);
  } else {
    text = tr("step %1/%2").arg(done).arg(total);
  }
  if (images > 1) text += tr(" \u00b7 %1 images").arg(images);
  text += QStringLiteral(" \u00b7 %1 it/s \u00b7 ETA %2").arg(rate, 0, 'f', rate < 10 ? 2 : 1).arg(eta);
  progress_->setFormat(text);
}

void PaintTab::finished(const JobInfo* info, const Event* ev) {
  const JobState state = ev ? (ev->type == EventType::Completed ? JobState::Completed
                               : ev->type == EventType::Failed  ? JobState::Failed
                                                                : JobState::Cancelled)
                            : info->state;
  QStringList files;
  for (const std::string& f : ev ? ev->files : info->files) files << QString::fromStdString(f);
  const QString message = QString::fromStdString(ev ? ev->message : info->error);
  const double totalMs = ev ? ev->stats.total_ms : static_cast<double>(info->finished_ms - info->created_ms);
  job_ = 0;
  stopWanted_ = false;
  setPhase(Phase::Idle);
  switch (state) {
    case JobState::Completed: {
      lastFiles_ = files;
      progress_->setRange(0, 1);
      progress_->setValue(1);
      progress_->setFormat((files.size() == 1 ? tr("done: 1 image in %1") : tr("done: %1 images in %2").arg(files.size()))
                               .arg(formatSeconds(totalMs / 1000.0)));
      showResults(files);
      emit imagesSaved(files);
      emit statusMessage((files.size() == 1 ? tr("Saved 1 image to %1") : tr("Saved %1 images to %2").arg(files.size()))
                             .arg(QDir::toNativeSeparators(outputFolder_)));
      break;
    }
    case JobState::Cancelled:
      progress_->setFormat(tr("stopped"));
      emit statusMessage(tr("Stopped"));
      break;
    default: {
      progress_->setRange(0, 1);
      progress_->setValue(0);
      progress_->setFormat(tr("failed"));
      const QString why = message.isEmpty() ? tr("the job failed") : message;
      showError(why);
      emit statusMessage(tr("Paint failed: %1").arg(why));
      break;
    }
  }
}

void PaintTab::showResults(const QStringList& files) {
  // Decoded off the UI thread; a newer job's results win over a stale load.
  const quint64 generation = ++loadGeneration_;
  QFuture<QVector<QImage>> load = QtConcurrent::run([files] {
    QVector<QImage> out;
    for (const QString& f : files) out.push_back(QImage(f));
    return out;
  });
  load.then(this, [this, generation, files](QVector<QImage> images) {
    if (generation != loadGeneration_) return;
    images_ = images;
    {
      const QSignalBlocker b(strip_);
      strip_->clear();
      for (int i = 0; i < images_.size(); ++i) {
        auto* item = new QListWidgetItem(QString::number(i + 1), strip_);
        item->setToolTip(files.value(i));
        if (!images_[i].isNull())
          item->setIcon(QPixmap::fromImage(images_[i].scaled(strip_->iconSize(), Qt::KeepAspectRatio, Qt::SmoothTransformation)));
      }
      const int pick = shown_ >= 0 && shown_ < images_.size() ? shown_ : 0;
      strip_->setCurrentRow(pick);
    }
    strip_->setVisible(images_.size() > 1);
    showStripImage(shown_ >= 0 && shown_ < images_.size() ? shown_ : 0);
  });
}

void PaintTab::showStripImage(int index) {
  if (index >= 0 && index < images_.size() && !images_[index].isNull()) canvas_->setImage(images_[index]);
}

// ---------------------------------------------------------------- keys and drops

bool PaintTab::eventFilter(QObject* watched, QEvent* event) {
  if ((watched == prompt_ || watched == negative_) && event->type() == QEvent::KeyPress) {
    auto* key = static_cast<QKeyEvent*>(event);
    if ((key->key() == Qt::Key_Return || key->key() == Qt::Key_Enter) && (key->modifiers() & Qt::ControlModifier)) {
      generate();
      return true;
    }
    if (key->key() == Qt::Key_Escape && phase_ != Phase::Idle) {
      stop();
      return true;
    }
  }
  return QWidget::eventFilter(watched, event);
}

void PaintTab::dragEnterEvent(QDragEnterEvent* event) {
  if (!droppedImagePath(event->mimeData()).isEmpty()) event->acceptProposedAction();
}

// A picture dropped on the panel: a PNG with parameters restores them;
// anything else becomes the init image (as a drop on the canvas does).
void PaintTab::dropEvent(QDropEvent* event) {
  const QString path = droppedImagePath(event->mimeData());
  if (path.isEmpty()) return;
  event->acceptProposedAction();
  if (!readPngText(path, QStringLiteral("parameters")).trimmed().isEmpty()) {
    const QStringList missed = restoreFromPng(path);
    showError(missed.isEmpty() ? QString() : tr("Not restored: %1").arg(missed.join(QStringLiteral("; "))));
  } else {
    setInitImage(path);
  }
}

}  // namespace atelier::ui
