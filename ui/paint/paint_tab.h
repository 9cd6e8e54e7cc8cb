// The Paint workspace: a scrollable parameters panel on the left (prompt,
// negative prompt, model, sampler, schedule, steps, CFG, size, seed, batch,
// img2img strength) and the canvas on the right (live preview at every step,
// the results, a strip of the batch's images; the init image and its
// inpainting mask on a second page). Jobs go through the EngineBridge: the
// UI thread never waits on the engine.
#pragma once

#include <atelier/engine.h>

#include <QImage>
#include <QStringList>
#include <QVector>
#include <QWidget>

#include <algorithm>

#include <optional>

class QComboBox;
class QShortcut;
class QDoubleSpinBox;
class QLabel;
class QListWidget;
class QPlainTextEdit;
class QProgressBar;
class QPushButton;
class QSettings;
class QSlider;
class QSpinBox;
class QTabWidget;
class QToolButton;

namespace atelier::bridge {
class EngineBridge;
}

namespace atelier::ui {

class FoldSection;

class MaskEditor;
class ModelPicker;
class PaintCanvas;
class SeedBox;

class PaintTab : public QWidget {
  Q_OBJECT

 public:
  // Where a job stands: Submitting until the engine gave it an id; Queued
  // until it starts; Stopping from Stop until the engine confirms.
  enum class Phase { Idle, Submitting, Queued, Running, Stopping };
  Q_ENUM(Phase)

  explicit PaintTab(bridge::EngineBridge* bridge, QWidget* parent = nullptr);
  ~PaintTab() override;

  // Results go to FOLDER/atelier-<yyyyMMdd-hhmmss>-<seed>.png (a batch: -1 ... -N).
  // Default: <data dir>/images.
  void setOutputFolder(const QString& folder);
  QString outputFolder() const { return outputFolder_; }

  // Fills the panel from A1111 "parameters" text; returns what could not be
  // restored (an unknown sampler, a model not installed, keys such as hires fix).
  QStringList applyParameters(const QString& infotext);
  // Reads the PNG's "parameters" text (Atelier, A1111, Forge) and applies it.
  QStringList restoreFromPng(const QString& path);
  // img2img: the starting picture ("" removes it). False (and a status message) when it cannot be read.
  bool setInitImage(const QString& path);
  QString initImage() const { return initPath_; }
  void reuseSeed(quint64 seed);  // shows and locks it
  // A TAESD decoder file for the step previews ("" = the linear latent-to-RGB preview).
  void setPreviewDecoder(const QString& path) { previewDecoder_ = path; }
  // The canvas shows every Nth denoising step (and the last); the progress bar every step.
  void setPreviewEvery(int steps) { previewEvery_ = std::max(1, steps); }
  int previewEvery() const { return previewEvery_; }
  // File names: {date} {time} {seed} {model}, then ".png".
  void setFileNaming(const QString& pattern) { fileNaming_ = pattern; }
  QString previewDecoder() const { return previewDecoder_; }

  // The panel's values under "paint/" (prompt, model, sampler, size, seed, ...).
  void saveSettings(QSettings& settings) const;
  void loadSettings(QSettings& settings);

  // The request the panel describes now (seed as shown, output not set).
  atelier::ImageRequest request() const;
  Phase phase() const { return phase_; }
  atelier::JobId jobId() const { return job_; }
  // The images of the last finished job (PNG paths).
  QStringList lastFiles() const { return lastFiles_; }

 public slots:
  void generate();  // Ctrl+Enter
  void stop();      // Esc: cancels the queued or running job

 signals:
  void imagesSaved(const QStringList& paths);  // a job completed and wrote these PNGs
  void statusMessage(const QString& message);
  void phaseChanged(atelier::ui::PaintTab::Phase phase);

 protected:
  bool eventFilter(QObject* watched, QEvent* event) override;
  void dragEnterEvent(QDragEnterEvent* event) override;
  void dropEvent(QDropEvent* event) override;

 private:
  QWidget* buildPanel();
  QWidget* buildCanvasArea();
  void setPhase(Phase phase);
  void onEvent(const atelier::Event& event);
  void onJobsChanged(const QVector<atelier::JobInfo>& changed);
  void submitted(atelier::Result<atelier::JobId> result);
  void showPreview(const atelier::ImageProgress& progress);
  void updateProgress(int done, int total, double seconds, int stepsPerRound);
  void finished(const atelier::JobInfo* info, const atelier::Event* event);
  void showResults(const QStringList& files);
  void showStripImage(int index);
  void showError(const QString& message);
  void syncPresetFromSize();
  void updateInitControls();
  void updateStrengthLabel();
  QString nextOutputPath(uint64_t seed) const;
  QString saveMask(QString* error) const;

  bridge::EngineBridge* bridge_;
  QString outputFolder_;
  QString previewDecoder_;
  int previewEvery_ = 1;
  QString fileNaming_ = QStringLiteral("atelier-{date}-{time}-{seed}");
  // panel
  ModelPicker* model_;
  QPlainTextEdit* prompt_;
  QPlainTextEdit* negative_;
  QShortcut* stopKey_ = nullptr;  // Esc, window-wide while a generation runs
  QComboBox* quickdrawClass_;  // the QuickDraw model's classes (hidden for other models)
  QWidget* quickdrawRow_ = nullptr;
  void applyModelKind(const QString& reference, const QStringList& classes);
  QComboBox* sampler_;
  QComboBox* scheduler_;
  QSpinBox* steps_;
  QDoubleSpinBox* cfg_;
  QComboBox* sizePreset_;
  QSpinBox* width_;
  QSpinBox* height_;
  QToolButton* swapSize_;
  SeedBox* seed_;
  QComboBox* rng_;
  QSpinBox* batchCount_;
  QSpinBox* batchSize_;
  QLabel* initLabel_;
  QPushButton* pickInit_;
  QPushButton* clearInit_;
  QPushButton* initSize_;
  QSlider* strength_;
  QLabel* strengthValue_;
  QLabel* maskInfo_;
  FoldSection* moreFold_;  // batch and noise
  FoldSection* initFold_;  // img2img and inpainting
  QLabel* notice_;   // above Generate: the engine's warning about the submitted job (unusually long)
  QPushButton* generate_;
  QPushButton* stop_;
  // canvas
  QTabWidget* pages_;
  PaintCanvas* canvas_;
  QListWidget* strip_;
  MaskEditor* maskEditor_;
  QSpinBox* brushSize_;
  QToolButton* erase_;
  QToolButton* clearMask_;
  QLabel* error_;
  QProgressBar* progress_;
  // the job
  Phase phase_ = Phase::Idle;
  atelier::JobId job_ = 0;
  atelier::ImageRequest running_;   // what was submitted
  bool stopWanted_ = false;         // Stop pressed before the engine gave an id
  QVector<atelier::Event> early_;   // events that came before the id did
  QVector<QImage> images_;          // per image of the job: its latest preview, then the result
  int shown_ = -1;                  // the strip entry the user picked (-1: follow the live image)
  QString initPath_;
  QStringList lastFiles_;
  quint64 loadGeneration_ = 0;      // drops a stale result load
  quint64 submission_ = 0;          // drops a stale estimate answer
};

}  // namespace atelier::ui
