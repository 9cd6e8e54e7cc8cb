#include "settings/settings_dialog.h"

#include <atelier/engine.h>

#include <algorithm>
#include <QCheckBox>
#include <QComboBox>
#include <QDialogButtonBox>
#include <QFileDialog>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSpinBox>
#include <QVBoxLayout>

namespace atelier::ui {

namespace {
QSpinBox* spin(const QString& name, int lo, int hi, int value, const QString& suffix, const QString& tip, QWidget* parent) {
  auto* s = new QSpinBox(parent);
  s->setObjectName(name);
  s->setRange(lo, hi);
  s->setValue(value);
  s->setSuffix(suffix);
  s->setToolTip(tip);
  return s;
}
}  // namespace

QLineEdit* SettingsDialog::fileField(const QString& name, const QString& value, const QString& tip, bool folder, QWidget** row) {
  auto* w = new QWidget(this);
  auto* h = new QHBoxLayout(w);
  h->setContentsMargins(0, 0, 0, 0);
  auto* edit = new QLineEdit(value, w);
  edit->setObjectName(name);
  edit->setToolTip(tip);
  auto* browse = new QPushButton(tr("Browse..."), w);
  browse->setObjectName(name + QStringLiteral("Browse"));
  browse->setAccessibleName(tr("Browse for %1").arg(tip));
  h->addWidget(edit, 1);
  h->addWidget(browse);
  connect(browse, &QPushButton::clicked, this, [this, edit, folder, tip] {
    const QString p = folder ? QFileDialog::getExistingDirectory(this, tip, edit->text())
                             : QFileDialog::getOpenFileName(this, tip, edit->text(), tr("safetensors (*.safetensors);;All files (*)"));
    if (!p.isEmpty()) edit->setText(p);
  });
  *row = w;
  return edit;
}

SettingsDialog::SettingsDialog(const StudioSettings& c, bool apiServerAvailable, QWidget* parent)
    : QDialog(parent), current_(c) {
  setObjectName(QStringLiteral("settingsDialog"));
  setWindowTitle(tr("Settings"));
  auto* layout = new QVBoxLayout(this);

  auto* engine = new QGroupBox(tr("Engine (a change needs an engine restart)"), this);
  auto* ef = new QFormLayout(engine);
  threads_ = spin(QStringLiteral("threadsSpin"), 0, 256, c.threads, QString(), tr("Compute threads; 0 = one per core"), engine);
  threads_->setSpecialValueText(tr("one per core"));
  maxBatch_ = spin(QStringLiteral("maxBatchSpin"), 1, 256, c.maxBatch, QString(), tr("Sequences decoded together per step"), engine);
  maxWait_ = spin(QStringLiteral("maxWaitSpin"), 0, 5000, c.maxWaitMs, tr(" ms"), tr("How long a batch waits for more jobs when the engine was idle"), engine);
  kvMiB_ = spin(QStringLiteral("kvMemorySpin"), 16, 1 << 20, c.kvMemoryMiB, tr(" MiB"), tr("KV cache budget per loaded text model"), engine);
  modelMiB_ = spin(QStringLiteral("modelMemorySpin"), 64, 1 << 22, c.modelMemoryMiB, tr(" MiB"), tr("Loaded models stay loaded until their bytes pass this"), engine);
  kvType_ = new QComboBox(engine);
  kvType_->setObjectName(QStringLiteral("kvTypeBox"));
  kvType_->addItem(tr("F16 (half the memory)"), QStringLiteral("f16"));
  kvType_->addItem(tr("F32 (exact)"), QStringLiteral("f32"));
  kvType_->addItem(tr("Q8_0 (a quarter of the memory)"), QStringLiteral("q8_0"));
  kvType_->addItem(tr("BF16 (half the memory; GPU only)"), QStringLiteral("bf16"));
  kvType_->addItem(tr("FP8 (a quarter of the memory; GPU only)"), QStringLiteral("fp8"));
  kvType_->setCurrentIndex(std::max(0, kvType_->findData(c.kvType)));
  kvType_->setToolTip(tr("The precision the KV cache is kept in"));
  // Where models run: auto, the CPU, and the CUDA devices this machine has.
  device_ = new QComboBox(engine);
  device_->setObjectName(QStringLiteral("deviceBox"));
  device_->addItem(tr("Automatic (a GPU when one is found and the model fits, else the CPU)"), QStringLiteral("auto"));
  std::string why;
  for (const std::string& name : available_devices(&why))
    device_->addItem(name == "cpu" ? tr("CPU") : QString::fromStdString(name), QString::fromStdString(name));
  if (device_->findData(c.device) < 0) device_->addItem(tr("%1 (not found now)").arg(c.device), c.device);  // kept, not lost
  device_->setCurrentIndex(std::max(0, device_->findData(c.device)));
  device_->setToolTip(why.empty() ? tr("Where text models run (images run on the CPU so far)")
                                  : tr("No GPU listed: %1").arg(QString::fromStdString(why)));
  QWidget* storeRow = nullptr;
  store_ = fileField(QStringLiteral("storeEdit"), c.storeDir, tr("The model store folder (empty: the data folder)"), true, &storeRow);
  ef->addRow(tr("&Threads"), threads_);
  ef->addRow(tr("Max &batch"), maxBatch_);
  ef->addRow(tr("Batching &window"), maxWait_);
  ef->addRow(tr("&KV budget"), kvMiB_);
  ef->addRow(tr("&Model memory"), modelMiB_);
  ef->addRow(tr("KV &precision"), kvType_);
  ef->addRow(tr("&Device"), device_);
  ef->addRow(tr("&Store location"), storeRow);
  layout->addWidget(engine);

  auto* paint = new QGroupBox(tr("Paint and outputs"), this);
  auto* pf = new QFormLayout(paint);
  previewEvery_ = spin(QStringLiteral("previewEverySpin"), 1, 1000, c.previewEverySteps, tr(" steps"), tr("Show a preview every N denoising steps"), paint);
  QWidget* decoderRow = nullptr;
  decoder_ = fileField(QStringLiteral("previewDecoderEdit"), c.previewDecoder, tr("A TAESD decoder (empty: the fast latent projection)"), false, &decoderRow);
  QWidget* outputRow = nullptr;
  output_ = fileField(QStringLiteral("outputEdit"), c.outputFolder, tr("Where Paint saves its PNGs (with their parameters inside)"), true, &outputRow);
  naming_ = new QLineEdit(c.fileNaming, paint);
  naming_->setObjectName(QStringLiteral("namingEdit"));
  naming_->setToolTip(tr("File names: {date} {time} {seed} {model}; .png is added"));
  theme_ = new QComboBox(paint);
  theme_->setObjectName(QStringLiteral("themeBox"));
  theme_->addItem(tr("Dark"), QStringLiteral("dark"));
  theme_->addItem(tr("Light"), QStringLiteral("light"));
  theme_->setCurrentIndex(c.theme == QLatin1String("light") ? 1 : 0);
  pf->addRow(tr("Preview &every"), previewEvery_);
  pf->addRow(tr("Preview &decoder"), decoderRow);
  pf->addRow(tr("&Output folder"), outputRow);
  pf->addRow(tr("File &naming"), naming_);
  pf->addRow(tr("T&heme"), theme_);
  layout->addWidget(paint);

  api_ = new QGroupBox(tr("API server"), this);
  api_->setObjectName(QStringLiteral("apiGroup"));
  auto* af = new QFormLayout(api_);
  apiEnabled_ = new QCheckBox(tr("Serve the OpenAI-compatible API while the studio runs"), api_);
  apiEnabled_->setObjectName(QStringLiteral("apiEnabled"));
  apiEnabled_->setChecked(c.apiEnabled);
  apiAddress_ = new QLineEdit(c.apiAddress, api_);
  apiAddress_->setObjectName(QStringLiteral("apiAddress"));
  apiKey_ = new QLineEdit(c.apiKey, api_);
  apiKey_->setObjectName(QStringLiteral("apiKey"));
  apiKey_->setEchoMode(QLineEdit::Password);
  af->addRow(apiEnabled_);
  af->addRow(tr("Address"), apiAddress_);
  af->addRow(tr("Key"), apiKey_);
  layout->addWidget(api_);
  api_->setVisible(apiServerAvailable);

  restartNote_ = new QLabel(tr("The engine settings changed: they take effect when the engine is opened again."), this);
  restartNote_->setObjectName(QStringLiteral("restartNote"));
  restartNote_->setWordWrap(true);
  layout->addWidget(restartNote_);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, this);
  restartButton_ = buttons->addButton(tr("Apply and &restart the engine"), QDialogButtonBox::ActionRole);
  restartButton_->setObjectName(QStringLiteral("restartButton"));
  layout->addWidget(buttons);
  connect(buttons, &QDialogButtonBox::accepted, this, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  connect(restartButton_, &QPushButton::clicked, this, [this] {
    restart_ = true;
    accept();
  });
  for (QSpinBox* s : {threads_, maxBatch_, maxWait_, kvMiB_, modelMiB_})
    connect(s, &QSpinBox::valueChanged, this, &SettingsDialog::updateRestartNote);
  connect(kvType_, &QComboBox::currentIndexChanged, this, &SettingsDialog::updateRestartNote);
  connect(device_, &QComboBox::currentIndexChanged, this, &SettingsDialog::updateRestartNote);
  connect(store_, &QLineEdit::textChanged, this, &SettingsDialog::updateRestartNote);
  updateRestartNote();
}

void SettingsDialog::updateRestartNote() {
  const bool need = restartNeeded();
  restartNote_->setVisible(need);
  restartButton_->setVisible(need);
}

StudioSettings SettingsDialog::settings() const {
  StudioSettings s = current_;
  s.threads = threads_->value();
  s.maxBatch = maxBatch_->value();
  s.maxWaitMs = maxWait_->value();
  s.kvMemoryMiB = kvMiB_->value();
  s.modelMemoryMiB = modelMiB_->value();
  s.kvType = kvType_->currentData().toString();
  s.device = device_->currentData().toString();
  s.storeDir = store_->text().trimmed();
  s.previewEverySteps = previewEvery_->value();
  s.previewDecoder = decoder_->text().trimmed();
  s.outputFolder = output_->text().trimmed();
  s.fileNaming = naming_->text().trimmed().isEmpty() ? StudioSettings().fileNaming : naming_->text().trimmed();
  s.theme = theme_->currentData().toString();
  s.apiEnabled = apiEnabled_->isChecked();
  s.apiAddress = apiAddress_->text().trimmed();
  s.apiKey = apiKey_->text();
  return s;
}

}  // namespace atelier::ui
