// File > Settings: the engine (threads, max batch, batching window, KV and
// model memory budgets, KV precision, store location), Paint's previews and
// file naming, the output folder, the theme, and an "API server" section
// shown only when the program has an API server. Engine changes say that
// they need a restart; "Apply and restart the engine" asks for it.
#pragma once

#include <QDialog>

#include "settings/studio_settings.h"

class QCheckBox;
class QComboBox;
class QGroupBox;
class QLabel;
class QLineEdit;
class QPushButton;
class QSpinBox;

namespace atelier::ui {

class SettingsDialog : public QDialog {
  Q_OBJECT

 public:
  SettingsDialog(const StudioSettings& current, bool apiServerAvailable, QWidget* parent = nullptr);
  StudioSettings settings() const;     // what the fields say now
  bool restartRequested() const { return restart_; }
  bool restartNeeded() const { return current_.needsRestart(settings()); }

 private:
  void updateRestartNote();
  QLineEdit* fileField(const QString& name, const QString& value, const QString& tip, bool folder, QWidget** row);

  StudioSettings current_;
  bool restart_ = false;
  QSpinBox *threads_, *maxBatch_, *maxWait_, *kvMiB_, *modelMiB_, *previewEvery_;
  QComboBox *kvType_, *device_, *theme_;
  QLineEdit *store_, *output_, *decoder_, *naming_, *apiAddress_, *apiKey_;
  QCheckBox* apiEnabled_;
  QGroupBox* api_;
  QLabel* restartNote_;
  QPushButton* restartButton_;
};

}  // namespace atelier::ui
