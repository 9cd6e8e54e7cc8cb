// A combo box over the models the bridge knows (store versions first, then
// loose files), filtered by kind; the current reference is what a request names.
#pragma once

#include <QComboBox>

#include "bridge/engine_bridge.h"

namespace atelier::ui {

class ModelPicker : public QComboBox {
  Q_OBJECT

 public:
  // KIND: "text" or "image". Follows BRIDGE's modelsScanned.
  ModelPicker(bridge::EngineBridge* bridge, QString kind, QWidget* parent = nullptr);
  QString reference() const;                 // "" when nothing is installed
  void setReference(const QString& reference);  // selects it, adding it when unknown (e.g. from a PNG)
  // Prefer this reference once the list arrives (restored settings).
  void setPreferred(const QString& reference) { preferred_ = reference; setReference(reference); }

 signals:
  void referenceChanged(const QString& reference);

 private:
  void fill(const QVector<bridge::ModelChoice>& models);
  QString kind_;
  QString preferred_;
};

}  // namespace atelier::ui
